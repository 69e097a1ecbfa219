"""Set up FlashInfer for a warm-up build and build a list of specs in one pool."""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

from .. import arch as _arch
from ..errors import Sm120Error
from . import pool

__all__ = ["BuildError", "Session", "prepare", "write_ninjas", "build_specs"]


class BuildError(Sm120Error):
    """The warm-up build cannot start; the message names the fix."""


@dataclasses.dataclass
class Session:
    """What this process builds with: FlashInfer's version, toolkit and targets."""

    flashinfer: str
    cuda_home: str
    cuda_version: str
    targets: list[str]
    jit_dir: Path
    summary: str

    def fingerprint(self) -> dict:
        """What a JIT cache entry depends on besides its sources: FlashInfer release,
        targets, nvcc release, and the CUDA_HOME and JIT dir paths written into build.ninja."""
        return {"flashinfer": self.flashinfer, "targets": self.targets,
                "cuda_version": self.cuda_version, "cuda_home": self.cuda_home, "jit_dir": str(self.jit_dir)}


def set_arch(value: str | None) -> None:
    """Validate ``--arch`` and export it as ``FLASHINFER_CUDA_ARCH_LIST`` (before FlashInfer loads).

    :raises BuildError: the value is not an arch list (message from :mod:`flashinfer_sm120.arch`)."""
    if value is None:
        return
    try:
        specs = _arch.parse_arch_list(value, source="--arch")
    except _arch.ArchListError as exc:
        raise BuildError(str(exc)) from None
    os.environ["FLASHINFER_CUDA_ARCH_LIST"] = " ".join(f"{s.major}.{s.minor}{s.suffix or ''}" for s in specs)


def prepare(arch: str | None) -> Session:
    """Patch and import FlashInfer for ``arch`` (``--arch``; default: the GPUs present).

    :raises BuildError: bad ``--arch``, shim disabled, FlashInfer unusable, or no targets.
    """
    set_arch(arch)
    os.environ.setdefault("FLASHINFER_SM120_QUIET", "1")  # the summary is printed by the caller
    import flashinfer_sm120 as shim

    shim.install()
    try:
        import flashinfer.jit.core  # noqa: F401
        import flashinfer.jit.cpp_ext as cx
        from flashinfer import __version__ as fi_version
        from flashinfer.jit import env as jit_env
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] != "flashinfer":
            raise BuildError(f"importing FlashInfer failed: {exc!r}") from None
        raise BuildError(f"FlashInfer is not installed for {sys.executable}: pip install flashinfer-python "
                         f"(into the environment of that interpreter)") from None
    except Exception as exc:
        raise BuildError(f"importing FlashInfer failed: {exc!r}") from None
    st = shim.status()
    if st["mode"] == "disabled":
        raise BuildError("FLASHINFER_SM120_DISABLE is set, so FlashInfer would build with its own "
                         "toolkit choice; unset it (or set it to 0) to build with flashinfer-sm120")
    if st["mode"] == "guard":  # the message with the fix was just logged: do not print it twice
        raise BuildError("no toolkit can build the requested targets (FlashInfer is guarded): see the "
                         "message above for what was found and the fix (--arch sets "
                         "FLASHINFER_CUDA_ARCH_LIST, so the fix applies to --arch as well)")
    if st["mode"] not in ("patched", "noop"):
        raise BuildError(f"FlashInfer could not be set up ({st['mode']}): {st['error']}")
    if not st["target_cuda_archs"]:
        raise BuildError("no target architectures: no GPU is visible and no --arch was given; "
                         "pass e.g. --arch 12.0 (RTX 5090 / RTX PRO 6000) or --arch 12.1 (DGX Spark)")
    from flashinfer.jit import core

    targets = sorted(f"{a}.{b}" for a, b in core.current_compilation_context.TARGET_CUDA_ARCHS)
    return Session(str(fi_version), cx.get_cuda_path(), str(cx.get_cuda_version()), targets,
                   Path(jit_env.FLASHINFER_JIT_DIR), st["summary"])


def write_ninjas(specs: list) -> None:
    """FlashInfer's own ``write_ninja`` for each spec, under its per-module lock (as
    ``build_jit_specs`` does), so the file is byte for byte what the server writes."""
    from filelock import FileLock

    for spec in specs:
        with FileLock(str(spec.lock_path), thread_local=False):
            spec.write_ninja()


def build_specs(labelled: list[tuple[str, object]], jobs: int | None, stream=None,
                stats: dict | None = None) -> list[dict]:
    """Write ninja files and build ``labelled`` ``(label, spec)`` pairs in one pool
    (``stats`` as for :func:`pool.run_pool`).

    :returns: one dict per module: label, name, status, library, bytes, seconds, error,
        gencode (raw ``compute_X,code`` pairs) and binary (``SASS sm_X``/``PTX compute_X``).
    """
    stream = stream or sys.stderr
    write_ninjas([s for _, s in labelled])
    job_list = [pool.Job(label, spec.build_dir, spec.ninja_path, spec.lock_path) for label, spec in labelled]
    results = pool.run_pool(job_list, jobs, stream, stats)
    out = []
    for (label, spec), res in zip(labelled, results):
        text = spec.ninja_path.read_text()
        import re

        so = spec.jit_library_path
        out.append({
            "module": label, "name": spec.name, "status": res.status, "library": str(so),
            "bytes": so.stat().st_size if so.exists() and res.status != "failed" else None,
            "seconds": res.seconds, "error": res.error,
            "gencode": sorted({f"{a},{c}" for a, c in re.findall(r"-gencode=arch=(compute_\w+),code=(\w+)", text)}),
            "binary": pool.gencode_summary(text),
        })
    return out
