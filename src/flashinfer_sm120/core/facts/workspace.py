"""Why FlashInfer's own import failed, and the fix: no toolkit fits, a missing dependency of
FlashInfer, or a JIT workspace it cannot make (asked only after the import failed).

FlashInfer 0.7.4 ``jit/env.py`` computes ``$FLASHINFER_WORKSPACE_BASE`` (else ``Path.home()``, which it
evaluates either way) ``/.cache/flashinfer`` at import and creates it.  Nothing here creates anything;
:func:`import_refused` says, before a command of ours imports FlashInfer, why that import must not
run here (it would write into another uid's tree, or into a temporary directory that is not ours).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import pathlib
import stat
import sys
from typing import TYPE_CHECKING

from flashinfer_sm120.safety.formats import foreign_tree, shown

if TYPE_CHECKING:
    from flashinfer_sm120.safety.ownership import PlaceProblem

__all__ = ["import_failure", "tag_for", "workspace_problem", "workspace_base", "workspace_path", "jit_dir_refused", "ImportRefusal", "import_refused",
           "normalize_base"]

_WSB = "FLASHINFER_WORKSPACE_BASE"


def normalize_base() -> str | None:
    """Make ``FLASHINFER_WORKSPACE_BASE=`` (set but empty) mean unset, as most tools treat an empty
    variable, before FlashInfer's ``jit/env.py`` reads it: FlashInfer 0.7.4 takes
    ``os.getenv("FLASHINFER_WORKSPACE_BASE", home)``, gets ``""``, and ``Path("")`` is the working
    directory, so its ``.cache/flashinfer`` and ``flashinfer_jit.log`` were written wherever the
    process ran (a checkout, a server's working directory).  Called by :func:`flashinfer_sm120.install`,
    which runs before FlashInfer's import completes.  Returns a warning for a relative value (it
    depends on the working directory the same way), else ``None``.  threat-model: P4"""
    value = os.environ.get(_WSB)
    if value is not None and not value.strip():
        del os.environ[_WSB]
        return None
    if value is not None and not os.path.isabs(value):
        return (f"{_WSB}={shown(value, 200)} is a relative path: FlashInfer keeps its JIT cache under the "
                f"working directory, a different one wherever a process starts. Fix: give an absolute path "
                f"(export {_WSB}=$PWD/{shown(value, 200)}), or unset it for ~/.cache/flashinfer")
    return None


def workspace_base(env=None) -> tuple[str, str]:
    """``(base, where from)``: FlashInfer's workspace base in ``env`` (default ``os.environ``) as
    FlashInfer 0.7.4 ``jit/env.py`` reads it: ``$FLASHINFER_WORKSPACE_BASE`` (empty or blank is unset,
    :func:`normalize_base`), else the home directory (``HOME`` of ``env``, else the passwd entry's,
    else ``/``: never a relative ``~``).  The one reader of the variable."""
    from flashinfer_sm120.safety.fs.statedir import home_dir

    env = os.environ if env is None else env
    value = env.get(_WSB) or ""
    if value.strip():
        return value, _WSB
    return env.get("HOME") or home_dir() or "/", "the home directory"


def workspace_path() -> tuple[str, str]:
    """``(path, where from)`` of FlashInfer's JIT cache as FlashInfer 0.7.4 ``jit/env.py`` computes it
    at import: ``<workspace base>/.cache/flashinfer`` (:func:`workspace_base`)."""
    base, how = workspace_base()
    return os.path.join(base, ".cache", "flashinfer"), how


@dataclasses.dataclass(frozen=True)
class ImportRefusal:
    """Why a command of ours does not import FlashInfer here: ``code`` (a doctor finding's code),
    ``text`` and ``fix`` (alone)."""

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
    """Why a command of ours (``status``, ``build``, ``cache``, ``doctor``) must not import FlashInfer
    here, else ``None``; creates nothing (threat-model: P4).  FlashInfer's import makes its JIT cache
    (:func:`workspace_path`) and opens ``flashinfer_jit.log`` in it, and its dependencies write into
    the temporary directory, so the import is refused when

    0. it would create the home directory itself (``HOME=/nonexistent``: root made ``/nonexistent``);
    1. the cache would be created inside a tree another uid owns (root with a user's ``HOME``,
       ``sudo -E``: the user's own tools then cannot write ``~/.cache``);
    2. a level of it that exists is another uid's to change, or not ours (the same, with the user's
       cache already there: a root-owned log was left in it);
    3. the temporary directory is another uid's to change."""
    from flashinfer_sm120.safety.buildenv import temp_problem
    from flashinfer_sm120.safety.ownership import own_place_fix, trust_reason

    path, how = workspace_path()
    home = os.path.dirname(os.path.dirname(path))
    if how == "the home directory" and not os.path.isdir(home):  # HOME=/nonexistent (a service account)
        return ImportRefusal("workspace-no-home", f"its JIT cache {shown(path, 200)} lies in the home directory "
                             f"{shown(home, 200)}, which does not exist, and FlashInfer's import would create it",
                             f"set {_WSB} to a directory of your own, or HOME to an existing one")
    why = trust_reason(path)
    ft = foreign_tree(path)
    # the sudo -E case: root about to make its cache in a user's tree no one else may write; otherwise
    # (another uid's directory anyone may write, a non-root user) the place rule's own reason (round 6, F2)
    if ft is not None and (why is None or (os.geteuid() == 0 and not _others_may_write(ft.top))):
        return ImportRefusal("workspace-foreign-tree",
                             f"its JIT cache {shown(path, 200)} would be created inside {ft.top}, owned by uid "
                             f"{ft.owner}, as uid {ft.uid}, and that user's own tools could not write it",
                             f"run as uid {ft.owner} (sudo -u), keep your own home (sudo -H instead of sudo -E), "
                             f"or set {_WSB} to a directory of your own")
    if why:
        return ImportRefusal("workspace-not-ours", f"its JIT cache {shown(path, 200)} is not a place of yours: {why}",
                             own_place_fix())
    temp = temp_problem(os.environ if env is None else env)
    if temp is not None:
        return ImportRefusal("temp-not-ours", f"it and its dependencies write into {temp.role} {temp.program} "
                             f"({temp.found}), which fails the trust rule: {temp.why}", temp.fix)
    return None


def workspace_problem(failed: OSError | None = None) -> str | None:
    """Why FlashInfer cannot create its JIT workspace (``$FLASHINFER_WORKSPACE_BASE``, else the home
    directory, then ``.cache/flashinfer``: FlashInfer 0.7.4 ``jit/env.py``, made at its import), which
    fails its import with or without flashinfer-sm120; else ``None``.

    Nothing is created: the deepest existing level must be a directory this process may write.
    (It used ``os.makedirs``: with no home directory, a uid without a passwd entry and ``HOME``
    unset, ``~`` stayed ``~`` and ``./~/.cache/flashinfer`` was made in the working directory.)
    FlashInfer 0.7.4 computes ``Path.home()`` even when ``FLASHINFER_WORKSPACE_BASE`` is set, so no
    home is a problem of its own, fixed by ``HOME``.  ``failed``: the error FlashInfer's import raised,
    which decides when the walk cannot (root "may write" ``/proc`` by ``access()``; ``mkdir`` there fails)."""
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
    """``importing FlashInfer failed: <exc>``, ending with the fix where one is known: no toolkit
    fits (FlashInfer's own lookup, kept under the guard, raised), or its workspace is not writable."""
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


def tag_for(tk) -> str:
    """The directory FlashInfer's JIT workspace gets for toolkit ``tk`` under flashinfer-sm120
    (``nvcc<version>-<hash of nvcc's path and versions>``): the patch names the current one with it
    (:func:`flashinfer_sm120.core.patch.steps.workspace_tag`), ``cache prune`` checks old ones."""
    key = "\0".join((os.path.realpath(tk.nvcc), str(tk.nvcc_full), str(tk.header_version)))
    return f"nvcc{tk.nvcc_full or tk.nvcc_version}-{hashlib.sha256(key.encode()).hexdigest()[:8]}"


def builds_refused(jit_dir: str, env=None) -> str | None:
    """Why every FlashInfer JIT build with the JIT directory ``jit_dir`` would be refused before nvcc
    runs, else ``None``: its path breaks the path rule, a level of it (its lock level ``tmp``
    included) is another uid's to change, or a program every build runs by name, or the temporary
    directory, fails the trust rule.  The one list ``build`` refuses by and ``status`` reports
    (threat-model: P2, P8).  Creates nothing."""
    from flashinfer_sm120.safety.buildenv import path_problem

    problem = jit_dir_refused(jit_dir) or path_problem(os.environ if env is None else env)
    return str(problem) if problem else None


def jit_dir_refused(jit_dir: str) -> str | PlaceProblem | None:
    """Why FlashInfer's JIT directory ``jit_dir`` is no place to build in, else ``None``: its path
    breaks the path rule, or a level of it, its lock level ``tmp`` included, fails the ownership rule
    (:func:`flashinfer_sm120.safety.ownership.check_place`; threat-model: P2, P4).  The one check of
    it, for the patch's warning and for :func:`builds_refused`.  Creates nothing."""
    from flashinfer_sm120.safety.formats.paths import jit_dir_problem
    from flashinfer_sm120.safety.ownership import check_place

    return jit_dir_problem(jit_dir) or check_place(os.path.join(jit_dir, "tmp"), "FlashInfer's JIT directory")
