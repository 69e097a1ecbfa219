"""Read a toolkit's versions: from files first, ``nvcc --version`` as a fallback
(bounded, remembered per binary), and assemble a :class:`Toolkit`."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time

from packaging.version import InvalidVersion, Version

from ..cache import cache_root
from .model import Toolkit
from .trust import is_trusted

__all__ = ["NVCC_TIMEOUT_S", "FAILURE_MEMORY_S", "inspect", "read_text", "major_minor"]


#: Seconds to wait for ``nvcc --version`` (the fallback when no file gives the
#: version).  A healthy nvcc answers in ~5 ms; 10 s covers a cold network FS.
NVCC_TIMEOUT_S = 10.0

_RELEASE_RE = re.compile(r"release (\d+)\.(\d+), V(\d+\.\d+(?:\.\d+)?)")
_CUDART_RE = re.compile(r"^\s*#\s*define\s+CUDART_VERSION\s+(\d+)", re.MULTILINE)
_NVCC_PATH_RE = re.compile(r"(/[^\s\"'`;|&()]*?/nvcc)\b")
_VERSION_TXT_RE = re.compile(r"CUDA Version (\d+\.\d+(?:\.\d+)?)")
_NVCC_DIST_RE = re.compile(r"^nvidia_cuda_nvcc(?:_cu\d+)?-(\d+(?:\.\d+)+)[^/]*\.dist-info$")


def read_text(path: str, limit: int = 1 << 20) -> str | None:
    try:
        with open(path, "rb") as fh:
            return fh.read(limit).decode("utf-8", "replace")
    except OSError:
        return None


def major_minor(text: str) -> Version | None:
    try:
        v = Version(text)
    except InvalidVersion:
        return None
    return Version(f"{v.major}.{v.minor}")


def _version_from_files(root: str) -> tuple[str, str] | None:
    """(full nvcc version, file it came from), or None."""
    # 1. version.json: installers of CUDA >= 11.1 write {"cuda_nvcc": {"version": ...}}
    vj = os.path.join(root, "version.json")
    txt = read_text(vj)
    if txt:
        try:
            data = json.loads(txt)
            ver = data.get("cuda_nvcc", {}).get("version") or data.get("cuda", {}).get("version")
            if ver and major_minor(ver):
                return ver, vj
        except (ValueError, AttributeError):
            pass
    # 2. pip wheel metadata: site-packages/nvidia/cu13 -> site-packages/nvidia_cuda_nvcc-*.dist-info
    #    (also <root>/dist-info/, the layout of toolkits assembled from those wheels)
    for meta_dir in (os.path.join(root, "dist-info"), os.path.dirname(os.path.dirname(root))):
        try:
            names = os.listdir(meta_dir)
        except OSError:
            continue
        for name in sorted(names, reverse=True):
            m = _NVCC_DIST_RE.match(name)
            if m and major_minor(m.group(1)):
                if meta_dir != os.path.join(root, "dist-info") and not _wheel_owns(
                    os.path.join(meta_dir, name), root
                ):
                    continue
                return m.group(1), os.path.join(meta_dir, name)
    # 3. version.txt: "CUDA Version 10.2.89" (toolkits before 11.1)
    vt = os.path.join(root, "version.txt")
    txt = read_text(vt)
    if txt:
        m = _VERSION_TXT_RE.search(txt)
        if m:
            return m.group(1), vt
    return None


def _wheel_owns(dist_info: str, root: str) -> bool:
    """Whether the nvcc wheel's RECORD lists ``<root>/bin/nvcc``."""
    site_dir = os.path.dirname(dist_info)
    rel = os.path.relpath(os.path.join(root, "bin", "nvcc"), site_dir)
    record = read_text(os.path.join(dist_info, "RECORD"))
    return bool(record) and (rel + ",") in record


#: Seconds a failed ``nvcc --version`` (hung, garbage) is remembered on disk, so
#: every worker process of a server does not wait the full timeout again.
#: Seconds a failed ``nvcc --version`` (hung, garbage) is remembered on disk, so
#: every worker process of a server does not wait the full timeout again.
FAILURE_MEMORY_S = 600.0


