"""Read a toolkit's versions: ``nvcc --version`` (bounded, remembered per binary), checked against
the version files beside it, and assemble a :class:`Toolkit`."""

from __future__ import annotations

import logging
import os
import re

from packaging.version import Version

from flashinfer_sm120.safety import formats, proc
from flashinfer_sm120.core.facts.arch import major_minor
from flashinfer_sm120.errors import FormatError
from flashinfer_sm120.core.toolkit import memo
from flashinfer_sm120.core.toolkit.fixes import consistent_set_fix
from flashinfer_sm120.core.toolkit.memo import FAILURE_MEMORY_S
from flashinfer_sm120.core.toolkit.model import Toolkit, VersionDisagreement
from flashinfer_sm120.safety.ownership import trust_reason
from flashinfer_sm120.safety.trust import trace

logger = logging.getLogger("flashinfer_sm120")

__all__ = ["NVCC_TIMEOUT_S", "FAILURE_MEMORY_S", "NVCC_MAX_OUTPUT", "inspect", "read_text", "major_minor",
           "nvcc_version", "nvcc_answer"]


#: Seconds to wait for ``nvcc --version`` (the fallback when no file gives the
#: version).  A healthy nvcc answers in ~5 ms; 10 s covers a cold network FS.
NVCC_TIMEOUT_S = 10.0

_RELEASE_RE = re.compile(r"release (\d+)\.(\d+), V(\d+\.\d+(?:\.\d+)?)")
#: Blanks within the line only (``[ \t]``, not ``\s``): ``^\s*`` crossed newlines, and a header of
#: blank lines was rescanned from every line start (quadratic: seconds per 64 KiB).
_CUDART_RE = re.compile(r"^[ \t]*#[ \t]*define[ \t]+CUDART_VERSION[ \t]+([0-9]+)", re.MULTILINE)
_VERSION_TXT_RE = re.compile(r"CUDA Version (\d+\.\d+(?:\.\d+)?)")
_NVCC_DIST_RE = re.compile(r"^nvidia_cuda_nvcc(?:_cu\d+)?-(\d+(?:\.\d+)+)[^/]*\.dist-info$")


#: Bytes of ``nvcc --version`` output kept; a real nvcc prints ~250.  More
#: means it is not an nvcc (``exec yes garbage``): it is killed at the cap.
NVCC_MAX_OUTPUT = 16 << 10


#: Largest ``version.json`` read (bytes); the installer's is about 3 KiB.
MAX_VERSION_FILE_BYTES = 256 << 10


def read_text(path: str, limit: int = 1 << 20) -> str | None:
    """First ``limit`` bytes of a regular file as text (undecodable bytes
    replaced), or ``None``; never blocks on a FIFO or device
    (:func:`flashinfer_sm120.safety.formats.read_prefix`)."""
    try:
        return formats.read_prefix(path, limit).decode("utf-8", "replace")
    except FormatError:
        return None


def _version_json(path: str) -> Version | None:
    """``cuda_nvcc.version`` (else ``cuda.version``) of an installer's ``version.json``,
    parsed once (:func:`flashinfer_sm120.safety.formats.parse_version`); ``None`` when the
    file is absent or unusable (too large, too deep, wrong types: logged, not raised,
    so the next source is tried)."""
    if not os.path.lexists(path):
        return None
    fix = "the next version source is used; reinstall the toolkit to repair it"
    try:
        data = formats.read_json_file(path, MAX_VERSION_FILE_BYTES, fix=fix)
        for key in ("cuda_nvcc", "cuda"):
            part = formats.field(data, key, dict, path, default=None, fix=fix)
            if part is not None and "version" in part:
                return formats.parse_version(formats.field(part, "version", str, f"{path} {key}", fix=fix),
                                             f"{path} {key}.version", fix=fix)
    except FormatError as exc:
        logger.info("flashinfer-sm120: %s", exc)
    return None


