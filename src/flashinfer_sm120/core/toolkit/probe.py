"""Read a toolkit's facts: its version is what its binary says (P1; a bounded run remembered in
:mod:`.memo`), its include and library directories pass the trust rule (P2)."""

from __future__ import annotations

import errno
import importlib.metadata
import logging
import os
import pathlib
import re

from packaging.version import Version

from flashinfer_sm120.core.facts.arch import major_minor
from flashinfer_sm120.core.toolkit import memo
from flashinfer_sm120.core.toolkit.fixes import consistent_set_fix
from flashinfer_sm120.core.toolkit.model import Toolkit, VersionDisagreement
from flashinfer_sm120.errors import FormatError
from flashinfer_sm120.safety.formats.reads import field, read_bytes, read_json_file
from flashinfer_sm120.safety.formats.grammar import parse_version
from flashinfer_sm120.safety.formats.base import shown
from flashinfer_sm120.safety.ownership import trust_reason
from flashinfer_sm120.safety.trust import trace

logger = logging.getLogger("flashinfer_sm120")

__all__ = ["NVCC_TIMEOUT_S", "NVCC_MAX_OUTPUT", "inspect", "nvcc_version", "flashinfer_cuda_version"]

#: Seconds ``nvcc --version`` may take (a healthy one answers in ~5 ms; 10 s covers a cold network FS).
NVCC_TIMEOUT_S = 10.0

#: Bytes of ``nvcc --version`` output kept; a real nvcc prints ~250, more is not an nvcc (P6).
NVCC_MAX_OUTPUT = 16 << 10

#: Largest ``version.json`` read; the installer's is about 3 KiB.
MAX_VERSION_FILE_BYTES = 256 << 10

_RELEASE_RE = re.compile(r"release (\d+)\.(\d+), V(\d+\.\d+(?:\.\d+)?)")
#: Blanks within the line only: ``\s`` crossed newlines (quadratic on a header of blank lines, P6).
_CUDART_RE = re.compile(r"^[ \t]*#[ \t]*define[ \t]+CUDART_VERSION[ \t]+([0-9]+)", re.MULTILINE)
_NVCC_DIST_RE = re.compile(r"^nvidia_cuda_nvcc(?:_cu\d+)?-(\d+(?:\.\d+)+)[^/]*\.dist-info$")
_INCLUDES = ("include", "targets/x86_64-linux/include", "targets/sbsa-linux/include")
_LIBS = ("lib64", "lib", "targets/x86_64-linux/lib", "targets/sbsa-linux/lib",
         "lib/x86_64-linux-gnu", "lib/aarch64-linux-gnu")  # the last two: Debian's /usr

_WORKING = "or set CUDA_HOME to a working toolkit"
_LATER = f"(not retried for {memo.FAILURE_MEMORY_S / 60:g} min)"
_NOT_NVCC = f"it is not a working nvcc: fix or remove it, {_WORKING} {_LATER}"
#: The fix for a candidate without a usable nvcc, by the source it came from.
_NO_NVCC_FIX = {
    "CUDA_HOME": "unset CUDA_HOME or point it at a toolkit prefix (the directory above bin/nvcc)",
    "CUDA_PATH": "unset CUDA_PATH or point it at a toolkit prefix (the directory above bin/nvcc)",
    "conda": "install nvcc into the conda environment (conda install cuda-nvcc) or deactivate it",
    "PATH": ("the nvcc on PATH ({given}) does not sit in a toolkit's bin/ directory; put the toolkit's "
             "bin/ directory on PATH instead, or remove {given} from PATH"),
}
_OTHER_FIX = "reinstall the toolkit, or set CUDA_HOME to a complete one"


def _head(path: str, limit: int) -> str | None:
    try:
        return read_bytes(path, limit, prefix=True).decode("utf-8", "replace")
    except FormatError:
        return None


def _version_json(path: str) -> Version | None:
    """``cuda_nvcc.version`` (else ``cuda.version``) of ``version.json``; ``None`` when absent or unusable."""
    if not os.path.lexists(path):
        return None
    fix = "the next version source is used; reinstall the toolkit to repair it"
    try:
        data = read_json_file(path, MAX_VERSION_FILE_BYTES, fix=fix)
        for key in ("cuda_nvcc", "cuda"):
            part = field(data, key, dict, path, default=None, fix=fix)
            if part is not None and "version" in part:
                return parse_version(field(part, "version", str, f"{path} {key}", fix=fix),
                                             f"{path} {key}.version", fix=fix)
    except FormatError as exc:
        logger.info("flashinfer-sm120: %s", exc)
    return None


