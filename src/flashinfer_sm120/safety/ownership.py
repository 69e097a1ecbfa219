"""The trust rule (threat-model: P2, P4; OpenSSH ``StrictModes`` for every level of a path, docs/safety.md section 1):
:func:`trust_reason` for what a build runs, adopts, reads or creates in; :func:`mine_problem` for what we keep."""

from __future__ import annotations

import dataclasses
import functools
import os
import pwd
import stat
import tempfile

from flashinfer_sm120.safety.formats.base import shown

MAX_LINKS = 40  # as Linux MAXSYMLINKS


@functools.lru_cache(maxsize=4)
def _private_gid(uid: int) -> int | None:
    """The user's private group (Debian ``useradd``: the user's name, no other member), or ``None``; never root's."""
    if uid == 0:
        return None
    try:
        import grp

        user = pwd.getpwuid(uid)
        group = grp.getgrgid(user.pw_gid)
    except (ImportError, KeyError, OSError):
        return None
    if group.gr_name != user.pw_name or any(m != user.pw_name for m in group.gr_mem):
        return None
    return user.pw_gid


def writable_by_others(st: os.stat_result) -> bool:
    """Whether another than the owner can write ``st`` (a group but the user's private group counts: umask ``002``)."""
    if st.st_mode & stat.S_IWOTH:
        return True
    return bool(st.st_mode & stat.S_IWGRP) and st.st_gid != _private_gid(os.geteuid())


class Untrusted(Exception):
    """A path breaks the ownership rule; the message names it and the fix."""


def _open_fix(path: str, st: os.stat_result) -> str:
    """The one fix for a path not ours alone (P8): ``chmod`` only one of root's or ours that is no shared sticky
    directory (``/tmp``) and no device; else a directory of your own, never running as its owner."""
    if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):  # /dev/full, a FIFO: never chmod those
        return "it is a device or special file, not a place to write: use a path of your own"
    if st.st_mode & stat.S_ISVTX:
        return "it is a shared directory where anyone may create entries: use a directory of your own instead"
    if st.st_uid not in (0, os.geteuid()):
        return "use a directory of your own"
    return f"run 'chmod go-w {path}', or use a directory of your own"


def resolve(path: str) -> str:
    """:func:`os.path.realpath` of ``path``, checking every directory a component is looked up in."""
    path = os.path.abspath(path)
    todo = [c for c in path.split("/") if c]
    cur = "/"
    links = 0
    file_ok("/")
    while todo:
        c = todo.pop(0)
        if c == ".":
            continue
        if c == "..":
            cur = os.path.dirname(cur)
            continue
        nxt = os.path.join(cur, c)
        file_ok(cur, nxt)
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


def file_ok(path: str, entry: str | None = None) -> os.stat_result:
    """``path``'s stat when root or this uid owns it, not writable by others (P2), else :class:`Untrusted`."""
    uid = os.geteuid()
    st = os.stat(path)
    if st.st_uid not in (0, uid):
        raise Untrusted(f"{path} is owned by uid {st.st_uid}, not root or you (uid {uid}); {_open_fix(path, st)}")
    if not writable_by_others(st):
        return st
    if st.st_mode & stat.S_ISVTX and st.st_uid == 0 and entry is not None:  # /tmp: others cannot replace ours
        try:
            owner = os.lstat(entry).st_uid
        except OSError:
            owner = -1
        if owner in (0, uid):
            return st
        raise Untrusted(f"{entry} is owned by uid {owner} in {path}, a directory everyone can write "
                        f"(mode {stat.filemode(st.st_mode)}); only entries of root or you are trusted there: "
                        f"use a path outside {path}, or one of your own in it")
    raise Untrusted(f"{path} is writable by other users (mode {stat.filemode(st.st_mode)}); {_open_fix(path, st)}")


