"""One bounded way to run a binary: every program flashinfer-sm120 executes
(``nvcc --version``, the host C compiler for the ``libcuda.so`` stub, the
unpatched-FlashInfer child of ``doctor``) goes through :func:`run`.

What it guarantees, whatever the program does:

* **time**: one deadline covers the whole call.  A program that hangs, or that
  exits after leaving a detached child (``setsid sleep 1000 &``) holding its
  output pipe, costs at most ``timeout`` seconds: the pipe is polled, never
  waited on without a timeout (the hang ``subprocess.communicate()`` has when an
  orphan keeps the pipe open).
* **memory**: output (stdout and stderr together) is kept up to ``max_output``
  bytes; a program that prints more (``exec yes garbage``) is killed at once
  and the result says ``truncated``.
* **no process left behind**: the program runs in its own session with a
  unique marker variable (:data:`MARKER_VAR`) in its environment.  When the
  call ends, its process group is killed, then ``/proc`` is scanned for any
  process of this uid that still carries the marker or sits in the program's
  session (descendants that called ``setsid`` or double-forked), and those are
  killed too, a few rounds so a forking program cannot outrun it.  A program
  that scrubs its whole environment *and* leaves its session escapes the scan;
  nothing short of a cgroup catches that, and none is available to a library.
* stdin is ``/dev/null``; file descriptors other than 0-2 are closed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["MARKER_VAR", "DEFAULT_MAX_OUTPUT", "LOCAL_ERRNOS", "Result", "run", "marked_processes", "signals_as_exit",
           "die_with_parent"]

#: Environment variable set, with a per-call unique value, in every program run
#: by :func:`run`, so that its escaped descendants can be found in ``/proc``.
MARKER_VAR = "FLASHINFER_SM120_RUN_ID"

#: Default cap on kept output, bytes.  ``nvcc --version`` prints ~250 bytes.
DEFAULT_MAX_OUTPUT = 64 << 10

_KILL_ROUNDS = 5

#: Errors of *this* process's resources, not of the program: a start that fails
#: with one of these says nothing about the program (``fork`` refused under
#: ``RLIMIT_NPROC``, no descriptor left under ``RLIMIT_NOFILE``, the system's file
#: table or memory full, a signal).  Callers must not remember such a failure
#: as the program's (see :attr:`Result.local`).
LOCAL_ERRNOS = frozenset({errno.EAGAIN, errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.EINTR,
                          errno.ENOBUFS, errno.E2BIG})  # E2BIG: this process's environment is too large; threat-model: P1


@dataclass(frozen=True)
class Result:
    """What :func:`run` observed.

    Attributes:
        returncode: exit status (negative: killed by that signal); ``None`` when
            the program could not be started.
        output: stdout and stderr interleaved, at most ``max_output`` bytes.
        timed_out: the deadline passed before the program exited.
        truncated: the program printed more than ``max_output`` bytes and was killed.
        seconds: wall time of the whole call, clean-up included.
        error: why the program could not be started (``OSError`` text), else ``None``.
        errno: the ``OSError`` number when it could not be started, else ``None``.
    """

    returncode: int | None
    output: bytes
    timed_out: bool
    truncated: bool
    seconds: float
    error: str | None = None
    errno: int | None = None

    @property
    def local(self) -> bool:
        """The program could not be started for a reason of this process's
        resources (:data:`LOCAL_ERRNOS`), not the program's own."""
        return self.errno in LOCAL_ERRNOS

    @property
    def ok(self) -> bool:
        """Exited by itself with status 0, within the deadline and the output cap."""
        return self.returncode == 0 and not self.timed_out and not self.truncated

    def text(self) -> str:
        """``output`` decoded as UTF-8 (undecodable bytes replaced)."""
        return self.output.decode("utf-8", "replace")


def run(argv: Sequence[str], *, timeout: float, max_output: int = DEFAULT_MAX_OUTPUT,
        env: Mapping[str, str] | None = None, cwd: str | None = None, leave_running: bool = False) -> Result:
    """Run ``argv`` with a hard deadline and bounded output; never raises for the
    program's behaviour.

    Args:
        argv: program and arguments (no shell).
        timeout: seconds for the whole call; the program and every descendant
            still alive at the deadline are killed (``SIGKILL``).
        max_output: bytes of combined stdout/stderr kept; printing more kills the
            program (``truncated=True``).
        env: environment (default ``os.environ``); :data:`MARKER_VAR` is added.
        cwd: working directory.
        leave_running: the program starts a daemon that must outlive it (``sccache
            --start-server``): when the program exits by itself within the deadline and
            the output cap, what it left running is left alone (its output pipe is not
            waited on).  Past the deadline or the cap, everything is killed as usual.

    Returns:
        A :class:`Result`.  A program that cannot be started (absent, not
        executable) gives ``returncode=None`` and ``error``.
    """
    start = time.monotonic()
    deadline = start + max(0.0, timeout)
    marker = uuid.uuid4().hex
    child_env = dict(os.environ if env is None else env)
    child_env[MARKER_VAR] = marker
    try:
        r, w = os.pipe()
    except OSError as exc:  # EMFILE/ENFILE: no descriptor left in this process
        return Result(None, b"", False, False, time.monotonic() - start,
                      error=f"{argv[0]} could not be run: {exc.strerror or exc}", errno=exc.errno)
    try:
        proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=w, stderr=w,
                                env=child_env, cwd=cwd, close_fds=True, start_new_session=True)
    except OSError as exc:
        os.close(r)
        os.close(w)
        return Result(None, b"", False, False, time.monotonic() - start,
                      error=f"{argv[0]} could not be run: {exc.strerror or exc}", errno=exc.errno)
    os.close(w)
    chunks: list[bytes] = []
    size = 0
    timed_out = truncated = False
    try:
        os.set_blocking(r, False)
        poller = select.poll()
        poller.register(r, select.POLLIN | select.POLLHUP | select.POLLERR)
        eof = False
        while True:
            exited = _exited(proc)
            if eof and exited:
                break
            if exited:
                # The program is gone; what it printed is in the pipe already.
                # A descendant may still hold the pipe open: take what is there
                # and stop, do not wait for an EOF that may never come.
                size, eof, truncated = _drain(r, chunks, size, max_output)
                break
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            events = poller.poll(min(left, 0.05) * 1000)
            if events:
                size, eof, truncated = _drain(r, chunks, size, max_output)
                if truncated:
                    break
                if eof:
                    # Output closed; wait for the exit, still under the deadline
                    # (without reaping it: see _exited).
                    while not _exited(proc):
                        if time.monotonic() >= deadline:
                            timed_out = True
                            break
                        time.sleep(0.005)
                    break
    finally:
        os.close(r)
        if not (leave_running and not timed_out and not truncated and _exited(proc)):
            _kill_all(proc.pid, marker)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # unkillable (D state): leave it, do not hang
            pass
    out = b"".join(chunks)[:max_output]
    return Result(proc.returncode, out, timed_out, truncated, time.monotonic() - start)


