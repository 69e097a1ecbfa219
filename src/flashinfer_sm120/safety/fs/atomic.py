"""The one atomic writer, the one rule for temporary entries (``flock``-ed while their maker lives, else swept:
``finally`` never runs under ``kill -9``), and the JSON state files."""
# threat-model: P5 (random names; removed only by their creator, or the next process once the
# creator's lock is gone; final files put in place atomically), P3 (never on a guess from a pid), P4, P6

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import logging
import os
import shutil
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from flashinfer_sm120.errors import FormatError, PlaceError, StateFileError
from flashinfer_sm120.safety import oserrors
from flashinfer_sm120.safety.formats.base import shown
from flashinfer_sm120.safety.formats.reads import MAX_STATE_BYTES, read_json_file
from flashinfer_sm120.safety.ownership import temp_dir, trust_reason

logger = logging.getLogger("flashinfer_sm120")
T = TypeVar("T")

#: An entry younger than this (seconds) is never swept: its maker may not have locked it yet
#: (``mkdtemp``/``mkstemp`` and ``flock`` are two steps).
GRACE_S = 60.0

_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # a FIFO never blocks a sweep


def hold(fd: int) -> None:
    """Mark the temporary entry open on ``fd`` in use while it stays open (else only :data:`GRACE_S` keeps it)."""
    with contextlib.suppress(OSError):
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)


def sweep(prefix: str, parent: str | None = None) -> None:
    """Remove ``parent/prefix*`` entries of yours older than :data:`GRACE_S` nobody holds (no link); never raises."""
    parent = parent or temp_dir()
    try:
        names = [n for n in os.listdir(parent) if n.startswith(prefix)]
    except OSError:
        return
    for name in names:
        path = os.path.join(parent, name)
        try:
            fd = os.open(path, _OPEN_FLAGS)
        except OSError:
            continue
        try:
            st = os.fstat(fd)
            kind = stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)
            if st.st_uid != os.geteuid() or not kind or time.time() - st.st_mtime < GRACE_S:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # its maker is alive
            if stat.S_ISDIR(st.st_mode):
                shutil.rmtree(path, ignore_errors=True)
            else:
                now = os.lstat(path)
                if (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino):  # not a file renamed over it meanwhile
                    os.unlink(path)
        except OSError:
            continue
        finally:
            os.close(fd)


def temp_prefix(path: str) -> str:
    """The name every temporary file of :func:`write_atomic` for ``path`` starts with (beside it)."""
    return ".tmp-" + os.path.basename(path)[:200] + "."  # with mkstemp's 8 characters, a name Linux takes


