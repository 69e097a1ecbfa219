"""The ownership rule for what flashinfer-sm120 executes, adopts or builds in (OpenSSH
``StrictModes`` applied to every step of a path): a file, and every directory in which any
component of its path is looked up, must be owned by root or by the current uid and must not be
writable by group or others (group-writable is fine when the group is the user's private group,
see :func:`writable_by_others`).  A world-writable directory with the
sticky bit (``/tmp``) is accepted only when root owns it *and* the entry looked up in it is
owned by root or by you.  :func:`trust_reason` is the one check of a path by that rule (what a build
runs, adopts, reads or creates in); :mod:`flashinfer_sm120.safety.trust` applies the same walk to programs
and what their wrapper scripts run; :func:`mine_problem` is the rule for what we keep as our own
(owned by this uid, writable by no one else)."""
# threat-model: P2, P4 (the ownership rule: root or the user, not writable by others)

from __future__ import annotations

import dataclasses
import functools
import os
import pwd
import stat

from flashinfer_sm120.safety import formats

__all__ = ["MAX_LINKS", "writable_by_others", "Untrusted", "current_uid", "dir_ok", "resolve", "file_ok",
           "trust_reason", "mine_problem", "check_place", "PlaceProblem", "own_place_fix", "cache_clear"]

MAX_LINKS = 40  # as Linux MAXSYMLINKS


def _private_gid() -> int | None:
    """The current user's private group (user-private-group scheme, the default
    of Debian/Ubuntu ``useradd``: group named after the user, the user's primary
    group, no other listed members), or ``None``.  Never for root.  Looked up
    once per uid (passwd/group may be on LDAP)."""
    return _private_gid_of(os.geteuid())


def cache_clear() -> None:
    """Forget the private groups already looked up (after passwd or group changed)."""
    _private_gid_of.cache_clear()


@functools.lru_cache(maxsize=4)
def _private_gid_of(uid: int) -> int | None:
    if uid == 0:
        return None
    try:
        import grp
        import pwd

        user = pwd.getpwuid(uid)
        group = grp.getgrgid(user.pw_gid)
    except (ImportError, KeyError, OSError):
        return None
    if group.gr_name != user.pw_name or any(m != user.pw_name for m in group.gr_mem):
        return None
    return user.pw_gid


def writable_by_others(st: os.stat_result) -> bool:
    """Whether someone other than the owner can write the file or directory ``st``
    describes: world-writable, or group-writable by a group that is not the
    current user's private group (:func:`_private_gid`; under the umask ``002``
    those user-private-group systems use, a user's own venv is group-writable
    by a group that holds only that user).  The sticky bit is the caller's
    business."""
    if st.st_mode & stat.S_IWOTH:
        return True
    return bool(st.st_mode & stat.S_IWGRP) and st.st_gid != _private_gid()


class Untrusted(Exception):
    """A path breaks the ownership rule; the message names it and the fix."""


def current_uid() -> int:
    return os.geteuid() if hasattr(os, "geteuid") else 0


def dir_ok(directory: str, entry: str | None, uid: int) -> None:
    st = os.stat(directory)
    if st.st_uid not in (0, uid):
        raise Untrusted(f"{directory} is owned by uid {st.st_uid}, not root or you (uid {uid})")
    if writable_by_others(st):
        if st.st_mode & stat.S_ISVTX and st.st_uid == 0 and entry is not None:
            try:
                owner = os.lstat(entry).st_uid
            except OSError:
                owner = -1
            if owner in (0, uid):  # the sticky bit stops others replacing it
                return
            raise Untrusted(
                f"{entry} is owned by uid {owner} in {directory}, a directory everyone can write "
                f"(mode {stat.filemode(st.st_mode)}); only entries of root or you are trusted there: "
                f"use a path outside {directory}, or one of your own in it")
        raise Untrusted(f"{directory} is writable by other users (mode {stat.filemode(st.st_mode)}); {_open_fix(directory, st)}")


def _open_fix(path: str, st: os.stat_result) -> str:
    """The fix for a directory others may write: a shared sticky one such as ``/tmp`` is meant to be
    (never 'chmod' it); any other can be closed."""
    if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):  # /dev/full, a FIFO: never chmod those
        return "it is a device or special file, not a place to write: use a path of your own"
    if st.st_mode & stat.S_ISVTX:
        return "it is a shared directory where anyone may create entries: use a directory of your own instead"
    return f"run 'chmod go-w {path}' or use a path outside it"


def resolve(path: str, uid: int) -> str:
    """Resolve ``path`` component by component (like :func:`os.path.realpath`),
    checking every directory in which a component is looked up."""
    if not os.path.isabs(path):
        path = os.path.abspath(path)
    todo = [c for c in path.split("/") if c]
    cur = "/"
    links = 0
    dir_ok("/", None, uid)
    while todo:
        c = todo.pop(0)
        if c == ".":
            continue
        if c == "..":
            cur = os.path.dirname(cur)
            continue
        nxt = os.path.join(cur, c)
        dir_ok(cur, nxt, uid)
        st = os.lstat(nxt)
        if stat.S_ISLNK(st.st_mode):
            links += 1
            if links > MAX_LINKS:
                raise Untrusted(f"{path}: too many levels of symbolic links (a link loop)")
            target = os.readlink(nxt)
            if target.startswith("/"):
                cur = "/"
            todo = [t for t in target.split("/") if t] + todo
        else:
            cur = nxt
    return cur


