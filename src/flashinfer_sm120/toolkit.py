"""Find every CUDA toolkit on the machine, read its versions, and choose one.

FlashInfer's own lookup (``flashinfer/jit/cpp_ext.py``, ``get_cuda_path``) takes
``CUDA_HOME``, else ``CUDA_PATH``, else ``dirname(dirname(which nvcc))``, else
``/usr/local/cuda``, and asks that nvcc for its version.  It never looks at the
CUDA 13 nvcc that pip installs into ``site-packages/nvidia/cu13``, and a wrapper
script at ``/usr/local/bin/nvcc`` makes it pick ``/usr/local``.  Here every
candidate is gathered, versions are read from files (fast; the subprocess
``nvcc --version`` is only a fallback, with a timeout), each is checked against
the targets wanted, and the first acceptable one in a fixed order of sources
wins.  The result says where it came from and why the others were rejected.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import shutil
import signal
import site
import stat
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import InvalidVersion, Version

from . import arch as _arch

logger = logging.getLogger("flashinfer_sm120")

__all__ = [
    "NVCC_TIMEOUT_S",
    "cache_root",
    "Toolkit",
    "Choice",
    "ToolkitError",
    "discover",
    "choose",
    "flashinfer_naive_root",
    "is_trusted",
    "torch_cuda_version",
]

#: Seconds to wait for ``nvcc --version`` (the fallback when no file gives the
#: version).  A healthy nvcc answers in ~5 ms; 10 s covers a cold network FS.
NVCC_TIMEOUT_S = 10.0

_RELEASE_RE = re.compile(r"release (\d+)\.(\d+), V(\d+\.\d+(?:\.\d+)?)")
_CUDART_RE = re.compile(r"^\s*#\s*define\s+CUDART_VERSION\s+(\d+)", re.MULTILINE)
_PIP_PREFIX_RE = re.compile(r"cu1[3-9]")  # site-packages/nvidia/cu13: no pip wheel before 13 ships nvcc
_VERSIONED_RE = re.compile(r"cuda-\d")
_NVCC_PATH_RE = re.compile(r"(/[^\s\"'`;|&()]*?/nvcc)\b")
_VERSION_TXT_RE = re.compile(r"CUDA Version (\d+\.\d+(?:\.\d+)?)")
_NVCC_DIST_RE = re.compile(r"^nvidia_cuda_nvcc(?:_cu\d+)?-(\d+(?:\.\d+)+)[^/]*\.dist-info$")

#: Source labels, in the order a candidate is preferred when several pass.
SOURCES = ("CUDA_HOME", "CUDA_PATH", "pip", "PATH", "/usr/local/cuda", "versioned", "conda")


class ToolkitError(RuntimeError):
    """No toolkit can build the wanted targets; the message lists each candidate
    with the reason it was rejected, and the fix."""


@dataclass(frozen=True)
class Toolkit:
    """One candidate CUDA toolkit.

    Attributes:
        root: toolkit prefix (``<root>/bin/nvcc``), symlinks resolved.
        nvcc: real path of the nvcc binary.
        sources: where it was found, best first, e.g. ``("CUDA_HOME", "PATH")``.
        nvcc_version: ``major.minor`` of nvcc, or ``None`` when unreadable.
        nvcc_full: full version string, e.g. ``"13.0.88"``.
        header_version: ``major.minor`` from ``CUDART_VERSION`` in
            ``cuda_runtime_api.h``, or ``None``.
        version_from: which file (or ``"nvcc --version"``) gave ``nvcc_version``.
        include_dirs: directories holding ``cuda_runtime_api.h``.
        lib_dir: directory holding ``libcudart.so*``, or ``None``.
        problem: why the toolkit is unusable in any case (missing nvcc, untrusted,
            unreadable version, nvcc/header mismatch), or ``None``.
        given_as: the path as the user or environment gave it (e.g. ``$CUDA_HOME``).
    """

    root: str
    nvcc: str
    sources: tuple[str, ...]
    nvcc_version: Version | None
    nvcc_full: str | None
    header_version: Version | None
    version_from: str | None
    include_dirs: tuple[str, ...]
    lib_dir: str | None
    problem: str | None = None
    given_as: str | None = None

    @property
    def label(self) -> str:
        """Short human description: ``CUDA 13.0 at /path (pip)``."""
        ver = f"CUDA {self.nvcc_version}" if self.nvcc_version else "CUDA ?"
        return f"{ver} at {self.root} ({', '.join(self.sources)})"

    def to_dict(self) -> dict:
        """JSON-ready form (versions as strings)."""
        return {
            "root": self.root,
            "nvcc": self.nvcc,
            "sources": list(self.sources),
            "nvcc_version": str(self.nvcc_version) if self.nvcc_version else None,
            "nvcc_full": self.nvcc_full,
            "header_version": str(self.header_version) if self.header_version else None,
            "version_from": self.version_from,
            "include_dirs": list(self.include_dirs),
            "lib_dir": self.lib_dir,
            "problem": self.problem,
            "given_as": self.given_as,
        }


@dataclass(frozen=True)
class Choice:
    """The outcome of :func:`choose`.

    Attributes:
        toolkit: the chosen toolkit.
        targets: ``(major, minor_str)`` targets it will build, sorted.
        capabilities: the compute capabilities those targets serve.
        rejected: ``(toolkit, reason)`` for every candidate not chosen.
        reason: one sentence on why this toolkit won.
        torch_cuda: ``torch.version.cuda`` (``None`` for a CPU build of torch).
    """

    toolkit: Toolkit
    targets: tuple[tuple[int, str], ...]
    capabilities: tuple[tuple[int, int], ...]
    rejected: tuple[tuple[Toolkit, str], ...] = field(default_factory=tuple)
    reason: str = ""
    torch_cuda: str | None = None

    @property
    def version(self) -> Version:
        """nvcc ``major.minor`` of the chosen toolkit."""
        assert self.toolkit.nvcc_version is not None
        return self.toolkit.nvcc_version

    def to_dict(self) -> dict:
        """JSON-ready form."""
        return {
            "toolkit": self.toolkit.to_dict(),
            "targets": [_arch.format_target(t) for t in self.targets],
            "capabilities": [f"{a}.{b}" for a, b in self.capabilities],
            "rejected": [{"toolkit": t.to_dict(), "reason": r} for t, r in self.rejected],
            "reason": self.reason,
            "torch_cuda": self.torch_cuda,
        }


# --------------------------------------------------------------------------- trust


def is_trusted(path: str) -> str | None:
    """Check that ``path`` and every directory above it are safe to execute from.

    A file is trusted when it and each parent are owned by root or by the current
    user and are not writable by group or others (a world-writable directory with
    the sticky bit, like ``/tmp``, is allowed: others cannot replace entries in it).
    This is the rule OpenSSH applies to ``authorized_keys`` (``StrictModes``).

    Returns:
        ``None`` when trusted, else a sentence naming the offending path and mode.
    """
    uid = os.geteuid() if hasattr(os, "geteuid") else 0
    p = Path(os.path.realpath(path))
    for node in [p, *p.parents]:
        try:
            st = node.stat()
        except OSError as exc:
            return f"cannot stat {node}: {exc.strerror}"
        if st.st_uid not in (0, uid):
            return f"{node} is owned by uid {st.st_uid}, not root or you"
        writable_by_others = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        if writable_by_others and not (node.is_dir() and st.st_mode & stat.S_ISVTX):
            return (
                f"{node} is writable by other users (mode {stat.filemode(st.st_mode)}); "
                f"run 'chmod go-w {node}' or use another toolkit"
            )
    return None


# --------------------------------------------------------------------------- versions


def _read_text(path: str, limit: int = 1 << 20) -> str | None:
    try:
        with open(path, "rb") as fh:
            return fh.read(limit).decode("utf-8", "replace")
    except OSError:
        return None


def _mm(text: str) -> Version | None:
    try:
        v = Version(text)
    except InvalidVersion:
        return None
    return Version(f"{v.major}.{v.minor}")


def _version_from_files(root: str) -> tuple[str, str] | None:
    """(full nvcc version, file it came from), or None."""
    # 1. version.json: installers of CUDA >= 11.1 write {"cuda_nvcc": {"version": ...}}
    vj = os.path.join(root, "version.json")
    txt = _read_text(vj)
    if txt:
        try:
            data = json.loads(txt)
            ver = data.get("cuda_nvcc", {}).get("version") or data.get("cuda", {}).get("version")
            if ver and _mm(ver):
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
            if m and _mm(m.group(1)):
                if meta_dir != os.path.join(root, "dist-info") and not _wheel_owns(
                    os.path.join(meta_dir, name), root
                ):
                    continue
                return m.group(1), os.path.join(meta_dir, name)
    # 3. version.txt: "CUDA Version 10.2.89" (toolkits before 11.1)
    vt = os.path.join(root, "version.txt")
    txt = _read_text(vt)
    if txt:
        m = _VERSION_TXT_RE.search(txt)
        if m:
            return m.group(1), vt
    return None


def _wheel_owns(dist_info: str, root: str) -> bool:
    """Whether the nvcc wheel's RECORD lists ``<root>/bin/nvcc``."""
    site_dir = os.path.dirname(dist_info)
    rel = os.path.relpath(os.path.join(root, "bin", "nvcc"), site_dir)
    record = _read_text(os.path.join(dist_info, "RECORD"))
    return bool(record) and (rel + ",") in record


