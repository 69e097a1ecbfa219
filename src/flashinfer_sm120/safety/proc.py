"""The one bounded way to run a program (threat-model: P6, docs/safety.md section 8): one deadline,
the output pipe polled (a detached child holding it open would hang ``communicate()``) and capped, and
at the end every process of its group, its session or carrying its :data:`MARKER_VAR` killed (one that
scrubs its environment *and* leaves its session escapes: only a cgroup would catch that)."""
# threat-model: P6 (deadline, output cap, process-group kill)

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

__all__ = ["MARKER_VAR", "DEFAULT_MAX_OUTPUT", "LOCAL_ERRNOS", "Result", "run", "signals_as_exit",
           "die_with_parent", "exited", "kill_all", "signal_group"]

#: Set, with a per-call unique value, in every program :func:`run` starts: finds its escaped descendants.
MARKER_VAR = "FLASHINFER_SM120_RUN_ID"

#: Default cap on kept output, bytes (``nvcc --version`` prints ~250).
DEFAULT_MAX_OUTPUT = 64 << 10

_KILL_ROUNDS = 5

#: Errors of *this* process's resources, not the program's: never remembered as the program's failure.
LOCAL_ERRNOS = frozenset({errno.EAGAIN, errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.EINTR,
                          errno.ENOBUFS, errno.E2BIG})  # E2BIG: this process's environment is too large; threat-model: P1


@dataclass(frozen=True)
class Result:
    """What :func:`run` observed: ``returncode`` (negative: the signal; ``None``: not started, see
    ``error``/``errno``), ``output`` (stdout and stderr, capped), ``timed_out``, ``truncated``, ``seconds``."""

    returncode: int | None
    output: bytes
    timed_out: bool
    truncated: bool
    seconds: float
    error: str | None = None
    errno: int | None = None

    @property
    def local(self) -> bool:
        return self.errno in LOCAL_ERRNOS

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out and not self.truncated

    def text(self) -> str:
        return self.output.decode("utf-8", "replace")


def run(argv: Sequence[str], *, timeout: float, max_output: int = DEFAULT_MAX_OUTPUT,
        env: Mapping[str, str] | None = None, cwd: str | None = None, leave_running: bool = False) -> Result:
    """Run ``argv`` (no shell, stdin ``/dev/null``) within ``timeout`` seconds and ``max_output`` bytes;
    never raises for the program's behaviour.  ``leave_running``: a daemon it starts may outlive it
    (``sccache --start-server``) when it exits by itself within the bounds."""
    start = time.monotonic()
    deadline = start + max(0.0, timeout)
    marker = uuid.uuid4().hex
    child_env = dict(os.environ if env is None else env)
    child_env[MARKER_VAR] = marker
    r = -1
    try:
        r, w = os.pipe()  # EMFILE/ENFILE: no descriptor left in this process
        try:
            proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=w, stderr=w,
                                    env=child_env, cwd=cwd, close_fds=True, start_new_session=True)
        finally:
            os.close(w)
    except OSError as exc:
        if r >= 0:
            os.close(r)
        return Result(None, b"", False, False, time.monotonic() - start,
                      error=f"{argv[0]} could not be run: {exc.strerror or exc}", errno=exc.errno)
    chunks: list[bytes] = []
    size = 0
    timed_out = truncated = False
    try:
        os.set_blocking(r, False)
        poller = select.poll()
        poller.register(r, select.POLLIN | select.POLLHUP | select.POLLERR)
        eof = False
        while not exited(proc):
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            if eof:  # output closed: wait for the exit, without reaping it (see exited)
                time.sleep(min(left, 0.005))
            elif poller.poll(min(left, 0.05) * 1000):
                size, eof, truncated = _drain(r, chunks, size, max_output)
                if truncated:
                    break
        else:
            if not eof:  # gone; a descendant may hold the pipe open: take what is there, wait for no EOF
                size, eof, truncated = _drain(r, chunks, size, max_output)
    finally:
        os.close(r)
        if not (leave_running and not timed_out and not truncated and exited(proc)):
            kill_all(proc.pid, marker)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # unkillable (D state): leave it, do not hang
            pass
    out = b"".join(chunks)[:max_output]
    return Result(proc.returncode, out, timed_out, truncated, time.monotonic() - start)


def exited(proc: subprocess.Popen) -> bool:
    """Whether the program has exited, without reaping it: an unreaped zombie's pid cannot be reused, so
    the group and session :func:`kill_all` signals are still the program's."""
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


def signal_group(pgid: int, sig: int) -> None:
    """``killpg``, where a group already gone is no error."""
    try:
        os.killpg(pgid, sig)
    except OSError:
        pass


def kill_all(pid: int | None, marker: str, *, spare_session: int | None = None) -> None:
    """SIGKILL the group and session program ``pid`` leads (``None``: reaped), then every process
    carrying ``MARKER_VAR=marker`` outside ``spare_session``, a few rounds so a forking program cannot
    outrun it (P6)."""
    if pid is not None:
        signal_group(pid, signal.SIGKILL)
    for _ in range(_KILL_ROUNDS):
        pids = [p for p in _marked(marker, pid) if not _is_zombie(p) and (spare_session is None or _sid(p) != spare_session)]
        if not pids:
            return
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.01)


def _marked(marker: str, session: int | None) -> list[int]:
    """Pids of this uid's processes carrying ``MARKER_VAR=marker`` or in ``session`` (Linux ``/proc``)."""
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


def _sid(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:
        return None


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
    """Within it, SIGTERM and SIGHUP end the program like Ctrl-C (``SystemExit(128 + signal)``), so the
    ``finally`` clauses that stop child processes run (P5); main thread, default actions only."""
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
    """``preexec_fn`` for ``ninja``: Linux sends it ``SIGTERM`` when this process dies (``kill -9``
    included), so it stops its compilers.  One C call looked up before the fork: no lock in the child."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGTERM)