def _version_from_files(root: str) -> tuple[Version, str] | None:
    """(full nvcc version, file it came from), or None."""
    # 1. version.json: installers of CUDA >= 11.1 write {"cuda_nvcc": {"version": ...}}
    vj = os.path.join(root, "version.json")
    ver = _version_json(vj)
    if ver is not None:
        return ver, vj
    # 2. pip wheel metadata: site-packages/nvidia/cu13 -> site-packages/nvidia_cuda_nvcc-*.dist-info
    #    (also <root>/dist-info/, the layout of toolkits assembled from those wheels)
    for meta_dir in (os.path.join(root, "dist-info"), os.path.dirname(os.path.dirname(root))):
        try:
            names = os.listdir(meta_dir)
        except OSError:
            continue
        for name in sorted(names, reverse=True):
            m = _NVCC_DIST_RE.match(name)
            if not m:
                continue
            try:
                ver = formats.parse_version(m.group(1), os.path.join(meta_dir, name))
            except FormatError:
                continue
            if meta_dir != os.path.join(root, "dist-info") and not _wheel_owns(os.path.join(meta_dir, name), root):
                continue
            return ver, os.path.join(meta_dir, name)
    # 3. version.txt: "CUDA Version 10.2.89" (toolkits before 11.1)
    vt = os.path.join(root, "version.txt")
    txt = read_text(vt, 4096)
    if txt:
        m = _VERSION_TXT_RE.search(txt)
        if m:
            try:
                return formats.parse_version(m.group(1), vt), vt
            except FormatError:
                pass
    return None


def _wheel_owns(dist_info: str, root: str) -> bool:
    """Whether the nvcc wheel's ``RECORD`` lists ``<root>/bin/nvcc`` (read with
    :mod:`importlib.metadata`, which parses ``RECORD`` as the wheel spec says)."""
    import importlib.metadata
    import pathlib

    site_dir = os.path.dirname(dist_info)
    rel = pathlib.PurePosixPath(os.path.relpath(os.path.join(root, "bin", "nvcc"), site_dir))
    if not os.path.isfile(os.path.join(dist_info, "RECORD")):
        return False
    try:
        files = importlib.metadata.PathDistribution(pathlib.Path(dist_info)).files or []
    except Exception:  # a malformed RECORD: not proof of ownership
        return False
    return any(pathlib.PurePosixPath(str(f)) == rel for f in files)


def nvcc_version(nvcc: str, timeout: float = NVCC_TIMEOUT_S) -> tuple[str | None, str | None]:
    """``nvcc --version`` of a binary, remembered per binary: ``(full, None)`` or ``(None, problem)``.

    The answer is kept in the memo (:mod:`flashinfer_sm120.core.toolkit.memo`), keyed
    by path and stat fingerprint; failures for :data:`FAILURE_MEMORY_S`.  One
    process probes while the others wait on the memo's lock.  The run itself is
    bounded by :func:`flashinfer_sm120.safety.proc.run`: ``timeout`` seconds for the
    whole call, :data:`NVCC_MAX_OUTPUT` bytes of output, no descendant left.
    The caller checks trust first (:func:`flashinfer_sm120.safety.trust.trace`).

    Args:
        nvcc: path of the nvcc binary.
        timeout: seconds allowed for ``nvcc --version``.
    """
    full, problem, _local = nvcc_answer(nvcc, timeout)
    return full, problem


def nvcc_answer(nvcc: str, timeout: float = NVCC_TIMEOUT_S) -> tuple[str | None, str | None, bool]:
    """:func:`nvcc_version` and whether a failure was this process's own (``local``: it could not
    start a program at all, e.g. ``EAGAIN`` or ``E2BIG``), which says nothing about the binary."""
    local: list[bool] = []

    def probe() -> tuple[str | None, str | None, bool]:
        full, problem, remember = _run_nvcc_version(nvcc, timeout)
        local.append(not remember)
        return full, problem, remember

    full, problem = memo.probe_once(nvcc, probe, lock_timeout=timeout + 5.0)
    return full, problem, any(local)