#: Seconds a failed ``nvcc --version`` (hung, garbage) is remembered on disk, so
#: every worker process of a server does not wait the full timeout again.
FAILURE_MEMORY_S = 600.0


def cache_root() -> str:
    """``$FLASHINFER_SM120_CACHE_DIR``, else ``$XDG_CACHE_HOME/flashinfer-sm120``,
    else ``~/.cache/flashinfer-sm120``."""
    explicit = os.environ.get("FLASHINFER_SM120_CACHE_DIR")
    if explicit:
        return explicit
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "flashinfer-sm120")


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
        txt = _read_text(os.path.join(inc, "cuda_runtime_api.h"), 64 << 10)
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


def _clean_home(value: str) -> str:
    """``CUDA_HOME`` as people write it: ``:/opt/cuda`` (from ``$X:$CUDA_HOME``),
    a trailing ``/bin`` or ``/bin/nvcc``, or a trailing slash."""
    v = value.strip().strip(os.pathsep).split(os.pathsep)[0].rstrip("/") or value
    for tail in ("/bin/nvcc", "/bin"):
        if v.endswith(tail):
            v = v[: -len(tail)]
    return v


@functools.lru_cache(maxsize=8)
def _site_dirs_for(path_key: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(_site_dirs_uncached())


def _site_dirs() -> list[str]:
    """Every site-packages directory of this interpreter (cached per ``sys.path``)."""
    return list(_site_dirs_for(tuple(sys.path)))


def _view_toolkit(path: str) -> str | None:
    """The real toolkit behind a flashinfer-sm120 ``CUDA_HOME`` view, else ``None``."""
    txt = _read_text(os.path.join(path, "flashinfer_sm120_view.json"), 64 << 10)
    if not txt:
        return None
    try:
        root = json.loads(txt).get("toolkit")
    except (ValueError, AttributeError):
        return None
    return root if isinstance(root, str) and os.path.isdir(root) else None


def _site_dirs_uncached() -> list[str]:
    dirs: list[str] = []
    for getter in (
        lambda: site.getsitepackages(),
        lambda: [site.getusersitepackages()],
        lambda: [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))],
    ):
        try:
            for d in getter():
                if d and d not in dirs:
                    dirs.append(d)
        except Exception:  # site may be disabled (python -S)
            continue
    return dirs


