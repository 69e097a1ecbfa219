"""Why a command of ours must not import FlashInfer here, or why FlashInfer's own import failed, each with the
fix (P4, P8); creates nothing."""

from __future__ import annotations

import dataclasses
import errno
import os
import pathlib
import stat
import sys
import tempfile

from flashinfer_sm120.core.facts.workspace import CUTE_FIX, WSB, code_dirs_refused, cute_cache, workspace_path
from flashinfer_sm120.safety.fs.places import foreign_tree, foreign_tree_parts
from flashinfer_sm120.safety.ownership import deepest_existing
from flashinfer_sm120.safety.formats.base import shown


@dataclasses.dataclass(frozen=True)
class ImportRefusal:
    """Why a command of ours does not import FlashInfer here: ``code`` (a doctor finding's), ``text``, ``fix``."""

    code: str
    text: str
    fix: str

    def __str__(self) -> str:
        return f"FlashInfer was not imported: {self.text}. Fix: {self.fix}"


def _others_may_write(path: str) -> bool:
    from flashinfer_sm120.safety.ownership import writable_by_others

    try:
        return writable_by_others(os.stat(path))
    except OSError:
        return True


def import_refused(env=None) -> ImportRefusal | None:
    """Why our commands must not import FlashInfer here (P4): it would create files where they are not ours."""
    from flashinfer_sm120.safety.compilers import temp_problem
    from flashinfer_sm120.safety.ownership import own_place_fix, trust_reason

    path, how = workspace_path()
    home = os.path.dirname(os.path.dirname(path))
    if how == "the home directory" and os.environ.get("HOME") == "":
        return ImportRefusal("workspace-no-home", f"HOME is set but empty, so FlashInfer would keep its JIT cache in "
                             f"{shown(path, 200)}, at the root of the file system",
                             f"set HOME to your home directory, or {WSB} to a directory of your own")
    if how == "the home directory" and not os.path.isdir(home):
        return ImportRefusal("workspace-no-home", f"its JIT cache {shown(path, 200)} lies in the home directory "
                             f"{shown(home, 200)}, which does not exist, and FlashInfer's import would create it",
                             f"set {WSB} to a directory of your own, or HOME to an existing one")
    why = trust_reason(path)
    ft = foreign_tree(path)
    # root about to make its cache in a user's tree no one else may write (sudo -E); otherwise
    # (another uid's directory anyone may write, a non-root user) the place rule's own reason
    if ft is not None and (why is None or (os.geteuid() == 0 and not _others_may_write(ft.top))):
        why, fix = foreign_tree_parts(ft, WSB)
        return ImportRefusal("workspace-foreign-tree", f"its JIT cache {shown(path, 200)} does not exist, and {why}",
                             fix)
    if why:
        return ImportRefusal("workspace-not-ours", f"its JIT cache {shown(path, 200)} is not a place of yours: {why}",
                             own_place_fix())
    env = os.environ if env is None else env
    temp = temp_problem(env)
    if temp is not None:
        return ImportRefusal("temp-not-ours", f"it and its dependencies write into {temp.what} {temp.path}, "
                             f"which fails the trust rule: {temp.why}", temp.fix)
    dsl = cute_cache(env)
    why = dsl and trust_reason(dsl[2])
    if why:
        return ImportRefusal("temp-not-ours", f"its CuTe DSL dependency keeps the code it compiles in "
                             f"{shown(dsl[2], 200)}, which fails the trust rule: {why}", CUTE_FIX)
    here = deepest_existing(path)
    if here != path:  # status and doctor keep FlashInfer's import out of it (P4): will its own import make it?
        missing = os.path.join(here, os.path.relpath(path, here).split(os.sep)[0])
        try:  # access() cannot tell (root "may write" /proc); a random name, removed: nothing stays
            os.rmdir(tempfile.mkdtemp(dir=here))
        except OSError as exc:
            return ImportRefusal("workspace-cannot-be-made", f"its JIT cache {shown(path, 200)} (from {how}) cannot "
                                 f"be created ({shown(missing, 200)}: {exc.strerror}); FlashInfer fails the same way "
                                 f"without flashinfer-sm120", f"{WSB}=<a directory you can write>")
    return None


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
    here, why = deepest_existing(path), None
    try:
        st = os.stat(here)
        if not stat.S_ISDIR(st.st_mode):
            why = f"{shown(here, 200)} is not a directory"
        elif not os.access(here, os.W_OK | os.X_OK):
            why = f"{shown(here, 200)} is not writable"
        elif (vfs := os.statvfs(here)).f_bavail == 0 or (vfs.f_files > 0 and vfs.f_favail == 0):
            from flashinfer_sm120.safety import oserrors

            why = oserrors.describe(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), here).message
    except OSError as exc:
        why = exc.strerror
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
    from flashinfer_sm120.safety import oserrors

    if isinstance(exc, OSError):  # a limit or a full disk is not FlashInfer's fault (P8)
        why = oserrors.describe(exc, elsewhere=f"set {WSB} to another directory (FlashInfer's JIT cache)")
        if why.kind in ("limit", "space"):
            return f"{msg}. {why}"
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


def builds_refused(jit_dir: str, env=None) -> str | None:
    """Why every JIT build in ``jit_dir`` would be refused before nvcc runs (``build``, ``status``; P2, P8)."""
    from flashinfer_sm120.safety.compilers import path_problem

    problem = code_dirs_refused(jit_dir, env) or path_problem(os.environ if env is None else env)
    return str(problem) if problem else None