def _run_nvcc_version(nvcc: str, timeout: float) -> tuple[str | None, str | None, bool]:
    """``(full, problem, remember)``: ``remember`` is false when the run failed for
    this process's own reasons (:attr:`flashinfer_sm120.safety.proc.Result.local`), which
    say nothing about the binary and must not reject it for other processes."""
    res = proc.run([nvcc, "--version"], timeout=timeout, max_output=NVCC_MAX_OUTPUT)
    later = f"(not retried for {FAILURE_MEMORY_S / 60:g} min)"
    if res.local:
        return None, (f"{res.error}: this process ran out of a resource of its own (processes, open "
                      f"files or memory), not a fault of {nvcc}; raise the limit (ulimit -u / -n) or "
                      f"free memory, then retry (not remembered)"), False
    if res.error:
        return None, f"{res.error}; fix it or set CUDA_HOME to a working toolkit", True
    if res.timed_out:
        return None, (f"{nvcc} did not answer 'nvcc --version' within {timeout:g} s; it is "
                      f"hung or broken: fix or remove it, or set CUDA_HOME to a working toolkit {later}"), True
    if res.truncated:
        return None, (f"{nvcc} --version printed more than {NVCC_MAX_OUTPUT} bytes and was stopped; "
                      f"it is not a working nvcc: fix or remove it, or set CUDA_HOME to a working "
                      f"toolkit {later}"), True
    out = res.text()
    m = _RELEASE_RE.search(out)
    full = None
    if m:
        try:
            full = str(formats.parse_version(m.group(3), f"{nvcc} --version"))
        except FormatError:
            full = None
    if full is None:
        lines = out.strip().splitlines()
        first = f"first line: {formats.shown(lines[0], 120)}" if lines else "no output"
        return None, (f"{nvcc} --version printed no 'release X.Y, VX.Y.Z' line (exit "
                      f"{res.returncode}, {first}); it is not a working nvcc: fix it or set "
                      f"CUDA_HOME to a working toolkit"), True
    return full, None, True


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
    for rel in ("lib64", "lib", "targets/x86_64-linux/lib", "targets/sbsa-linux/lib",
                "lib/x86_64-linux-gnu", "lib/aarch64-linux-gnu"):  # the last two: Debian's /usr
        d = os.path.join(root, rel)
        try:
            if any(n.startswith("libcudart.so") for n in os.listdir(d)):
                return d
        except OSError:
            continue
    return None


def _fix(sources: tuple[str, ...], given: str) -> str:
    """The fix sentence for a candidate that has no usable nvcc, by where it came from."""
    src = sources[0] if sources else "given"
    if src in ("CUDA_HOME", "CUDA_PATH"):
        return (f"unset {src} or point it at a toolkit prefix (the directory above bin/nvcc)")
    if src == "conda":
        return "install nvcc into the conda environment (conda install cuda-nvcc) or deactivate it"
    if src == "PATH":
        return (f"the nvcc on PATH ({given}) does not sit in a toolkit's bin/ directory; put the "
                f"toolkit's bin/ directory on PATH instead, or remove {given} from PATH")
    return "reinstall the toolkit, or set CUDA_HOME to a complete one"


def _untrusted(kind: str, why: str) -> str:
    return (f"not {kind}: {why}. flashinfer-sm120 runs and adopts only files that root or you own, "
            f"in directories nobody else can write; fix the ownership/mode, or set CUDA_HOME to a "
            f"toolkit that qualifies")