def _raw_candidates(env: dict[str, str]) -> list[tuple[str, str, str]]:
    """(source, root, given_as) in preference order; roots may repeat."""
    out: list[tuple[str, str, str]] = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        val = env.get(var)
        if val:
            home = _clean_home(val)
            behind = _view_toolkit(home)
            if behind:  # exported by flashinfer-sm120 to this process's parent
                out.append((var, behind, f"${var}={val} (flashinfer-sm120 view of {behind})"))
            else:
                out.append((var, home, f"${var}={val}"))
    for sd in _site_dirs():
        try:
            subs = os.listdir(os.path.join(sd, "nvidia"))
        except OSError:
            continue
        for name in sorted((n for n in subs if _PIP_PREFIX_RE.fullmatch(n)), reverse=True):
            sub = os.path.join(sd, "nvidia", name)
            out.append(("pip", sub, sub))
        legacy = os.path.join(sd, "nvidia", "cuda_nvcc")  # cu12 wheels: no nvcc before 13
        if os.path.isfile(os.path.join(legacy, "bin", "nvcc")):
            out.append(("pip", legacy, legacy))
    which = shutil.which("nvcc", path=env.get("PATH", os.defpath))
    if which:
        real = _resolve_nvcc(which)
        root = os.path.dirname(os.path.dirname(real)) if real else os.path.dirname(os.path.dirname(which))
        out.append(("PATH", root, which))
    out.append(("/usr/local/cuda", "/usr/local/cuda", "/usr/local/cuda"))
    try:
        versioned = [os.path.join("/usr/local", n) for n in os.listdir("/usr/local")
                     if _VERSIONED_RE.match(n)]
    except OSError:
        versioned = []

    def _vkey(p: str) -> Version:
        return _mm(p.rsplit("-", 1)[-1]) or Version("0")

    for p in sorted(versioned, key=_vkey, reverse=True):
        out.append(("versioned", p, p))
    conda = env.get("CONDA_PREFIX")
    if conda:
        out.append(("conda", conda, f"$CONDA_PREFIX={conda}"))
    return out


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
    nv = _mm(full) if full else None
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


