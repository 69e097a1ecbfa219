"""``flashinfer-sm120 status``: one line, what :func:`flashinfer_sm120.status` says once FlashInfer
is imported: the mode, the toolkit FlashInfer builds with, and the targets."""

from __future__ import annotations

import argparse
import json
import sys

__all__ = ["add_parser", "run_status", "status_line"]

#: Exit status per mode: 0 where FlashInfer builds with a toolkit that fits.
_OK = ("patched", "noop")


def status_line(st: dict) -> str:
    """``<mode>: nvcc <release> at <toolkit>; targets <sm_...>`` (or why there is no toolkit)."""
    mode = st.get("mode")
    tk = (((st.get("resolution") or {}).get("choice") or {}).get("toolkit")) or {}
    targets = ", ".join(st.get("target_cuda_archs") or []) or _no_targets(st.get("resolution") or {})
    if mode in _OK and tk:
        return f"{mode}: nvcc {tk.get('nvcc_full')} at {tk.get('root')}; targets {targets}"
    if mode == "guard":
        return ("guard: no CUDA toolkit fits, FlashInfer's JIT builds will raise the fix "
                "('flashinfer-sm120 doctor' shows what was found)")
    if mode == "disabled":
        return "disabled: FLASHINFER_SM120_DISABLE is set; FlashInfer uses its own toolkit choice"
    return f"{mode}: {st.get('error') or st.get('summary') or 'see flashinfer-sm120 doctor'}"


def _no_targets(res: dict) -> str:
    """Why there are no targets: a set but unusable ``FLASHINFER_CUDA_ARCH_LIST``, or nothing at all."""
    if res.get("arch_list_error"):
        return f"none ({res['arch_list_error']})"
    return "none (no GPU visible and no FLASHINFER_CUDA_ARCH_LIST; e.g. FLASHINFER_CUDA_ARCH_LIST=12.0)"


def run_status(args: argparse.Namespace) -> int:
    import os

    os.environ.setdefault("FLASHINFER_SM120_QUIET", "1")  # the line below says it
    from ..workspace import workspace_foreign_tree

    foreign = workspace_foreign_tree()  # threat-model: P4: FlashInfer's import would create it there
    if foreign is not None:
        from ..statedir import foreign_tree_message

        return _say(args, {"mode": "refused", "error": "FlashInfer was not imported: " + foreign_tree_message(
            "FlashInfer's JIT cache", foreign, "FLASHINFER_WORKSPACE_BASE")})
    import flashinfer_sm120 as shim

    try:
        import flashinfer.jit.core  # noqa: F401  (patching happens on this import)
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] == "flashinfer":
            return _say(args, {"mode": "not installed", "error": f"FlashInfer is not installed for "
                               f"{sys.executable}: pip install flashinfer-python"})
        from ..reinstall import DEPENDENCIES

        if (exc.name or "").partition(".")[0] in DEPENDENCIES:  # ours: the CLI names the fix
            raise
        return _failed(args, shim, exc)  # one of FlashInfer's (torch, numpy): still a status
    except Exception as exc:  # FlashInfer's own import failed: say why, and what we did before it
        return _failed(args, shim, exc)
    return _say(args, shim.status())


def _failed(args: argparse.Namespace, shim, exc: BaseException) -> int:
    """Mode ``failed``: FlashInfer's import raised ``exc``; what we did before it, and why."""
    from ..workspace import import_failure

    st = dict(shim.status())
    st["mode"], st["error"] = "failed", import_failure(exc, st)
    return _say(args, st)


def _say(args: argparse.Namespace, st: dict) -> int:
    """Print ``st`` as one line, or as JSON with ``--json``; the exit status of its mode."""
    print(json.dumps(st, indent=2, default=str) if args.json else status_line(st))
    return 0 if st.get("mode") in _OK else 1


def add_parser(sub) -> None:
    """Register ``status``."""
    s = sub.add_parser("status", help="one line: mode, toolkit and targets (flashinfer_sm120.status())",
                       description="Import FlashInfer with flashinfer-sm120 and print one line: the mode, "
                       "the nvcc FlashInfer builds with, and the targets. Exit status 0 when patched or "
                       "already right (noop), 1 otherwise.")
    s.add_argument("--json", action="store_true", help="print flashinfer_sm120.status() as JSON")
    s.set_defaults(func=run_status)
