"""Where flashinfer-sm120 keeps state on disk (CUDA_HOME views, the nvcc memo): one directory
per uid, chosen once per process.

The rules: the cache root is per uid: it must be owned by the current uid and not be
writable by group or others; an absolute path made only of characters that FlashInfer's
unquoted ninja lines (``cuda_home = ...``) and ``/bin/sh`` carry (:mod:`.pathpolicy`);
a root that breaks a rule is refused with a message naming the variable and the fix, and
the next candidate is used; directories it creates (``~/.cache`` included, when absent)
are ``0700`` level by level whatever the umask
(:func:`~flashinfer_sm120.formats.make_private_dirs`).
"""

from __future__ import annotations

import logging
import os
import stat
import tempfile

from .errors import StateFileError
from .formats import bounded, make_private_dirs
from .ownership import writable_by_others
from .pathpolicy import path_problem

logger = logging.getLogger("flashinfer_sm120")

__all__ = ["cache_root", "cache_root_notes", "forget_cache_root", "home_dir"]

_notes: list[str] = []
_EXPLICIT = "$FLASHINFER_SM120_CACHE_DIR"
_root_cache: dict[tuple, str] = {}


def forget_cache_root() -> None:
    """Forget the cache root chosen in this process and the notes about refused candidates
    (the next :func:`cache_root` chooses again: after the environment changed, in tests)."""
    _root_cache.clear()
    _notes.clear()


def _dir_problem(path: str, what: str, create: bool, explicit: bool = True) -> str | None:
    """Ownership/permission check of a cache directory; creates it (0700) if asked.
    A candidate the user did not name (``explicit=False``) must also be writable,
    so that a read-only one falls through to the next; a named one that is not is
    reported where the write fails, naming the variable."""
    uid = os.geteuid()
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        if not create:  # a symlink to nothing: whoever creates the target later would own our state
            return f"{what}={path!r} does not exist; create it (mode 0700) or point the variable elsewhere"
        try:  # every level 0700 whatever the umask: umask 000 must not leave a world-writable ~/.cache
            make_private_dirs(path)
            st = os.lstat(path)
        except OSError as exc:
            return (f"{what}={path!r} cannot be created ({exc.strerror}); set "
                    f"FLASHINFER_SM120_CACHE_DIR to a writable directory")
    except OSError as exc:
        return f"{what}={path!r} cannot be read ({exc.strerror})"
    if stat.S_ISLNK(st.st_mode):
        real = os.path.realpath(path)
        return _dir_problem(real, f"{what} (symlink to {real})", False, explicit) if real != path else (
            f"{what}={path!r} is a symlink loop")
    if not stat.S_ISDIR(st.st_mode):
        return f"{what}={path!r} is not a directory; point it at a directory you own"
    if st.st_uid != uid:
        return (f"{what}={path!r} is owned by uid {st.st_uid}, not you (uid {uid}): another user "
                f"could change what you build with; use a directory of your own")
    if writable_by_others(st):
        return (f"{what}={path!r} is writable by other users (mode {stat.filemode(st.st_mode)}); "
                f"run 'chmod go-w {path}' or use another directory")
    if not explicit and not os.access(path, os.W_OK | os.X_OK):  # a read-only image's ~/.cache: next one
        return (f"{what}={path!r} is not writable (a read-only file system or mode "
                f"{stat.filemode(st.st_mode)}); set FLASHINFER_SM120_CACHE_DIR to a writable directory")
    return None


def home_dir() -> str | None:
    """``$HOME``, else the passwd entry's home, else ``None`` (never ``"~"``:
    ``os.path.expanduser`` gives ``~`` back when HOME is unset and the uid has no
    passwd entry, and ``~/.cache`` would then be created in the working directory;
    an empty ``HOME`` would give ``/``)."""
    home = os.environ.get("HOME")
    if home:
        return home
    try:
        import pwd

        return pwd.getpwuid(os.geteuid()).pw_dir or None
    except (ImportError, KeyError, OSError):
        return None