def _nvcc_memo_path() -> str:
    return os.path.join(cache_root(), "nvcc-version.json")


def _stat_key(path: str) -> list[int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns]


def _memo_get(nvcc: str) -> tuple[str | None, str | None] | None:
    try:
        with open(_nvcc_memo_path()) as fh:
            entry = json.load(fh).get(nvcc)
    except (OSError, ValueError, AttributeError):
        return None
    if not entry or entry.get("stat") != _stat_key(nvcc):
        return None
    if entry.get("problem") and time.time() - entry.get("at", 0) > FAILURE_MEMORY_S:
        return None
    return entry.get("full"), entry.get("problem")


def _memo_put(nvcc: str, full: str | None, problem: str | None) -> None:
    path = _nvcc_memo_path()
    try:
        try:
            with open(path) as fh:
                data = json.load(fh)
            if not isinstance(data, dict):
                data = {}
        except (OSError, ValueError):
            data = {}
        data[nvcc] = {"stat": _stat_key(nvcc), "full": full, "problem": problem, "at": time.time()}
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as fh:
            json.dump(data, fh)
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only cache only costs time


def _version_from_nvcc(nvcc: str, timeout: float) -> tuple[str | None, str | None]:
    """Run ``nvcc --version``; returns (full version, None) or (None, problem).

    The answer is remembered in ``<cache_root>/nvcc-version.json`` keyed by the
    binary's inode, size and mtime (failures for :data:`FAILURE_MEMORY_S`).  nvcc
    runs in its own session and, on timeout, its whole process group is killed,
    so a wrapper script's ``sleep`` does not outlive it.
    """
    memo = _memo_get(nvcc)
    if memo is not None:
        return memo
    full, problem = _run_nvcc_version(nvcc, timeout)
    _memo_put(nvcc, full, problem)
    return full, problem