class Candidates(Sequence):
    """Toolkit candidates in preference order, inspected only when first looked at.

    :func:`choose` stops at the first acceptable toolkit, so the usual start-up
    reads the files of one or two toolkits, not every toolkit on the machine.
    ``len()`` and iteration are cheap to ask for; items are :class:`Toolkit`.
    """

    def __init__(self, raw: list[tuple[tuple[str, ...], str, str]], timeout: float) -> None:
        self._raw = raw  # (sources, root, given_as)
        self._timeout = timeout
        self._done: dict[int, Toolkit] = {}

    def __len__(self) -> int:
        return len(self._raw)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if i not in self._done:
            sources, root, given = self._raw[i]
            self._done[i] = inspect(root, sources, given, timeout=self._timeout)
        return self._done[i]

    def is_read(self, i: int) -> bool:
        """Whether candidate ``i`` has been inspected (its files read) already."""
        return i in self._done

    def peek(self, i: int) -> Toolkit:
        """The toolkit if already inspected, else a placeholder with root and sources only."""
        if i in self._done:
            return self._done[i]
        sources, root, given = self._raw[i]
        return Toolkit(root, "", sources, None, None, None, None, (), None, given_as=given)


def discover(env: dict[str, str] | None = None, *, timeout: float = NVCC_TIMEOUT_S) -> Candidates:
    """All candidate toolkits, in preference order, one entry per real nvcc.

    Sources, in order: ``CUDA_HOME``, ``CUDA_PATH`` (cleaned of a leading ``:`` and a
    trailing ``/bin``), pip wheels (``site-packages/nvidia/cu13`` in every site
    directory), ``nvcc`` on ``PATH`` (symlinks and wrapper scripts followed),
    ``/usr/local/cuda``, ``/usr/local/cuda-X.Y`` (newest first), ``$CONDA_PREFIX``.

    Args:
        env: environment to read (default ``os.environ``).
        timeout: seconds allowed per ``nvcc --version`` fallback.

    Returns:
        A lazy sequence of :class:`Toolkit`, including unusable ones (their
        ``problem`` is set), e.g. a ``CUDA_HOME`` that does not exist.
    """
    env = dict(os.environ if env is None else env)
    merged: dict[str, tuple[list[str], str, str]] = {}
    order: list[str] = []
    bad: list[tuple[tuple[str, ...], str, str]] = []
    for source, root, given in _raw_candidates(env):
        if not os.path.isdir(root):
            if source in ("CUDA_HOME", "CUDA_PATH", "conda"):
                bad.append(((source,), root, given))
            continue
        # Dedupe on the real path (cheap); wrappers are followed later by inspect().
        key = os.path.realpath(os.path.join(root, "bin", "nvcc"))
        if key in merged:
            if source not in merged[key][0]:
                merged[key][0].append(source)
            continue
        merged[key] = ([source], root, given)
        order.append(key)
    raw = bad + [(tuple(merged[k][0]), merged[k][1], merged[k][2]) for k in order]
    return Candidates(raw, timeout)