def _ancestors_problem(real: str, what: str) -> str | None:
    """Every directory above the cache root must be owned by root or you and not
    writable by others, unless sticky (``/tmp``): otherwise another user could
    rename the root away and put their own in its place."""
    uid = os.geteuid()
    for parent in _parents(real):
        try:
            st = os.stat(parent)
        except OSError as exc:
            return f"{what}: cannot check {parent} ({exc.strerror})"
        if st.st_uid not in (0, uid):
            return (f"{what}: {parent} above it is owned by uid {st.st_uid}, who could replace it; "
                    f"use a directory of your own")
        if writable_by_others(st) and not st.st_mode & stat.S_ISVTX:
            return (f"{what}: {parent} above it is writable by other users (mode "
                    f"{stat.filemode(st.st_mode)}), who could replace it; use another directory")
    return None


def _parents(path: str) -> list[str]:
    out = []
    p = os.path.dirname(path)
    while True:
        out.append(p)
        if p == os.path.dirname(p):
            return out
        p = os.path.dirname(p)


def _candidates() -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    explicit = os.environ.get("FLASHINFER_SM120_CACHE_DIR")
    if explicit:
        out.append((_EXPLICIT, explicit))
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        out.append(("$XDG_CACHE_HOME/flashinfer-sm120", os.path.join(xdg, "flashinfer-sm120")))
    home = home_dir()
    if home is not None:
        out.append(("~/.cache/flashinfer-sm120", os.path.join(home, ".cache", "flashinfer-sm120")))
    out.append(("the per-uid fallback",
                os.path.join(tempfile.gettempdir(), f"flashinfer-sm120-{os.geteuid()}")))
    return out


def cache_root() -> str:
    """The per-uid directory for flashinfer-sm120's state, created ``0700`` if absent.

    Candidates, first usable wins: ``$FLASHINFER_SM120_CACHE_DIR``,
    ``$XDG_CACHE_HOME/flashinfer-sm120``, ``~/.cache/flashinfer-sm120``, then
    ``$TMPDIR/flashinfer-sm120-<uid>``.  A candidate is refused (with a WARNING
    naming the variable and the fix, also returned by :func:`cache_root_notes`)
    when it is relative, holds characters FlashInfer's ninja lines cannot carry
    (see :data:`SAFE_PATH_RE`), is owned by another uid, is writable by group
    or others, or sits below a directory another user could replace it in.

    Returns:
        An absolute path, symlinks resolved.

    Raises:
        StateFileError: no candidate is usable (the message lists each reason).
    """
    key = tuple(os.environ.get(k) for k in ("FLASHINFER_SM120_CACHE_DIR", "XDG_CACHE_HOME", "HOME",
                                             "TMPDIR")) + (os.geteuid(),)
    hit = _root_cache.get(key)
    if hit is not None:
        return hit
    reasons = []
    for what, path in _candidates():
        problem = path_problem(path, what) or _dir_problem(path, what, True, what == _EXPLICIT)
        if problem is None:
            path = os.path.realpath(path)  # a link planted later cannot redirect us
            problem = path_problem(path, f"{what} (resolved)") or _ancestors_problem(path, what)
        if problem is None:
            for r in reasons:
                if r not in _notes:
                    _notes.append(r)
                    logger.warning("flashinfer-sm120: not using %s; using %s instead", r, path)
            _root_cache[key] = path
            return path
        reasons.append(bounded(problem))  # it quotes the variable's value: shown in doctor, status
    raise StateFileError("no usable cache directory for flashinfer-sm120: " + "; ".join(reasons)
                         + ". Set FLASHINFER_SM120_CACHE_DIR to an absolute directory you own.")


def cache_root_notes() -> list[str]:
    """Messages about cache-root candidates refused in this process (for ``doctor``)."""
    return list(_notes)
