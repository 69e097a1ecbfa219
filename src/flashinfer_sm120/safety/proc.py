"""The one bounded way to run a program (threat-model: P6, docs/safety.md section 8): one deadline, output capped,
and at the end every process of its group, its session or carrying :data:`MARKER_VAR` killed."""

from __future__ import annotations

import contextlib
import errno
import os
import select
import signal
import subprocess
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

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
    """What :func:`run` saw: ``returncode`` (negative: a signal; ``None``: not started, see ``error``)."""

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
    """Run ``argv`` (no shell, stdin ``/dev/null``) within ``timeout`` and ``max_output``; never raises."""
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
    buf = bytearray()
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
                eof, truncated = _drain(r, buf, max_output)
                if truncated:
                    break
        else:
            if not eof:  # gone; a descendant may hold the pipe open: take what is there, wait for no EOF
                truncated = _drain(r, buf, max_output)[1]
    finally:
        os.close(r)
        if not (leave_running and not timed_out and not truncated and exited(proc)):
            kill_all(proc.pid, marker)
        with contextlib.suppress(subprocess.TimeoutExpired):  # unkillable (D state): leave it, do not hang
            proc.wait(timeout=5)
    return Result(proc.returncode, bytes(buf[:max_output]), timed_out, truncated, time.monotonic() - start)


def exited(proc: subprocess.Popen) -> bool:
    """Whether the program exited, without reaping it: the group :func:`kill_all` signals is still the program's."""
    if proc.returncode is not None:
        return True
    try:
        return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return proc.poll() is not None


def _drain(fd: int, buf: bytearray, cap: int) -> tuple[bool, bool]:
    """Read what is available into ``buf`` (kept to ``cap + 1`` bytes); returns (eof, over_cap)."""
    while True:
        try:
            b = os.read(fd, 1 << 16)  # EINTR is retried by Python (PEP 475)
        except BlockingIOError:
            return False, False
        except OSError:
            return True, False
        if not b:
            return True, False
        buf += b[: cap + 1 - len(buf)]
        if len(buf) > cap:
            return False, True


def signal_group(pgid: int, sig: int) -> None:
    """``killpg``, where a group already gone is no error."""
    with contextlib.suppress(OSError):
        os.killpg(pgid, sig)


def kill_all(pid: int | None, marker: str, *, spare_session: int | None = None) -> None:
    """SIGKILL ``pid``'s group, then every process carrying ``MARKER_VAR=marker`` outside ``spare_session``."""
    if pid is not None:
        signal_group(pid, signal.SIGKILL)
    quiet = 0
    for _ in range(_KILL_ROUNDS):  # a few rounds, so a forking program cannot outrun it (P6)
        pids = _marked(marker, pid, spare_session)
        quiet = 0 if pids else quiet + 1
        if quiet == 2:  # two looks apart: a process inside execve() shows no environment for a moment
            return
        for p in pids:
            with contextlib.suppress(OSError):
                os.kill(p, signal.SIGKILL)
        time.sleep(0.01 if pids else 0.02)


def _marked(marker: str, session: int | None, spare: int | None) -> list[int]:
    """Pids of this uid's live processes in ``session`` or carrying ``MARKER_VAR=marker``, but in ``spare``."""
    needle = f"{MARKER_VAR}={marker}".encode()
    found: list[int] = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return found
    for name in names:
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            if os.geteuid() != 0 and os.stat(f"/proc/{name}").st_uid != os.geteuid():
                continue
            with open(f"/proc/{name}/stat", "rb") as fh:  # "pid (comm) S ...": the state follows the last ')'
                state = fh.read()
            sid = os.getsid(int(name))
            if state[state.rfind(b")") + 2:][:1] in (b"Z", b"X") or (spare is not None and sid == spare):
                continue
            if sid == session:
                found.append(int(name))
                continue
            with open(f"/proc/{name}/environ", "rb") as fh:
                data = fh.read(1 << 20)
        except OSError:
            continue
        if needle in data.split(b"\0"):
            found.append(int(name))
    return found


@contextlib.contextmanager
def signals_as_exit():
    """Within it, SIGTERM and SIGHUP end the program like Ctrl-C, so ``finally`` clauses stop child processes (P5)."""

    def stop(signum, _frame):
        raise SystemExit(128 + signum)

    old = {}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        with contextlib.suppress(ValueError, OSError):  # not the main thread: signals stay as they are
            if signal.getsignal(sig) is signal.SIG_DFL:
                old[sig] = signal.signal(sig, stop)
    try:
        yield
    finally:
        for sig, action in old.items():
            signal.signal(sig, action)


try:  # loaded here: a preexec_fn runs between fork and exec
    import ctypes

    _PRCTL = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError, ImportError):  # not Linux/glibc: no parent-death signal
    _PRCTL = None


def die_with_parent() -> None:
    """``preexec_fn`` for ``ninja``: SIGTERM when this process dies, ``kill -9`` included (P6)."""
    if _PRCTL is not None:
        _PRCTL(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
