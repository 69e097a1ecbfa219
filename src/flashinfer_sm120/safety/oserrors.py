"""What an ``OSError`` means for the user, chosen by its ``errno`` (never by exception class or message text):
one table, :data:`BY_ERRNO`, for every command and state file (threat-model: P8)."""

from __future__ import annotations

import errno
from collections import namedtuple


#: errno -> (kind, what happened to ``{path}``, the fix).  ``{path}`` is the file or directory the
#: operation was on; ``{elsewhere}`` the caller's way to choose another place (a variable or flag).
BY_ERRNO: dict[int, tuple[str, str, str]] = {
    errno.ENOSPC: ("space", "the disk holding {path} is full", "free space there, or {elsewhere}"),
    errno.EDQUOT: ("space", "your disk quota for {path} is used up", "free space there, or {elsewhere}"),
    errno.EACCES: ("permission", "permission denied on {path}",
                   "make {path} writable (and its parents searchable) by you, or {elsewhere}"),
    errno.EPERM: ("permission", "operation not permitted on {path}",
                  "make {path} yours (or writable by you), or {elsewhere}"),
    errno.EROFS: ("permission", "{path} is on a read-only file system", "{elsewhere}"),
    errno.ENAMETOOLONG: ("path", "the path {path} is longer than the file system allows (255 bytes a "
                         "component, 4096 a path)", "use a shorter path, or {elsewhere}"),
    errno.ELOOP: ("path", "{path} is (or passes through) a symbolic link", "replace the link by a real "
                  "directory, or {elsewhere}"),
    errno.ENOTDIR: ("path", "{path} is a file where a directory is needed", "remove or rename it, or {elsewhere}"),
    errno.EISDIR: ("path", "{path} is a directory", "remove or rename it, or {elsewhere}"),
    errno.ENOENT: ("missing", "{path} does not exist", "check the path"),
    errno.EEXIST: ("exists", "{path} already exists", "remove it or choose a new path"),
    errno.EMFILE: ("limit", "this process has used up its open-file limit (ulimit -n: {nofile})",
                   "raise the open-file limit (`ulimit -n 4096`), then retry"),
    errno.ENFILE: ("limit", "the system has too many open files",
                   "close other programs or raise fs.file-max (sysctl), then retry"),
    errno.EAGAIN: ("limit", "no new process could be started for {path} (ulimit -u: {nproc})",
                   "raise `ulimit -u`, or wait for other processes to end, then retry"),
    errno.ENOMEM: ("limit", "out of memory (ulimit -v: {as_kib})", "free memory, or raise `ulimit -v`, then retry"),
    errno.E2BIG: ("limit", "this process's environment is too large to start {path}",
                  "shorten or unset the longest variable, then retry"),
    errno.EFBIG: ("limit", "{path} would exceed this process's file-size limit (ulimit -f: {fsize_kib})",
                  "raise the limit (`ulimit -f unlimited`), or {elsewhere}"),
    errno.EIO: ("io", "an I/O error on {path}", "check the disk (dmesg), or {elsewhere}"),
}
_OTHER = ("io", "{path}: {strerror}", "{elsewhere}")
#: ENOSPC on a file system with free blocks but no free inodes (``statvfs`` ``f_favail`` 0): not "full".
_NO_INODES = ("space", "the file system holding {path} is out of inodes (it has free space, but no file can be "
              "created)", "delete files there (the many small ones first), or {elsewhere}")


class OsProblem(namedtuple("OsProblem", "kind message fix")):
    """An ``OSError`` in words: ``kind`` (``space``, ``permission``, ``path``, ``missing``, ``limit``...)."""

    def __str__(self) -> str:
        return f"{self.message}; {self.fix}"


def describe(exc: OSError, path: object = None, elsewhere: str = "choose another directory") -> OsProblem:
    """``exc`` as an :class:`OsProblem` from :data:`BY_ERRNO`; ``path`` defaults to the exception's filename."""
    from flashinfer_sm120.safety.formats.base import shown

    where = str(path if path is not None else (exc.filename or "the file"))
    where = shown(_existing(where) if exc.errno == errno.ENOTDIR else where, 300)
    kind, what, fix = BY_ERRNO.get(exc.errno or 0, _OTHER)
    if exc.errno == errno.ENOSPC and _out_of_inodes(str(path if path is not None else exc.filename or ".")):
        kind, what, fix = _NO_INODES
    strerror = shown(exc.strerror or str(exc), 200)
    return OsProblem(kind, what.format(path=where, strerror=strerror, **(_limits() if kind == "limit" else {})),
                     fix.format(path=where, elsewhere=elsewhere))


def _out_of_inodes(path: str) -> bool:
    """Whether the file system of ``path`` (or its deepest existing parent) has blocks but no inodes left."""
    import os

    try:
        st = os.statvfs(_existing(path) or ".")
    except OSError:
        return False
    return st.f_files > 0 and st.f_favail == 0 and st.f_bavail > 0


def _existing(path: str) -> str:
    """The deepest level of ``path`` that is there: for ``ENOTDIR``, the file in the way."""
    import os

    while os.path.dirname(path) != path and not os.path.lexists(path):
        path = os.path.dirname(path)
    return path


def _limits() -> dict[str, str]:
    """This process's soft limits by name, as ``ulimit`` prints them (the value a ``limit`` message names)."""
    import resource

    def soft(which: int, scale: int = 1) -> str:
        cur = resource.getrlimit(which)[0]
        return "unlimited" if cur == resource.RLIM_INFINITY else str(cur // scale)

    return {"nofile": soft(resource.RLIMIT_NOFILE), "nproc": soft(resource.RLIMIT_NPROC),
            "as_kib": soft(resource.RLIMIT_AS, 1024), "fsize_kib": soft(resource.RLIMIT_FSIZE, 1024)}