def fingerprint(path: str) -> list[int] | None:
    """``[dev, ino, size, mtime_ns, ctime_ns]`` of ``path`` (links followed), or ``None``: the one rule for
    "the same binary" (the memo, views, launchers, the replayed record); a change of mode or owner changes ``ctime``."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def mine_problem(path: str, st: os.stat_result) -> str | None:
    """Why an entry we keep (the cache root, a view) is not ours alone, group included, or ``None`` (P2)."""
    uid = os.geteuid()
    if st.st_uid != uid:
        return f"{path} is owned by uid {st.st_uid}, not you (uid {uid}); use a directory of your own"
    if not stat.S_ISLNK(st.st_mode) and st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{path} is writable by other users (mode {stat.filemode(st.st_mode)}); {_open_fix(path, st)}"
    return None


#: The variables :mod:`tempfile` takes the temporary directory from, in its order.
TEMPFILE_VARIABLES = ("TMPDIR", "TEMP", "TMP")


def temp_dir() -> str:
    """:func:`tempfile.gettempdir`, or where it looks first when no directory takes its probe file (``ulimit -f 0``):
    the write that then fails is named by its errno with the fix (P8), not "no usable temporary directory"."""
    try:
        return tempfile.gettempdir()
    except OSError:
        return next((os.environ[v] for v in TEMPFILE_VARIABLES if os.environ.get(v)), "/tmp")


def deepest_existing(path: str) -> str:
    """The deepest level of ``path`` (made absolute) that exists; ``/`` at worst."""
    p = os.path.abspath(path)
    while not os.path.lexists(p) and os.path.dirname(p) != p:
        p = os.path.dirname(p)
    return p


def trust_reason(path: str, *, absent_ok: bool = True, sticky_ok: bool = True) -> str | None:
    """Why ``path`` breaks the trust rule, or ``None`` (P2, P4); ``sticky_ok``: ``/tmp`` may hold an absent rest."""
    here = deepest_existing(path) if absent_ok else os.path.abspath(path)
    try:
        real = resolve(here)
        st = os.stat(real)
        sticky_root = stat.S_ISDIR(st.st_mode) and st.st_uid == 0 and st.st_mode & stat.S_ISVTX
        if not (sticky_ok and sticky_root and here != os.path.abspath(path)):
            file_ok(real)
    except Untrusted as exc:
        return str(exc)
    except OSError as exc:
        return f"cannot check {shown(exc.filename or path, 200)}: {exc.strerror or exc}"
    return None


@dataclasses.dataclass(frozen=True)
class PathProblem:
    """A program or directory a build would run, adopt or write in that fails the trust rule: ``what`` it is,
    ``path``, ``why`` and the ``fix`` (doctor's ``host_program``)."""

    what: str
    path: str
    why: str
    fix: str

    def __str__(self) -> str:
        return f"{self.what} {shown(self.path, 200)} fails the trust rule: {self.why}. Fix: {self.fix}"


def passwd_home() -> str | None:
    """This uid's home in the passwd database (not ``$HOME``, which ``sudo -E`` keeps), or ``None``."""
    try:
        return pwd.getpwuid(os.geteuid()).pw_dir or None
    except (KeyError, OSError):
        return None


def own_place_fix() -> str:
    """The fix for a workspace not ours: this uid's :func:`passwd_home` as an example, and ``sudo -H``."""
    home = passwd_home() or ""
    example = f" (for example {home})" if home and os.path.isdir(home) and trust_reason(home) is None else ""
    env_home = os.environ.get("HOME") or ""
    sudo = ("; under sudo, keep your own home (sudo -H instead of sudo -E)"
            if env_home and os.path.realpath(env_home) != os.path.realpath(home or env_home) else "")
    return f"set FLASHINFER_WORKSPACE_BASE to a directory of your own{example}{sudo}"


def check_place(path: str, what: str, fix: str | None = None) -> PathProblem | None:
    """A :class:`PathProblem` when a directory we build or write in fails :func:`trust_reason`."""
    why = trust_reason(path)
    if why is None:
        return None
    return PathProblem(what, path, why, fix or own_place_fix())