def _run_nvcc_version(nvcc: str, timeout: float) -> tuple[str | None, str | None]:
    try:
        proc = subprocess.Popen(
            [nvcc, "--version"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL, text=True, errors="replace", start_new_session=True,
        )
    except OSError as exc:
        return None, f"{nvcc} could not be run: {exc.strerror or exc}"
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            proc.kill()
        proc.communicate()
        return None, (
            f"{nvcc} did not answer 'nvcc --version' within {timeout:g} s; it is "
            f"hung or broken: fix or remove it, or set CUDA_HOME to a working toolkit "
            f"(not retried for {FAILURE_MEMORY_S / 60:g} min)"
        )
    m = _RELEASE_RE.search(stdout)
    if not m:
        lines = (stdout or stderr).strip().splitlines()
        shown = f"first line: {lines[0][:120]!r}" if lines else "no output"
        return None, (
            f"{nvcc} --version printed no 'release X.Y, VX.Y.Z' line (exit "
            f"{proc.returncode}, {shown}); it is not a working nvcc: fix it or set "
            f"CUDA_HOME to a working toolkit"
        )
    return m.group(3), None


def _header_version(include_dirs: tuple[str, ...]) -> Version | None:
    for inc in include_dirs:
        # CUDART_VERSION is defined near the top (line ~140 of a 600 KB header);
        # 64 KiB keeps this read at a few microseconds.
        txt = read_text(os.path.join(inc, "cuda_runtime_api.h"), 64 << 10)
        if txt:
            m = _CUDART_RE.search(txt)
            if m:
                n = int(m.group(1))  # e.g. 12080 -> 12.8, 13000 -> 13.0
                return Version(f"{n // 1000}.{(n % 1000) // 10}")
    return None


def _include_dirs(root: str) -> tuple[str, ...]:
    found = []
    for rel in ("include", "targets/x86_64-linux/include", "targets/sbsa-linux/include"):
        d = os.path.join(root, rel)
        if os.path.isfile(os.path.join(d, "cuda_runtime_api.h")):
            found.append(d)
    return tuple(found)


def _lib_dir(root: str) -> str | None:
    for rel in ("lib64", "lib", "targets/x86_64-linux/lib", "targets/sbsa-linux/lib"):
        d = os.path.join(root, rel)
        try:
            if any(n.startswith("libcudart.so") for n in os.listdir(d)):
                return d
        except OSError:
            continue
    return None


# --------------------------------------------------------------------------- discovery


def _resolve_nvcc(path: str, depth: int = 0) -> str | None:
    """Follow symlinks and simple wrapper scripts to the real nvcc binary.

    A wrapper such as ``/usr/local/bin/nvcc`` containing
    ``exec /usr/local/cuda-13.0/bin/nvcc "$@"`` is read as text (never run):
    the first absolute path in it that ends in ``/nvcc`` and exists is followed.
    """
    real = os.path.realpath(path)
    if not os.path.isfile(real):
        return None
    if depth > 4:
        return real
    try:
        with open(real, "rb") as fh:
            head = fh.read(4096)
    except OSError:
        return real
    if head.startswith(b"#!"):
        text = head.decode("utf-8", "replace")
        for m in _NVCC_PATH_RE.finditer(text):
            target = m.group(1)
            if os.path.realpath(target) != real and os.path.isfile(target):
                return _resolve_nvcc(target, depth + 1)
    return real



def inspect(root: str, sources: tuple[str, ...] = ("given",), given_as: str | None = None,
            *, timeout: float = NVCC_TIMEOUT_S) -> Toolkit:
    """Read one toolkit's facts from its files (running nvcc only as a fallback).

    Args:
        root: toolkit prefix, e.g. ``/usr/local/cuda-12.8``.
        sources: labels for where it was found.
        given_as: the path as originally given, for messages.
        timeout: seconds allowed for the ``nvcc --version`` fallback.

    Returns:
        A :class:`Toolkit`; ``problem`` says why it is unusable, if it is.
    """
    given = given_as or root
    if not os.path.isdir(root):
        return Toolkit(root, "", sources, None, None, None, None, (), None,
                       problem=f"{given}: directory does not exist; unset it or point it "
                               f"at a toolkit prefix that contains bin/nvcc",
                       given_as=given_as)
    nvcc_link = os.path.join(root, "bin", "nvcc")
    nvcc = _resolve_nvcc(nvcc_link)
    real_root = os.path.realpath(root)
    incs = _include_dirs(real_root)
    lib = _lib_dir(real_root)
    hv = _header_version(incs)
    if not nvcc or not os.access(nvcc, os.X_OK):
        return Toolkit(real_root, "", sources, None, None, hv, None, incs, lib,
                       problem=f"{given}: no executable bin/nvcc; point CUDA_HOME at the "
                               f"toolkit prefix (the directory above bin/)",
                       given_as=given_as)
    untrusted = is_trusted(nvcc)
    if untrusted:
        return Toolkit(real_root, nvcc, sources, None, None, hv, None, incs, lib,
                       problem=f"not run: {untrusted}", given_as=given_as)
    found = _version_from_files(real_root)
    if found:
        full, source = found
        problem = None
    else:
        full, problem = _version_from_nvcc(nvcc, timeout)
        source = "nvcc --version" if full else None
    nv = major_minor(full) if full else None
    if nv and hv and nv != hv:
        problem = (
            f"nvcc {nv} with CUDA headers {hv} (CUDART_VERSION in "
            f"{incs[0]}/cuda_runtime_api.h): CCCL stops with #error when they differ; "
            f"install one consistent set: pip install 'cuda-toolkit[nvcc,cccl,curand]=={nv}.*'"
        )
    if nv and not incs and problem is None:
        problem = f"{real_root}: no include/cuda_runtime_api.h; the toolkit is incomplete"
    return Toolkit(real_root, nvcc, sources, nv, full, hv, source, incs, lib,
                   problem=problem, given_as=given_as)