def _version_from_files(root: str) -> tuple[Version, str] | None:
    """(version, file) from ``version.json``, else the nvcc wheel's ``dist-info`` whose ``RECORD`` lists ``<root>/bin/nvcc``."""
    vj = os.path.join(root, "version.json")
    ver = _version_json(vj)
    if ver is not None:
        return ver, vj
    site_dir = os.path.dirname(os.path.dirname(root))
    try:
        names = sorted(os.listdir(site_dir), reverse=True)
    except OSError:
        return None
    for m in filter(None, map(_NVCC_DIST_RE.match, names)):
        dist = os.path.join(site_dir, m.group(0))
        try:
            if _wheel_owns(dist, root):
                return parse_version(m.group(1), dist), dist
        except FormatError:
            continue
    return None


def _wheel_owns(dist_info: str, root: str) -> bool:
    rel = pathlib.PurePosixPath(os.path.relpath(os.path.join(root, "bin", "nvcc"), os.path.dirname(dist_info)))
    try:
        files = importlib.metadata.PathDistribution(pathlib.Path(dist_info)).files or []
    except Exception:  # a malformed RECORD: not proof of ownership
        return False
    return any(pathlib.PurePosixPath(str(f)) == rel for f in files)


def nvcc_version(nvcc: str, timeout: float = NVCC_TIMEOUT_S) -> tuple[str | None, str | None, bool]:
    """``(full, problem, local)`` of ``nvcc --version``, probed by one process while others wait on the
    memo (P6); ``local``: failed for this process's own reasons (not remembered).  Trust is checked first."""
    return memo.probe_once(nvcc, lambda: _run_nvcc_version(nvcc, timeout), lock_timeout=timeout + 5.0)


def _run_nvcc_version(nvcc: str, timeout: float) -> tuple[str | None, str | None, bool]:
    """``(full, problem, remember)`` of one bounded run (a memo miss only: safety.proc loads only then)."""
    from flashinfer_sm120.safety import proc

    res = proc.run([nvcc, "--version"], timeout=timeout, max_output=NVCC_MAX_OUTPUT)
    if res.errno == errno.E2BIG:
        return None, (f"{res.error}: this process's environment is too large for any program to start, "
                      f"not a fault of {nvcc}; shorten or unset the longest variable, then retry (not remembered)"), False
    if res.local:
        return None, (f"{res.error}: this process ran out of a resource of its own (processes, open "
                      f"files or memory), not a fault of {nvcc}; raise the limit (ulimit -u / -n) or "
                      f"free memory, then retry (not remembered)"), False
    if res.error:
        return None, f"{res.error}; fix it {_WORKING}", True
    if res.timed_out:
        return None, (f"{nvcc} did not answer 'nvcc --version' within {timeout:g} s; it is hung or broken: "
                      f"fix or remove it, {_WORKING} {_LATER}"), True
    if res.truncated:
        return None, f"{nvcc} --version printed more than {NVCC_MAX_OUTPUT} bytes and was stopped; {_NOT_NVCC}", True
    out = res.text()
    m = _RELEASE_RE.search(out)
    try:
        return str(parse_version(m.group(3), f"{nvcc} --version")), None, True
    except (AttributeError, FormatError):  # no release line, or not a version
        lines = out.strip().splitlines()
        first = f"first line: {shown(lines[0], 120)}" if lines else "no output"
        return None, (f"{nvcc} --version printed no 'release X.Y, VX.Y.Z' line (exit {res.returncode}, "
                      f"{first}); it is not a working nvcc: fix it {_WORKING}"), True


def _header_version(include_dirs: tuple[str, ...]) -> Version | None:
    for inc in include_dirs:
        # CUDART_VERSION sits near the top (line ~140 of a 600 KB header): 64 KiB is enough
        m = _CUDART_RE.search(_head(os.path.join(inc, "cuda_runtime_api.h"), 64 << 10) or "")
        if m:
            n = int(m.group(1))  # 12080 -> 12.8, 13000 -> 13.0
            return Version(f"{n // 1000}.{(n % 1000) // 10}")
    return None


def _lib_dir(root: str) -> str | None:
    for rel in _LIBS:
        try:
            if any(n.startswith("libcudart.so") for n in os.listdir(os.path.join(root, rel))):
                return os.path.join(root, rel)
        except OSError:
            continue
    return None