def file_ok(real: str, uid: int) -> os.stat_result:
    st = os.stat(real)
    if st.st_uid not in (0, uid):
        raise Untrusted(f"{real} is owned by uid {st.st_uid}, not root or you (uid {uid})")
    if writable_by_others(st):
        raise Untrusted(f"{real} is writable by other users (mode {stat.filemode(st.st_mode)}); {_open_fix(real, st)}")
    return st


def mine_problem(path: str, st: os.stat_result) -> str | None:
    """Why an entry we made and keep (the cache root, a view and what is in it, our ninja directory)
    is not ours, or ``None``: it must be owned by this uid (not even root's) and writable by no one
    else, group included: we make these ``0700``/``0755``, so the user-private-group exception of
    :func:`writable_by_others` does not apply (the strictest of the former variants; threat-model: P2).
    A symbolic link's own mode does not count."""
    uid = current_uid()
    if st.st_uid != uid:
        return f"{path} is owned by uid {st.st_uid}, not you (uid {uid})"
    if not stat.S_ISLNK(st.st_mode) and st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{path} is writable by other users (mode {stat.filemode(st.st_mode)}); run 'chmod go-w {path}'"
    return None


def trust_reason(path: str, *, absent_ok: bool = True, sticky_ok: bool = True) -> str | None:
    """Why ``path`` breaks the ownership rule, or ``None``: the one check of every path a build may
    run, adopt, read or create in (threat-model: P2, P4).  Every directory in which a component of it
    is looked up, links followed (:func:`resolve`), and the entry itself (:func:`file_ok`) must be
    root's or yours and not writable by others.

    Args:
        path: the path; a relative one is taken from the working directory.
        absent_ok: a path that does not exist yet (one we will create) is checked at its deepest
            existing level; ``False``: it must exist (a program, header or library we use).
        sticky_ok: a root-owned sticky directory such as ``/tmp`` may hold the absent rest (others
            cannot move what we create there); ``False`` for a path someone else may create first
            (one a flag or variable names).

    Returns:
        ``None`` when trusted, else a sentence naming the offending path and the fix.
    """
    uid = current_uid()
    here = os.path.abspath(path)
    while absent_ok and not os.path.lexists(here) and os.path.dirname(here) != here:
        here = os.path.dirname(here)
    try:
        real = resolve(here, uid)
        st = os.stat(real)
        sticky_root = stat.S_ISDIR(st.st_mode) and st.st_uid == 0 and st.st_mode & stat.S_ISVTX
        if not (sticky_ok and sticky_root and here != os.path.abspath(path)):
            file_ok(real, uid)
    except Untrusted as exc:
        return str(exc)
    except OSError as exc:
        return f"cannot check {formats.shown(exc.filename or path, 200)}: {exc.strerror or exc}"
    return None


@dataclasses.dataclass(frozen=True)
class PlaceProblem:
    """Why a directory is not a place to write into: ``what`` (``"FlashInfer's JIT directory"``),
    ``path``, the reason (:func:`trust_reason`), the fix alone, and what was to be done there."""

    what: str
    path: str
    why: str
    fix: str
    doing: str = "build in"

    def __str__(self) -> str:
        return f"{self.what} {formats.shown(self.path, 200)} is not safe to {self.doing}: {self.why}. Fix: {self.fix}"


def own_place_fix() -> str:
    """The fix for a workspace that is not ours: a directory of this uid's own (its passwd home, not
    ``$HOME``: under ``sudo -E`` that is the user's, the very place refused), and ``sudo -H``."""
    try:
        home = pwd.getpwuid(os.geteuid()).pw_dir
    except (KeyError, OSError):
        home = ""
    example = f" (for example {home})" if home and os.path.isdir(home) and trust_reason(home) is None else ""
    env_home = os.environ.get("HOME") or ""
    sudo = ("; under sudo, keep your own home (sudo -H instead of sudo -E)"
            if env_home and os.path.realpath(env_home) != os.path.realpath(home or env_home) else "")
    return f"set FLASHINFER_WORKSPACE_BASE to a directory of your own{example}{sudo}"


def check_place(path: str, what: str, fix: str | None = None, *, doing: str = "build in") -> PlaceProblem | None:
    """Check a directory we write into and run builds from (FlashInfer's JIT directory, absent
    levels included) by :func:`trust_reason`.  Another user who can replace a level can swap
    the ``build.ninja`` that ninja then runs, or the ``.so`` the server loads (``sudo`` keeping
    another user's ``HOME``, a shared ``FLASHINFER_WORKSPACE_BASE``).

    Returns:
        ``None`` when trusted, else a :class:`PlaceProblem` (its text names ``what``, the offending
        path and the fix: ``fix``, else :func:`own_place_fix`).
    """
    why = trust_reason(path)
    if why is None:
        return None
    return PlaceProblem(what, path, why, fix or own_place_fix(), doing)