def write_atomic(path: str, data: bytes, *, mode: int = 0o600) -> None:
    """Write ``data`` to ``path`` by a held ``mkstemp`` file renamed over it (P5)."""
    directory = os.path.dirname(path) or "."
    sweep(temp_prefix(path), directory)
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix(path), dir=directory)
    try:
        hold(fd)
        with os.fdopen(os.dup(fd), "wb") as fh:
            fh.write(data)
        os.fchmod(fd, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    finally:
        os.close(fd)


class Private:
    """A locked temporary directory ``path``; :meth:`close` removes it."""

    def __init__(self, path: str, fd: int) -> None:
        self.path, self._fd = path, fd

    def close(self) -> None:
        if self._fd is None:
            return
        shutil.rmtree(self.path, ignore_errors=True)
        os.close(self._fd)
        self._fd = None


def make_private(prefix: str, parent: str | None = None) -> Private:
    """A new locked ``mkdtemp`` directory ``parent/prefix*`` (:class:`PlaceError` unless ``parent`` is ours: P4)."""
    parent = parent or temp_dir()
    why = trust_reason(os.path.join(parent, prefix))
    if why:
        raise PlaceError(f"will not make a temporary directory in {shown(parent, 200)}: {why}. Fix: set "
                         f"TMPDIR to a directory of your own (mkdir -m 700 ~/tmp; TMPDIR=~/tmp) or unset it")
    sweep(prefix, parent)
    path = tempfile.mkdtemp(prefix=prefix, dir=parent)
    fd = os.open(path, _OPEN_FLAGS | os.O_DIRECTORY)
    hold(fd)
    return Private(path, fd)


def read_json(path: str, *, max_bytes: int = MAX_STATE_BYTES) -> tuple[Any, str | None]:
    """``(data, None)`` of a JSON state file of yours or root's (P6), ``(None, None)`` absent, ``(None, why)``."""
    if not os.path.lexists(path):
        return None, None
    try:
        return read_json_file(path, max_bytes, follow=False, owners=(0, os.geteuid())), None
    except FormatError as exc:
        return None, str(exc)


def write_json_atomic(path: str, data: Any) -> None:
    """Write ``data`` as JSON to ``path`` atomically (mode ``0600``); :class:`StateFileError` by errno (P8)."""
    try:
        write_atomic(path, json.dumps(data).encode("utf-8"))
    except OSError as exc:
        why = oserrors.describe(exc, os.path.dirname(path) or ".",
                                "set FLASHINFER_SM120_CACHE_DIR to another directory")
        raise StateFileError(f"cannot write {path}: {why}") from exc


def compute_once(lock_path: str, lookup: Callable[[], T | None], compute: Callable[[], T], *,
                 timeout: float, what: str) -> T:
    """``lookup()``, else ``compute()`` run by one process at a time under ``lock_path`` (at most ``timeout`` s)."""
    hit = lookup()
    if hit is not None:
        return hit
    try:
        import filelock

        lock = filelock.FileLock(lock_path, timeout=timeout)
        lock.acquire()
    except Exception as exc:  # Timeout, OSError (a read-only or lock-less file system): compute here
        logger.debug("flashinfer-sm120: %s without the lock %s (%s)", what, lock_path, exc)
        return compute()
    try:
        hit = lookup()
        return hit if hit is not None else compute()
    finally:
        with contextlib.suppress(Exception):
            lock.release()


# threat-model: P5 (never clobber: nvcc 13.0 opens its predictable ``tmpxft_<pid>_<n>-<k>_<name>`` files
# with ``O_TRUNC`` and without ``O_EXCL`` (strace), so each build's compilers write in a directory of ours)
#: The prefix of a process's build temporary directory under ``$TMPDIR``.
BUILD_TMP_PREFIX = "fi-sm120-build-"
#: Where nvcc, gcc and Python's ``tempfile`` write intermediate files, in the order they read them.
TEMP_VARIABLES = ("TMPDIR", "TMP", "TEMP")
_BUILD: dict[int, Private] = {}  # pid -> its directory: a forked child makes its own
_LOCK = threading.Lock()
_EXPORTED = {"depth": 0, "saved": {}}


def _close_own() -> None:
    d = _BUILD.pop(os.getpid(), None)
    if d is not None:
        d.close()


def build_tmp() -> str:
    """This process's private build temporary directory, made on first use, removed at exit (:class:`PlaceError`)."""
    pid = os.getpid()
    with _LOCK:
        d = _BUILD.get(pid)
        if d is None or not os.path.isdir(d.path):
            first = not _BUILD
            d = _BUILD[pid] = make_private(BUILD_TMP_PREFIX)
            if first:
                atexit.register(_close_own)
        return d.path


def build_env(env) -> dict:
    """A copy of ``env`` whose :data:`TEMP_VARIABLES` name :func:`build_tmp`, for a compiler we start."""
    return dict(env, **dict.fromkeys(TEMP_VARIABLES, build_tmp()))


@contextlib.contextmanager
def exported_build_tmp(environ=None) -> Iterator[str]:
    """Point :data:`TEMP_VARIABLES` at :func:`build_tmp` in the block (FlashInfer's ``run_ninja`` passes no ``env``)."""
    environ = os.environ if environ is None else environ
    temp_dir()  # chosen (and cached) from the user's setting, never from ours
    path = build_tmp()
    with _LOCK:
        if _EXPORTED["depth"] == 0:
            _EXPORTED["saved"] = {var: environ.get(var) for var in TEMP_VARIABLES}
            environ.update(dict.fromkeys(TEMP_VARIABLES, path))
        _EXPORTED["depth"] += 1
    try:
        yield path
    finally:
        with _LOCK:
            _EXPORTED["depth"] -= 1
            if _EXPORTED["depth"] == 0:
                for var, old in _EXPORTED["saved"].items():
                    if environ.get(var) != path:
                        continue  # changed by someone else while we built: theirs now
                    if old is None:
                        environ.pop(var, None)
                    else:
                        environ[var] = old