def inspect(root: str, sources: tuple[str, ...] = ("given",), given_as: str | None = None,
            *, timeout: float = NVCC_TIMEOUT_S) -> Toolkit:
    """Read one toolkit's facts from its files, its version confirmed by ``nvcc --version``.

    ``<root>/bin/nvcc`` is traced through links and wrapper scripts without
    running it (:func:`flashinfer_sm120.safety.trust.trace`); anything
    untrusted on the way, or a wrapper whose target cannot be told, makes the
    toolkit unusable and nothing is run.  Include and library directories must
    pass the same rule to be adopted.  The version is what ``nvcc --version`` says
    (:func:`nvcc_version`: bounded, remembered per binary); ``version.json``, the pip
    wheel's ``dist-info`` or ``version.txt`` (of ``root`` or of the toolkit the wrapper
    leads to) is named as its source when it agrees, and a file that disagrees is
    recorded in ``Toolkit.disagreement`` (the binary's answer is used).

    Args:
        root: toolkit prefix, e.g. ``/usr/local/cuda-12.8`` or ``/usr`` (Debian:
            ``/usr/bin/nvcc`` wrapper, headers in ``/usr/include``).
        sources: labels for where it was found (the first picks the fix advice).
        given_as: the path as originally given, for messages.
        timeout: seconds allowed for the ``nvcc --version`` fallback.

    Returns:
        A :class:`Toolkit`; ``problem`` says why it is unusable, if it is.
    """
    given = given_as or root
    base = dict(sources=tuple(sources), given_as=given_as)
    if not os.path.isdir(root):
        return Toolkit(root=root, nvcc="", **base,
                       problem=f"{given}: directory does not exist; {_fix(sources, given)}")
    real_root = os.path.realpath(root)
    incs = _include_dirs(real_root)
    lib = _lib_dir(real_root)
    hv = _header_version(incs)
    base.update(root=real_root, header_version=hv, include_dirs=incs, lib_dir=lib)
    nvcc_link = os.path.join(root, "bin", "nvcc")
    if not os.path.isfile(nvcc_link) or not os.access(nvcc_link, os.X_OK):
        return Toolkit(nvcc="", **base, problem=f"{given}: no executable bin/nvcc; {_fix(sources, given)}")
    tr = trace(nvcc_link)
    if tr.problem or not tr.target:
        return Toolkit(nvcc=tr.target or "", **base, problem=_untrusted("run", tr.problem or "?"))
    for d in incs + ((lib,) if lib else ()):
        why = trust_reason(d, absent_ok=False)
        if why:
            return Toolkit(nvcc=tr.target, **base, problem=_untrusted("adopted", why))
    nvcc = tr.target
    found = _version_from_files(real_root)
    target_root = os.path.dirname(os.path.dirname(nvcc))
    if not found and target_root != real_root:
        found = _version_from_files(target_root)
    # threat-model: P1: the binary decides; a file beside it only names the version when nvcc agrees
    # (one run per binary: nvcc_version is remembered, keyed by the binary's fingerprint)
    full, problem, local = nvcc_answer(nvcc, timeout)
    source, disagreement = ("nvcc --version" if full else None), None
    if found and full:
        version, file = found
        if str(version) == full:  # formatted from the parsed Version, never the raw text
            source = file
        else:
            disagreement = VersionDisagreement(file, str(version), nvcc, full)
    elif found and local:  # this process cannot start programs (nor could FlashInfer): the file, for now
        logger.info("flashinfer-sm120: %s; using the version %s gives, unconfirmed", problem, found[1])
        full, problem, source = str(found[0]), None, found[1]
    nv = major_minor(full) if full else None
    pip = "pip" in sources or f"{os.sep}site-packages{os.sep}nvidia{os.sep}" in real_root + os.sep
    if nv and hv and nv != hv:
        problem = (
            f"nvcc {nv} with CUDA headers {hv} (CUDART_VERSION in "
            f"{incs[0]}/cuda_runtime_api.h): CCCL stops with #error when they differ; "
            f"install one consistent set: {consistent_set_fix(nv, pip)}"
        )
    if nv and not incs and problem is None:
        problem = (f"{real_root}: no include/cuda_runtime_api.h; the toolkit is incomplete: "
                   f"{consistent_set_fix(nv, pip)}")
    return Toolkit(nvcc=nvcc, nvcc_version=nv, nvcc_full=full, version_from=source, problem=problem,
                   disagreement=disagreement, **base)


def flashinfer_cuda_version(cuda_path: str):
    """FlashInfer's own ``get_cuda_version`` (``<cuda_path>/bin/nvcc --version`` as ``major.minor``, else
    ``torch.version.cuda``; 0.7.x ``jit/cpp_ext.py``) for a process flashinfer-sm120 does not patch (guard,
    noop), with the bounded, memoized run and the trust rule: FlashInfer's ``check_output`` has no
    deadline, and an nvcc leaving a child that holds its output hung the import (threat-model: P6).

    Raises:
        RuntimeError: as FlashInfer does, when neither answers.
    """
    from packaging.version import Version

    from flashinfer_sm120.safety.trust import trace

    nvcc = os.path.join(cuda_path, "bin", "nvcc")
    problem = trace(nvcc).problem
    full, problem = (None, problem) if problem else nvcc_version(nvcc)
    if full:
        return Version(".".join(full.split(".")[:2]))
    import torch

    if torch.version.cuda is None:
        raise RuntimeError(f"nvcc not usable ({problem}) and PyTorch is not built with CUDA support. "
                           f"Could not determine CUDA version.")
    return Version(torch.version.cuda)