def flashinfer_naive_root(env: dict[str, str] | None = None) -> str | None:
    """The toolkit prefix FlashInfer's own ``get_cuda_path()`` would return.

    Mirrors ``flashinfer/jit/cpp_ext.py`` (0.6.7 - 0.7.4): ``CUDA_HOME`` or
    ``CUDA_PATH`` verbatim, else ``dirname(dirname(which nvcc))`` without resolving
    links (so a wrapper at ``/usr/local/bin/nvcc`` gives ``/usr/local``), else
    ``/usr/local/cuda`` when it exists, else ``None``.
    """
    env = dict(os.environ if env is None else env)
    home = env.get("CUDA_HOME") or env.get("CUDA_PATH")
    if home is not None:
        return home
    which = shutil.which("nvcc", path=env.get("PATH", os.defpath))
    if which:
        return os.path.dirname(os.path.dirname(which))
    return "/usr/local/cuda" if os.path.exists("/usr/local/cuda") else None


def torch_cuda_version() -> str | None:
    """``torch.version.cuda`` (``"13.0"`` for cu130 wheels, ``None`` for CPU builds).

    Imports torch if needed (FlashInfer does anyway); ``None`` if torch is absent.
    """
    try:
        import torch
    except Exception:
        return None
    return getattr(torch.version, "cuda", None)


# --------------------------------------------------------------------------- choice


def _why_not(tk: Toolkit, targets: list[tuple[int, str]], torch_cuda: str | None) -> str | None:
    if tk.problem:
        return tk.problem
    if tk.nvcc_version is None:
        return "version unknown"
    if torch_cuda:
        tmaj = _mm(torch_cuda)
        if tmaj and tmaj.major != tk.nvcc_version.major:
            return (
                f"nvcc {tk.nvcc_version} but torch is built for CUDA {torch_cuda}: the JIT "
                f"module would link a different libcudart major than torch loads; use a "
                f"CUDA {tmaj.major}.x toolkit, e.g. pip install "
                f"'cuda-toolkit[nvcc,cccl,curand]=={torch_cuda}.*'"
            )
    missing = [t for t in targets if not _arch.target_supported(t, tk.nvcc_version)]
    if missing:
        needs = ", ".join(
            f"{_arch.format_target(t)} (nvcc >= {_arch.min_nvcc_for(t)})" if _arch.min_nvcc_for(t)
            else f"{_arch.format_target(t)} (not in flashinfer-sm120's table: upgrade flashinfer-sm120)"
            for t in missing
        )
        return f"nvcc {tk.nvcc_version} cannot build {needs}"
    return None


def _after(toolkits: Sequence[Toolkit], j: int, chosen: Toolkit, wanted, torch_cuda) -> tuple[Toolkit, str]:
    """A candidate after the chosen one: its own verdict if already read, else
    a placeholder (lazy :class:`Candidates` do not read what is not needed)."""
    if isinstance(toolkits, Candidates) and not toolkits.is_read(j):
        return toolkits.peek(j), f"not examined: {chosen.root} comes first and works"
    tk = toolkits[j]
    why = _why_not(tk, wanted, torch_cuda)
    return tk, (f"not chosen ({why})" if why else f"usable, but {chosen.root} comes first")


