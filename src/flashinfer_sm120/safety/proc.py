"""The one bounded way to run a program (threat-model: P6, docs/safety.md section 8): one deadline, output capped,
and at the end every process it started killed, whatever session, group or environment it took (:mod:`.reaper`)."""

from __future__ import annotations

import contextlib
import errno
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from flashinfer_sm120.safety import reaper

#: Default cap on kept output, bytes (``nvcc --version`` prints ~250).
DEFAULT_MAX_OUTPUT = 64 << 10

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


def _python() -> str:
    """A Python for the helper: this interpreter, the installation's where a program that embeds Python (uwsgi) left
    ``sys.executable`` naming itself, else ``/proc/self/exe`` (a path crossing a directory this uid cannot search)."""
    name = "python%d.%d" % sys.version_info[:2]
    paths = (sys.executable, *(os.path.join(prefix, "bin", name) for prefix in (sys.exec_prefix, sys.base_exec_prefix)))
    usable = (p for p in paths if os.path.basename(p).startswith("python") and os.access(p, os.X_OK))
    return next(usable, "/proc/self/exe")


def start(argv: Sequence[str], *, stdout, env: Mapping[str, str] | None = None, grace: float = 0.0,
          status_fd: int = -1, **popen) -> subprocess.Popen:
    """Start ``argv`` under its own :mod:`.reaper` (new session, stdin ``/dev/null``): SIGTERM to it stops ``argv``
    (after ``grace`` s) and kills all it started; it ends once they are gone."""
    # The child subreaper is this helper, never the calling process: a server that imported the package keeps
    # its own rule for who reaps its orphans, and each run's leftovers are told apart from another run's (P6).
    return subprocess.Popen([_python(), "-I", "-S", reaper.__file__, str(os.getpid()), f"{grace:g}", str(status_fd),
                             *argv],
                            stdin=subprocess.DEVNULL, stdout=stdout, stderr=subprocess.STDOUT,
                            env=dict(os.environ if env is None else env), close_fds=True,
                            pass_fds=() if status_fd < 0 else (status_fd,), start_new_session=True, **popen)


def run(argv: Sequence[str], *, timeout: float, max_output: int = DEFAULT_MAX_OUTPUT,
        env: Mapping[str, str] | None = None) -> Result:
    """Run ``argv`` (no shell, stdin ``/dev/null``) within ``timeout`` and ``max_output``; never raises."""
    t0 = time.monotonic()
    deadline = t0 + max(0.0, timeout)
    fds: list[int] = []
    try:
        fds += os.pipe()  # EMFILE/ENFILE: no descriptor left in this process
        fds += os.pipe()  # the reaper's status: "rc N", or "errno N" when the program could not start
        proc = start(argv, stdout=fds[1], env=env, status_fd=fds[3])
    except OSError as exc:
        for fd in fds:
            os.close(fd)
        return Result(None, b"", False, False, time.monotonic() - t0,
                      error=f"{argv[0]} could not be run: {exc.strerror or exc}", errno=exc.errno)
    r, w, status, status_w = fds
    os.close(w)
    os.close(status_w)
    buf = bytearray()
    timed_out = truncated = False
    try:
        os.set_blocking(r, False)
        poller = select.poll()
        poller.register(r, select.POLLIN | select.POLLHUP | select.POLLERR)
        eof = False
        while not exited(proc):  # the reaper ends once the program and all it left are gone
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
            if not eof:  # a set-uid leftover may hold the pipe open: take what is there, wait for no EOF
                truncated = _drain(r, buf, max_output)[1]
    finally:
        os.close(r)
        if not exited(proc):  # past the deadline or the cap: the reaper kills all the program started
            os.kill(proc.pid, signal.SIGTERM)  # not reaped yet (exited): the pid is still the reaper's
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=reaper.KILL_S + 5)
        if proc.returncode is None:  # a reaper that does not end (stopped, or in D state): its group, then leave it
            signal_group(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        os.set_blocking(status, False)
        said: list[bytes] = []
        with contextlib.suppress(OSError):
            said = os.read(status, 64).split()
        os.close(status)
    if said[:1] == [b"errno"]:
        code = int(said[1])
        return Result(None, b"", False, False, time.monotonic() - t0,
                      error=f"{argv[0]} could not be run: {os.strerror(code)}", errno=code)
    rc = int(said[1]) if said[:1] == [b"rc"] else proc.returncode
    return Result(rc, bytes(buf[:max_output]), timed_out, truncated, time.monotonic() - t0)


def exited(proc: subprocess.Popen) -> bool:
    """Whether the program exited, without reaping it: its pid, which a signal names, is still the program's."""
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


@contextlib.contextmanager
def signals_as_exit():
    """Within it, SIGTERM and SIGHUP end the program like Ctrl-C, so ``finally`` clauses stop child processes (P5)."""

    def stop(signum, _frame):
        os.write(2, f"flashinfer-sm120: stopped by {signal.Signals(signum).name}\n".encode())  # told (P8)
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
