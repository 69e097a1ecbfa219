"""The per-uid cache root (views, the nvcc memo), chosen and created by threat-model P2 and P4 (docs/safety.md
section 9): a candidate that breaks a rule is refused, named with its fix, and the next one is used."""

from __future__ import annotations

import errno
import logging
import os
import stat
import tempfile

from flashinfer_sm120.errors import StateFileError
from flashinfer_sm120.safety import oserrors
from flashinfer_sm120.safety.formats.base import bounded
from flashinfer_sm120.safety.formats.grammar import deepest_existing, foreign_tree, make_private_dirs, path_problem
from flashinfer_sm120.safety.ownership import mine_problem, trust_reason

logger = logging.getLogger("flashinfer_sm120")

__all__ = ["cache_root", "cache_root_notes", "forget_cache_root", "home_dir", "listing_only", "lists_only",
           "foreign_tree_message"]

_notes: list[str] = []
#: Set by :func:`listing_only`: this process creates no directory or file of ours.
_listing = False
_EXPLICIT = "$FLASHINFER_SM120_CACHE_DIR"
_root_cache: dict[tuple, str] = {}


def forget_cache_root(*, notes: bool = False) -> None:
    """Forget the cache root chosen and :func:`listing_only` (the environment changed); ``notes`` too."""
    global _listing
    _root_cache.clear()
    _listing = False
    if notes:
        _notes.clear()


def _dir_problem(path: str, what: str, explicit: bool = True) -> str | None:
    """Why the cache directory ``path`` may not be used, creating it ``0700`` once every check passed (P4)."""
    uid = os.geteuid()
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        problem = _creation_problem(path, what)  # threat-model: P4 (check, then create)
        if problem is not None:
            return problem
        if _listing:  # threat-model: P4 (a command that only lists creates nothing)
            raise StateFileError(f"{what}={path!r} does not exist yet, and this command only lists: it "
                                 f"creates nothing (any command that builds creates it)")
        try:  # every level 0700 whatever the umask: umask 000 must not leave a world-writable ~/.cache
            make_private_dirs(path)
            st = os.lstat(path)
        except OSError as exc:
            return _os_problem(what, path, "cannot be created", exc)
    except OSError as exc:
        return _os_problem(what, path, "cannot be read", exc)
    if stat.S_ISLNK(st.st_mode):
        if st.st_uid not in (0, uid):  # threat-model: P2 -- whoever owns the link chose where it points
            return (f"{what}={path!r} is a symlink owned by uid {st.st_uid}, not you (uid {uid}) or root: that "
                    f"user chose where it points; remove it, or set FLASHINFER_SM120_CACHE_DIR to a "
                    f"directory of your own")
        real = os.path.realpath(path)
        if real == path:
            return f"{what}={path!r} is a symlink loop"
        if not os.path.lexists(real):  # whoever creates the target later would own our state
            return f"{what}={path!r} is a symlink to {real!r}, which does not exist; create it (mode 0700) " \
                   f"or point the variable elsewhere"
        problem = _place_problem(path, what)  # the directory holding the link, and the way to its target
        if problem is not None:
            return problem
        return _dir_problem(real, f"{what} (symlink to {real})", explicit)
    if not stat.S_ISDIR(st.st_mode):
        return f"{what}={path!r} is not a directory; point it at a directory you own"
    bad = mine_problem(path, st)  # threat-model: P2 -- we keep it 0700, so ours alone
    if bad:
        return (f"{what}={path!r} is not yours alone, so another user could change what you build with: "
                f"{bad}, or use a directory of your own")
    if not explicit and not os.access(path, os.W_OK | os.X_OK):  # a read-only image's ~/.cache: next one
        return (f"{what}={path!r} is not writable (a read-only file system or mode "
                f"{stat.filemode(st.st_mode)}); set FLASHINFER_SM120_CACHE_DIR to a writable directory")
    return None


def _os_problem(what: str, path: str, action: str, exc: OSError) -> str:
    """``<what>=<path> <action>: <why>; <fix>`` chosen by errno (threat-model: P8)."""
    why = oserrors.describe(exc, path, "set FLASHINFER_SM120_CACHE_DIR to a directory of your own")
    return f"{what}={path!r} {action}: {why}"


#: Bytes of path kept free below the cache root (``cuda-home/<view>/lib64/stubs/libcuda.so``, temp names).
ROOM_BYTES = 512