def choose(
    toolkits: Sequence[Toolkit],
    arch_specs: list[_arch.ArchSpec] | None,
    capabilities: list[tuple[int, int]],
    torch_cuda: str | None,
) -> Choice:
    """Pick the toolkit that builds the best targets for the wanted capabilities.

    Pass 1 asks every capability for FlashInfer's preferred target (e.g. sm_120f
    for 12.0, needing nvcc 12.9); pass 2, only if no toolkit passes 1, accepts
    fallbacks (sm_120a on 12.8).  Within a pass the first acceptable toolkit in
    :func:`discover` order wins, so an explicit, working ``CUDA_HOME`` is kept.
    A toolkit is acceptable when it has no ``problem``, its nvcc major equals
    torch's CUDA major (when torch has CUDA), and it builds every target.

    Args:
        toolkits: from :func:`discover` (inspected lazily: toolkits after the
            chosen one are not read), or any sequence of :class:`Toolkit`.
        arch_specs: parsed ``FLASHINFER_CUDA_ARCH_LIST``, or ``None`` to use
            ``capabilities``; explicit suffixes (``12.0f``) are required as given.
        capabilities: visible GPUs' compute capabilities, e.g. ``[(12, 0)]``.
        torch_cuda: ``torch.version.cuda`` or ``None``.

    Raises:
        ToolkitError: nothing passes; the message lists each candidate and why.
    """
    if arch_specs is not None:
        caps = [(s.major, s.minor) for s in arch_specs]
        fixed = {(s.major, s.minor): (s.major, f"{s.minor}{s.suffix}") for s in arch_specs if s.suffix}
    else:
        caps = list(dict.fromkeys(capabilities))
        fixed = {}
    passes: list[list[tuple[int, str]]] = []
    for depth in (0, -1):
        wanted = [fixed.get(c) or _arch.candidate_targets(*c)[depth] for c in caps]
        if wanted not in passes:
            passes.append(wanted)
    last_reasons: dict[int, str] = {}
    for n, wanted in enumerate(passes):
        reasons: dict[int, str] = {}
        for i in range(len(toolkits)):
            tk = toolkits[i]
            why = _why_not(tk, wanted, torch_cuda)
            if why is None:
                targets = tuple(sorted({_arch.normalize(*c, tk.nvcc_version) if c not in fixed else fixed[c] for c in caps}))
                rejected = tuple(
                    (toolkits[j], reasons[j]) if j < i else _after(toolkits, j, tk, wanted, torch_cuda)
                    for j in range(len(toolkits)) if j != i)
                what = ", ".join(_arch.format_target(t) for t in targets) or "no GPU targets"
                reason = f"first acceptable toolkit in order ({tk.sources[0]}) for {what}"
                if n:
                    reason += "; no toolkit could build the preferred targets " + ", ".join(
                        _arch.format_target(t) for t in passes[0])
                return Choice(tk, targets, tuple(caps), rejected, reason, torch_cuda)
            reasons[i] = why
        last_reasons = reasons
    lines = [f"  - {toolkits[i].label}: {last_reasons.get(i, '?')}" for i in range(len(toolkits))]
    wanted_txt = ", ".join(_arch.format_target(t) for t in passes[0]) or "(no GPU targets)"
    raise ToolkitError(
        f"no CUDA toolkit can build {wanted_txt}"
        + (f" for torch CUDA {torch_cuda}" if torch_cuda else "")
        + ":\n" + ("\n".join(lines) if lines else "  (no toolkit found)")
        + f"\nFix: pip install 'cuda-toolkit[nvcc,cccl,curand]{_pin(torch_cuda)}' (pip nvcc in "
        "site-packages/nvidia/cu13), or set CUDA_HOME to a toolkit that can."
    )


def _pin(torch_cuda: str | None) -> str:
    """Version spec for the fix line: torch's CUDA minor release, else any 13.x."""
    return f"=={torch_cuda}.*" if _mm(torch_cuda or "") else ">=13.0,<14"
