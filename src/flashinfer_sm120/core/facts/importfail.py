"""Why FlashInfer's own import failed, and the fix: no toolkit fits, a missing dependency of FlashInfer, or a
JIT workspace it cannot make (asked only after the import failed)."""

from __future__ import annotations

import os
import pathlib
import stat
import sys

from flashinfer_sm120.core.facts.workspace import workspace_path
from flashinfer_sm120.safety.formats.base import shown


def workspace_problem(failed: OSError | None = None) -> str | None:
    """Why FlashInfer cannot create its JIT workspace at import; creates nothing (P4).  ``failed``, the import's
    error, decides where ``access()`` cannot (root "may write" ``/proc``)."""
    try:
        pathlib.Path.home()
    except (RuntimeError, KeyError, OSError):  # '~' cannot be expanded
        return (f"FlashInfer needs a home directory at import (it reads Path.home() even when "
                f"FLASHINFER_WORKSPACE_BASE is set), and this process has none (HOME is unset and uid "
                f"{os.getuid()} has no passwd entry); FlashInfer fails the same way without "
                f"flashinfer-sm120. Fix: HOME=<a directory you can write> (and FLASHINFER_WORKSPACE_BASE "
                f"to keep the JIT cache elsewhere)")
    path, how = workspace_path()
    here, why = path, None
    while True:
        try:
            st = os.stat(here)
        except FileNotFoundError:
            parent = os.path.dirname(here.rstrip("/")) or "."
            if parent == here:
                break
            here = parent
            continue
        except OSError as exc:
            why = exc.strerror
            break
        if not stat.S_ISDIR(st.st_mode):
            why = f"{shown(here, 200)} is not a directory"
        elif not os.access(here, os.W_OK | os.X_OK):
            why = f"{shown(here, 200)} is not writable"
        break
    name = getattr(failed, "filename", None)
    if why is None and isinstance(name, str) and (path == name or path.startswith(name.rstrip("/") + "/")):
        why = f"{shown(name, 200)}: {failed.strerror or failed}"
    if why is None:
        return None
    return (f"FlashInfer keeps its JIT cache in {shown(path, 200)} (from {how}), which cannot be "
            f"created ({why}); FlashInfer fails the same way without flashinfer-sm120. "
            f"Fix: FLASHINFER_WORKSPACE_BASE=<a directory you can write>")


def import_failure(exc: BaseException, st: dict) -> str:
    """``importing FlashInfer failed: <exc>``, with the fix where known: no toolkit, a missing module, the workspace."""
    shown_exc = f"{type(exc).__name__}: {exc}" if isinstance(exc, OSError) and exc.filename else repr(exc)
    msg = f"importing FlashInfer failed: {shown_exc[:2000]}"  # an OSError's repr drops its path (str: repr of it)
    fix = ((st.get("resolution") or {}).get("fix")) if isinstance(st.get("resolution"), dict) else None
    if st.get("mode") == "guard" or (st.get("mode") == "failed" and fix):
        return (f"{msg}. No CUDA toolkit fits, so FlashInfer kept its own toolkit lookup, which raised "
                f"this{f'. Fix: {fix}' if fix else ' (see the message above)'}")
    missing = getattr(exc, "name", None) if isinstance(exc, ModuleNotFoundError) else None
    if isinstance(missing, str) and missing:  # one of FlashInfer's dependencies (torch, numpy)
        top = missing.partition(".")[0]
        how = f"pip install {top}, or the package that provides it" if top.isidentifier() and len(top) < 80 else \
            "the package that provides it"
        return (f"{msg}. FlashInfer needs the module {shown(top, 80)}, which this Python "
                f"({shown(sys.executable, 200)}) cannot import. Fix: install it there ({how})")
    problem = workspace_problem(exc if isinstance(exc, OSError) else None) \
        if isinstance(exc, (OSError, RuntimeError, KeyError)) else None
    return f"{msg}. {problem}" if problem else msg
