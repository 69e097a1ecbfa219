"""Read a toolkit's facts: its version is what its nvcc says (P1; :func:`.memo.version_of`), its include and
library directories pass the trust rule (P2)."""

from __future__ import annotations

import importlib.metadata
import glob
import logging
import os
import pathlib
import re

from packaging.version import Version

from flashinfer_sm120.core.facts.arch import major_minor
from flashinfer_sm120.core.toolkit.fixes import consistent_set_fix
from flashinfer_sm120.core.toolkit.memo import version_of
from flashinfer_sm120.core.toolkit.model import Toolkit, VersionDisagreement
from flashinfer_sm120.errors import FormatError
from flashinfer_sm120.safety.formats.grammar import parse_version
from flashinfer_sm120.safety.formats.reads import read_bytes, read_json_file
from flashinfer_sm120.safety.formats.fields import field
from flashinfer_sm120.safety.ownership import trust_reason
from flashinfer_sm120.safety.trust import trace

logger = logging.getLogger("flashinfer_sm120")

#: Seconds ``nvcc --version`` may take (a healthy one answers in ~5 ms; 10 s covers a cold network FS).
NVCC_TIMEOUT_S = 10.0
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
#: The fix for a candidate without a usable nvcc, by the source it came from.
NO_NVCC_FIX = {
    "FLASHINFER_NVCC": "unset FLASHINFER_NVCC or set it to the bin/nvcc of a toolkit",
    "CUDA_HOME": "unset CUDA_HOME or point it at a toolkit prefix (the directory above bin/nvcc)",
    "CUDA_PATH": "unset CUDA_PATH or point it at a toolkit prefix (the directory above bin/nvcc)",
    "conda": "install nvcc into the conda environment (conda install cuda-nvcc) or deactivate it",
    "PATH": ("the nvcc on PATH ({given}) does not sit in a toolkit's bin/ directory; put the toolkit's "
             "bin/ directory on PATH instead, or remove {given} from PATH"),
}
_OTHER_FIX = "reinstall the toolkit, or set CUDA_HOME to a complete one"


def nvcc_version(nvcc: str, timeout: float = NVCC_TIMEOUT_S) -> tuple[str | None, str | None]:
    """``(full, problem)`` of ``nvcc --version`` (:func:`version_of`); trust is checked by the caller."""
    return version_of(nvcc, lambda out: str(parse_version(_RELEASE_RE.search(out).group(3), "nvcc --version")),
                      name="nvcc", fix=_WORKING, timeout=timeout)


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
    """(version, file) from ``version.json``, else the nvcc wheel's ``dist-info`` whose ``RECORD`` lists its nvcc."""
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


def _header_version(include_dirs: tuple[str, ...]) -> Version | None:
    for inc in include_dirs:
        try:  # CUDART_VERSION sits near the top (line ~140 of a 600 KB header): 64 KiB is enough
            m = _CUDART_RE.search(read_bytes(os.path.join(inc, "cuda_runtime_api.h"), 64 << 10, prefix=True).decode(
                "utf-8", "replace"))
        except FormatError:
            continue
        if m:
            n = int(m.group(1))  # 12080 -> 12.8, 13000 -> 13.0
            return Version(f"{n // 1000}.{(n % 1000) // 10}")
    return None


def _untrusted(kind: str, why: str) -> str:
    return (f"not {kind}: {why}. flashinfer-sm120 runs and adopts only files that root or you own, "
            f"in directories nobody else can write; fix the ownership/mode, or set CUDA_HOME to a "
            f"toolkit that qualifies")


def inspect(root: str, sources: tuple[str, ...] = ("given",), given_as: str | None = None,
            *, timeout: float = NVCC_TIMEOUT_S) -> Toolkit:
    """One toolkit's facts, ``problem`` why it is unusable; ``bin/nvcc`` is traced through links and wrappers and
    nothing runs when anything on the way, or an include/lib directory, fails the trust rule (P2)."""
    given = given_as or root
    base = dict(sources=tuple(sources), given_as=given_as)
    fix = NO_NVCC_FIX.get(sources[0] if sources else "given", _OTHER_FIX).format(given=given)
    if not os.path.isdir(root):
        return Toolkit(root=root, **base, problem=f"{given}: directory does not exist; {fix}")
    real_root = os.path.realpath(root)
    incs = tuple(os.path.join(real_root, r) for r in _INCLUDES
                 if os.path.isfile(os.path.join(real_root, r, "cuda_runtime_api.h")))
    lib = next((os.path.join(real_root, rel) for rel in _LIBS
                if glob.glob(os.path.join(glob.escape(real_root), rel, "libcudart.so*"))), None)
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
    full, problem = nvcc_version(nvcc, timeout)
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
    """FlashInfer's ``get_cuda_version`` (0.7.x ``jit/cpp_ext.py``, whose ``check_output`` has no deadline) through
    the trust rule and the bounded run (P6); ``RuntimeError`` as FlashInfer's when neither nvcc nor torch answers."""
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
