"""``python -I -S reaper.py PARENT GRACE STATUS_FD PROGRAM ARGS...`` (:func:`.proc.start`): PROGRAM under a child
subreaper, which kills every descendant re-parented to it, whatever session, group or environment it took (P6)."""

import contextlib
import os
import signal
import sys
import time

_PR_SET_PDEATHSIG, _PR_SET_CHILD_SUBREAPER = 1, 36  # <linux/prctl.h>; the subreaper: Linux 3.4
KILL_S = 5.0  # how long the end keeps killing; a process in uninterruptible sleep (D state) is then left


def parents() -> dict[int, int]:
    """Every process's parent pid, from ``/proc/*/stat`` (``/proc/PID/task/TID/children`` is not in every kernel)."""
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as fh:  # "pid (comm) S ppid ...": after the last ')'
                    out[int(name)] = int(fh.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    return out


def main(parent: str, grace: str, status_fd: str, *argv: str) -> int:
    import ctypes  # here: :mod:`.proc` imports this file for its path and KILL_S only (only the standard library)

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_CHILD_SUBREAPER, 1)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)  # the runner's death, kill -9 included, ends the run
    watched = {signal.SIGCHLD, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, watched)  # taken by sigtimedwait below, never by a handler
    if os.getppid() != int(parent):  # the runner died before the prctl: nothing to run for
        return 128 + signal.SIGTERM
    status = int(status_fd)
    if status >= 0:
        os.set_inheritable(status, False)  # the runner's, not the program's
    try:
        # the program gets the signals as the runner's children get them (Python ignores SIGPIPE, SIGXFSZ)
        prog = os.posix_spawnp(argv[0], argv, os.environ, setsigmask=(),
                               setsigdef=(signal.SIGPIPE, signal.SIGXFSZ))
    except OSError as exc:
        if status >= 0:
            os.write(status, b"errno %d" % (exc.errno or 0))
        else:
            os.write(2, f"{argv[0]} could not be run: {exc.strerror or exc}\n".encode())
        return 127
    me, rc, stop_at, ending_at, grace_s, wait_s = os.getpid(), None, None, None, float(grace), 0.01
    while True:
        with contextlib.suppress(ChildProcessError):
            while (reaped := os.waitpid(-1, os.WNOHANG))[0]:
                if reaped[0] == prog:
                    rc = os.waitstatus_to_exitcode(reaped[1])
        now = time.monotonic()
        if ending_at is None and (rc is not None or (stop_at is not None and now - stop_at >= grace_s)):
            ending_at = now
        if ending_at is not None and now - ending_at > KILL_S:
            break
        kids = [k for k, ppid in parents().items()
                if ppid == me and (ending_at is not None or k != prog)]
        if rc is not None and not kids:
            break
        for kid in kids:  # only children: their pids stay ours until reaped here, so none is reused meanwhile
            with contextlib.suppress(OSError):  # another uid's (a set-uid program): left, as the kernel leaves it to us
                os.kill(kid, signal.SIGKILL)
        if kids:
            wait_s = 0.01
        info = signal.sigtimedwait(watched, wait_s)
        wait_s = min(wait_s * 2, 0.5)  # a child adopted meanwhile sends no signal: look again, less often
        if info is not None and info.si_signo == signal.SIGTERM and stop_at is None:
            stop_at = time.monotonic()
            if rc is None and grace_s > 0:
                os.kill(prog, signal.SIGTERM)  # ninja stops its compilers itself
    if status >= 0:
        os.write(status, b"rc %d" % (-signal.SIGKILL if rc is None else rc))
    return 128 + signal.SIGKILL if rc is None else rc if rc >= 0 else 128 - rc


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