def _room_problem(path: str, what: str) -> str | None:
    """Why ``path`` is too long to hold our files (:data:`ROOM_BYTES` more within ``PATH_MAX``) (P8)."""
    top = deepest_existing(path)
    try:
        path_max, name_max = os.pathconf(top, "PC_PATH_MAX"), os.pathconf(top, "PC_NAME_MAX")
    except (OSError, ValueError):
        path_max, name_max = 4096, 255
    raw = os.fsencode(path)
    if len(raw) + ROOM_BYTES < path_max and all(len(part) <= name_max for part in raw.split(b"/")):
        return None
    exc = OSError(errno.ENAMETOOLONG, os.strerror(errno.ENAMETOOLONG))
    return _os_problem(what, path, f"leaves no room for the files kept below it ({len(raw)} bytes, "
                       f"{ROOM_BYTES} more needed, {path_max} allowed)", exc)


def foreign_tree_message(what: str, ft, variable: str = "FLASHINFER_SM120_CACHE_DIR") -> str:
    """The sentence for a :class:`~flashinfer_sm120.safety.formats.grammar.ForeignTree`, with the fix."""
    return (f"{what}={ft.path!r} does not exist, and it would be created inside {ft.top}, owned by uid "
            f"{ft.owner}, as uid {ft.uid}: that user's own tools could not write it (pip, FlashInfer "
            f"and others use ~/.cache). Run as uid {ft.owner} (sudo -u), keep your own home "
            f"(sudo -H instead of sudo -E), or set {variable} to a directory of your own")


def _creation_problem(path: str, what: str) -> str | None:
    """Why the absent ``path`` must not be created: no directory above, another uid's tree, or untrusted (P4)."""
    top = os.path.realpath(deepest_existing(path))
    try:
        st = os.stat(top)
    except OSError as exc:
        return _os_problem(what, path, f"cannot be created ({top} cannot be checked)", exc)
    if not stat.S_ISDIR(st.st_mode):
        return (f"{what}={path!r} cannot be created: {top} is not a directory; remove it or point the "
                f"variable elsewhere")
    foreign = foreign_tree(path)
    if foreign is not None:
        return foreign_tree_message(what, foreign)
    return _place_problem(path, what)


def home_dir() -> str | None:
    """``$HOME``, else the passwd home, else ``None``: never ``expanduser``'s ``"~"`` nor an empty ``HOME``'s ``/``."""
    home = os.environ.get("HOME")
    if home:
        return home
    try:
        import pwd

        return pwd.getpwuid(os.geteuid()).pw_dir or None
    except (ImportError, KeyError, OSError):
        return None


def _place_problem(path: str, what: str) -> str | None:
    """:func:`trust_reason`: else another user could put their own root in its place.  P2, P4"""
    why = trust_reason(path)
    return None if why is None else f"{what}={path!r} lies where another user could replace it: {why}"


_HOME = "~/.cache/flashinfer-sm120"


def _missing_home(what: str, path: str) -> str | None:
    """A home that does not exist (``HOME=/nonexistent``) is never created for a cache (P4)."""
    home = home_dir()
    if what == _HOME and home is not None and not os.path.isdir(home):
        return (f"{what}={path!r} lies in the home directory {home!r}, which does not exist; a home is not "
                f"created for a cache (set HOME to an existing directory, or FLASHINFER_SM120_CACHE_DIR)")
    return None


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
        out.append((_HOME, os.path.join(home, ".cache", "flashinfer-sm120")))
    out.append(("the per-uid fallback",
                os.path.join(tempfile.gettempdir(), f"flashinfer-sm120-{os.geteuid()}")))
    return out


def cache_root() -> str:
    """The first usable per-uid state directory, links resolved; :class:`StateFileError` naming every reason."""
    key = tuple(os.environ.get(k) for k in ("FLASHINFER_SM120_CACHE_DIR", "XDG_CACHE_HOME", "HOME",
                                             "TMPDIR")) + (os.geteuid(),)
    hit = _root_cache.get(key)
    if hit is not None:
        return hit
    reasons = []
    for what, path in _candidates():
        problem = (_missing_home(what, path) or path_problem(path, what) or _room_problem(path, what)
                   or _dir_problem(path, what, what == _EXPLICIT))
        if problem is None:
            path = os.path.realpath(path)  # a link planted later cannot redirect us
            problem = (path_problem(path, f"{what} (resolved)") or _room_problem(path, f"{what} (resolved)")
                       or _place_problem(path, what))
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


def listing_only() -> None:
    """Declare that this process only lists: :func:`cache_root` then creates nothing.  P4"""
    global _listing
    _listing = True


def lists_only() -> bool:
    """Whether :func:`listing_only` was declared in this process (then nothing of ours is written)."""
    return _listing


def cache_root_notes() -> list[str]:
    """Messages about cache-root candidates refused in this process (for ``doctor``)."""
    return list(_notes)
