"""The per-uid cache root, chosen and created by threat-model P2 and P4 (docs/safety.md section 9): a refused
candidate is named with its fix and the next is used; and the rule for a path ``build.ninja`` carries unquoted."""

from __future__ import annotations

import errno
import logging
import os
import stat

from flashinfer_sm120.errors import StateFileError
from flashinfer_sm120.safety.formats.base import bounded, shown, some
from flashinfer_sm120.safety.ownership import deepest_existing, mine_problem, passwd_home, temp_dir, trust_reason

logger = logging.getLogger("flashinfer_sm120")

_notes: list[str] = []
_EXPLICIT = "$FLASHINFER_SM120_CACHE_DIR"
_root_cache: dict[tuple, str] = {}


def forget_cache_root(*, notes: bool = False) -> None:
    """Forget the cache root chosen (the environment changed); ``notes`` too."""
    _root_cache.clear()
    if notes:
        _notes.clear()


def _dir_problem(path: str, what: str, explicit: bool = True) -> str | None:
    """Why the cache directory ``path`` may not be used, creating it ``0700`` once every check passed (P4)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        problem = _creation_problem(path, what)  # threat-model: P4 (check, then create)
        if problem is not None:
            return problem
        try:  # every level 0700 whatever the umask: umask 000 must not leave a world-writable ~/.cache
            from flashinfer_sm120.safety.fs.places import make_private_dirs

            make_private_dirs(path)
            st = os.lstat(path)
        except OSError as exc:
            return _os_problem(what, path, "cannot be created", exc)
    except OSError as exc:
        return _os_problem(what, path, "cannot be read", exc)
    if stat.S_ISLNK(st.st_mode):  # P2: whose link it is, is the trust rule's (_place_problem)
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
                f"{bad}")
    if not explicit and not os.access(path, os.W_OK | os.X_OK):  # a read-only image's ~/.cache: next one
        return (f"{what}={path!r} is not writable (a read-only file system or mode "
                f"{stat.filemode(st.st_mode)}); set FLASHINFER_SM120_CACHE_DIR to a writable directory")
    return None


def _os_problem(what: str, path: str, action: str, exc: OSError) -> str:
    """``<what>=<path> <action>: <why>; <fix>`` chosen by errno (threat-model: P8)."""
    from flashinfer_sm120.safety import oserrors

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


def _creation_problem(path: str, what: str) -> str | None:
    """Why the absent ``path`` must not be created: a dangling link above it, another uid's tree, or untrusted (P4);
    a file above it never gets here (``lstat`` says ``ENOTDIR``, which :data:`.oserrors.BY_ERRNO` words)."""
    from flashinfer_sm120.safety.fs.places import foreign_tree, foreign_tree_message

    top = os.path.realpath(deepest_existing(path))
    try:
        os.stat(top)
    except OSError as exc:
        return _os_problem(what, path, f"cannot be created ({top} cannot be checked)", exc)
    foreign = foreign_tree(path)
    if foreign is not None:
        return foreign_tree_message(what, foreign)
    return _place_problem(path, what)


def home_dir() -> str | None:
    """``$HOME``, else the passwd home, else ``None``: never ``expanduser``'s ``"~"`` nor an empty ``HOME``'s ``/``."""
    return os.environ.get("HOME") or passwd_home()


def _place_problem(path: str, what: str) -> str | None:
    """:func:`trust_reason`: else another user could put their own root in its place; never in ``/proc``, where
    ``/proc/self`` is another directory in each process and nothing can be created.  P2, P4, P8"""
    real = os.path.realpath(path)
    if os.path.commonpath([real, "/proc"]) == "/proc":
        return (f"{what}={path!r} leads to {real}, in /proc, the kernel's view of each process, where no file can "
                f"be created; set FLASHINFER_SM120_CACHE_DIR to a directory of your own")
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
                os.path.join(temp_dir(), f"flashinfer-sm120-{os.geteuid()}")))
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


def cache_root_notes() -> list[str]:
    """Messages about cache-root candidates refused in this process (for ``doctor``)."""
    return list(_notes)


#: The ASCII characters besides letters and digits a path may hold unquoted in FlashInfer's
#: ``build.ninja`` and the ``/bin/sh -c`` lines ninja runs: syntax to neither.
PATH_ASCII_EXTRA = "_./+@%=,~-"

#: The path rule in words (messages, docs/safety.md).  Non-ASCII is accepted: FlashInfer 0.7.4 builds
#: and loads a module under such a path with nvcc 13.0 (tests/unit/safety/fs/test_state_dir.py).
PATH_RULE = (f"letters (of any alphabet), digits, '{PATH_ASCII_EXTRA}' and other printable non-ASCII "
             f"characters; no blank, no control character, none of $ : ; & | < > ( ) ' \" \\ ` * ? [ ] "
             f"# {{ }} ! (ninja or /bin/sh syntax)")


def path_chars_problem(path: str) -> list[str] | None:
    """The characters of ``path`` that break :data:`PATH_RULE`, sorted, or ``None``.  P8"""
    bad = sorted({c for c in path if not (c.isalnum() or c in PATH_ASCII_EXTRA if c.isascii()
                                          else c.isprintable() and not c.isspace())})  # not U+00A0, U+2028
    return bad or None


def path_problem(path: str, what: str, fix: str = f"set it to an absolute path of {PATH_RULE}") -> str | None:
    """Why ``path`` (named ``what``) cannot be written unquoted into ``build.ninja`` and its shell lines, or ``None``."""
    if not os.path.isabs(path):
        return (f"{what}={shown(path)} is a relative path: builds and child processes run in other "
                f"directories. Fix: {fix}")
    bad = path_chars_problem(path)
    if bad:
        return (f"{what}={shown(path)} contains {some(bad, 8)}, which FlashInfer writes unquoted into its "
                f"build.ninja and the shell lines ninja runs, where a blank or ':' breaks the line and '$x' is a "
                f"variable (the build would fail, or land in another directory). Fix: {fix}")
    return None


def jit_dir_problem(jit_dir: str) -> str | None:
    """Why the JIT directory cannot be used: FlashInfer 0.7.x writes it unquoted into every ``build.ninja``."""
    return path_problem(jit_dir, "FlashInfer's JIT directory", "set FLASHINFER_WORKSPACE_BASE (or SGLANG_CACHE_DIR, "
                        f"which SGLang copies into it) to an absolute directory whose path has only {PATH_RULE}")