def _untrusted(kind: str, why: str) -> str:
    return (f"not {kind}: {why}. flashinfer-sm120 runs and adopts only files that root or you own, "
            f"in directories nobody else can write; fix the ownership/mode, or set CUDA_HOME to a "
            f"toolkit that qualifies")


def inspect(root: str, sources: tuple[str, ...] = ("given",), given_as: str | None = None,
            *, timeout: float = NVCC_TIMEOUT_S) -> Toolkit:
    """One toolkit's facts; ``problem`` says why it is unusable.  ``bin/nvcc`` is traced through links and
    wrappers without running it, and nothing runs when anything on the way, or an include/lib
    directory, fails the trust rule (P2).  ``sources[0]`` picks the fix, ``given_as`` names the path."""
    given = given_as or root
    base = dict(sources=tuple(sources), given_as=given_as)
    fix = _NO_NVCC_FIX.get(sources[0] if sources else "given", _OTHER_FIX).format(given=given)
    if not os.path.isdir(root):
        return Toolkit(root=root, **base, problem=f"{given}: directory does not exist; {fix}")
    real_root = os.path.realpath(root)
    incs = tuple(os.path.join(real_root, r) for r in _INCLUDES
                 if os.path.isfile(os.path.join(real_root, r, "cuda_runtime_api.h")))
    lib = _lib_dir(real_root)
    hv = _header_version(incs)
    base.update(root=real_root, header_version=hv, include_dirs=incs, lib_dir=lib)
    link = os.path.join(root, "bin", "nvcc")
    if not os.path.isfile(link) or not os.access(link, os.X_OK):
        return Toolkit(**base, problem=f"{given}: no executable bin/nvcc; {fix}")
    tr = trace(link)
    if tr.problem or not tr.target:
        return Toolkit(nvcc=tr.target or "", **base, problem=_untrusted("run", tr.problem or "?"))
    nvcc = tr.target
    for d in incs + ((lib,) if lib else ()):
        why = trust_reason(d, absent_ok=False)
        if why:
            return Toolkit(nvcc=nvcc, **base, problem=_untrusted("adopted", why))
    found = _version_from_files(real_root)
    if not found and os.path.dirname(os.path.dirname(nvcc)) != real_root:  # the toolkit a wrapper leads to
        found = _version_from_files(os.path.dirname(os.path.dirname(nvcc)))
    # P1: the binary decides; when it cannot be run (even for this process's own reasons) the
    # toolkit is refused with that message, never given the version of a file beside it
    full, problem, _local = nvcc_version(nvcc, timeout)
    source, disagreement = ("nvcc --version" if full else None), None
    if found and full:
        if str(found[0]) == full:  # formatted from the parsed Version, never the raw text
            source = found[1]
        else:
            disagreement = VersionDisagreement(found[1], str(found[0]), nvcc, full)
    nv = major_minor(full) if full else None
    pip = "pip" in sources or f"{os.sep}site-packages{os.sep}nvidia{os.sep}" in real_root + os.sep
    if nv and hv and nv != hv:
        problem = (f"nvcc {nv} with CUDA headers {hv} (CUDART_VERSION in {incs[0]}/cuda_runtime_api.h): "
                   f"CCCL stops with #error when they differ; install one consistent set: "
                   f"{consistent_set_fix(nv, pip)}")
    if nv and not incs and problem is None:
        problem = (f"{real_root}: no include/cuda_runtime_api.h; the toolkit is incomplete: "
                   f"{consistent_set_fix(nv, pip)}")
    return Toolkit(nvcc=nvcc, nvcc_version=nv, nvcc_full=full, version_from=source, problem=problem,
                   disagreement=disagreement, **base)


def flashinfer_cuda_version(cuda_path: str) -> Version:
    """FlashInfer's ``get_cuda_version`` (0.7.x ``jit/cpp_ext.py``) for an unpatched process, through the
    trust rule and the bounded run: FlashInfer's ``check_output`` has no deadline (P6).  Raises
    ``RuntimeError`` as FlashInfer does when neither nvcc nor torch answers."""
    nvcc = os.path.join(cuda_path, "bin", "nvcc")
    problem = trace(nvcc).problem
    full, problem, _local = (None, problem, False) if problem else nvcc_version(nvcc)
    if full:
        return Version(".".join(full.split(".")[:2]))
    import torch

    if torch.version.cuda is None:
        raise RuntimeError(f"nvcc not usable ({problem}) and PyTorch is not built with CUDA support. "
                           f"Could not determine CUDA version.")
    return Version(torch.version.cuda)