def _exited(proc: subprocess.Popen) -> bool:
    """Whether the program has exited, WITHOUT reaping it (``waitid`` with
    ``WNOWAIT``): while it is an unreaped zombie its pid cannot be reused, so the
    process group and session that :func:`_kill_all` signals afterwards are still
    the program's own, never an unrelated process that got the same number."""
    if proc.returncode is not None:
        return True
    waitid = getattr(os, "waitid", None)
    if waitid is None:  # not Linux/BSD: fall back to reaping
        return proc.poll() is not None
    try:
        info = waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return proc.poll() is not None
    return info is not None


def _drain(fd: int, chunks: list[bytes], size: int, cap: int) -> tuple[int, bool, bool]:
    """Read what is available; returns (size, eof, over_cap)."""
    while True:
        try:
            b = os.read(fd, 1 << 16)
        except BlockingIOError:
            return size, False, False
        except OSError as exc:
            if exc.errno == errno.EINTR:
                continue
            return size, True, False
        if not b:
            return size, True, False
        if size < cap:
            chunks.append(b[: cap - size])
        size += len(b)
        if size > cap:
            return size, False, True


def marked_processes(marker: str, session: int | None = None) -> list[int]:
    """Pids of this uid's processes whose environment has ``MARKER_VAR=marker``
    or whose session id is ``session`` (Linux ``/proc``; empty elsewhere)."""
    me = os.getpid()
    uid = os.geteuid()
    needle = f"{MARKER_VAR}={marker}".encode()
    found: list[int] = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return found
    for name in names:
        if not name.isdigit() or int(name) == me:
            continue
        pid = int(name)
        try:
            if uid != 0 and os.stat(f"/proc/{name}").st_uid != uid:
                continue
            if session is not None:
                try:
                    if os.getsid(pid) == session:
                        found.append(pid)
                        continue
                except OSError:
                    pass
            with open(f"/proc/{name}/environ", "rb") as fh:
                data = fh.read(1 << 20)
        except OSError:
            continue
        if needle in data.split(b"\0"):
            found.append(pid)
    return found


def _kill_all(pid: int, marker: str) -> None:
    """Kill the program's group, then every marked or same-session process."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
    for _ in range(_KILL_ROUNDS):
        pids = [p for p in marked_processes(marker, session=pid) if not _is_zombie(p)]
        if not pids:
            return
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.01)


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return True
    # "pid (comm) S ...": the state follows the last ')'
    return stat[stat.rfind(b")") + 2: stat.rfind(b")") + 3] in (b"Z", b"X")


@contextlib.contextmanager
def signals_as_exit():
    """Within it, SIGTERM and SIGHUP end the program like Ctrl-C (``SystemExit(128 + signal)``), so
    ``finally`` clauses that stop child processes run: their default action ends Python at once
    (``build``'s ninja and compilers went on building into the module's directory after FlashInfer's
    per-module lock was released, beside the next build of it).  Only where the signal still has its default action and only in the main
    thread (a program with its own handlers keeps them); the old action comes back afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, _frame):
        raise SystemExit(128 + signum)

    old = {}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        try:
            if signal.getsignal(sig) is signal.SIG_DFL:
                old[sig] = signal.signal(sig, stop)
        except (ValueError, OSError):
            pass
    try:
        yield
    finally:
        for sig, action in old.items():
            signal.signal(sig, action)


def _libc_prctl():
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError, ImportError):  # not Linux/glibc: no parent-death signal
        return None


_PRCTL = _libc_prctl()
_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """``preexec_fn`` for a long-lived child (``ninja``): Linux sends it ``SIGTERM`` when this process
    dies, ``kill -9`` and the OOM killer included, so it stops its compilers instead of running on
    orphaned beside the next build (ninja stops its subprocesses on SIGTERM).  The ``prctl`` is looked
    up before any fork: the child runs one C call, nothing that takes a lock."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGTERM)
