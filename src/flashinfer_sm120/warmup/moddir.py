"""A FlashInfer module directory as warm-up builds use it: FlashInfer's per-module lock, the ninja the server runs,
its dry run and status lines, and the steps it runs, read from Linux ``/proc`` (threat-model: P5, P6)."""

from __future__ import annotations

import contextlib
import os
import re
import sys
import time
from collections.abc import Callable, Iterator

from filelock import FileLock, Timeout  # a dependency (and FlashInfer's)

from flashinfer_sm120.errors import PlaceError
from flashinfer_sm120.safety import proc as _proc
from flashinfer_sm120.safety.fs.proclocks import foreign, holders

SAY_EVERY_S = 60.0  # seconds between two "still waiting" lines for a module's lock
#: A ninja status line under ``NINJA_STATUS="[%f/%t] "``: finished, total, the step.  At most 9 ASCII
#: digits: ninja passes the compilers' output through, and ``int()`` refuses over 4300 digits.
STATUS_RE = re.compile(r"^\[([0-9]{1,9})/([0-9]{1,9})\] (.*)$")
_DRY_RUN_MAX = 16 << 20  # ninja -n of a FlashInfer module: a few KB per step


def try_take(path: str | os.PathLike, label: str = "") -> FileLock | None:
    """The lock at ``path`` if free now, else None; :raises PlaceError: another uid holds it (it could hold
    it for ever, so it is not waited for, P6)."""
    lock = FileLock(str(path), thread_local=False)
    with contextlib.suppress(Timeout):
        lock.acquire(timeout=0)
        return lock
    if (h := foreign(path)) is not None:
        raise PlaceError(f"{label}: FlashInfer's lock {path} is held by pid {h.pid} of uid {h.uid}, not you; it "
                         f"can hold your build off for as long as it likes, so it is not waited for. Fix: build in "
                         f"a JIT directory others cannot enter (mkdir -m 700 ~/fi-jit; "
                         f"FLASHINFER_WORKSPACE_BASE=~/fi-jit), or ask uid {h.uid} to end pid {h.pid}")
    return None


@contextlib.contextmanager
def held(path: str | os.PathLike, label: str, say: Callable[[str], None] | None = None, *,
         every: float = SAY_EVERY_S, poll: float = 0.5) -> Iterator[None]:
    """Hold the lock at ``path``, waited for while this user's processes hold it (told to ``say``, default
    stderr, every ``every`` s); :raises PlaceError: another uid holds it."""
    say = say or (lambda line: print(f"flashinfer-sm120: {line}", file=sys.stderr, flush=True))
    t0, said = time.monotonic(), None
    while (lock := try_take(path, label)) is None:
        now = time.monotonic()
        if said is None or now - said >= every:
            said = now
            pids = ", ".join(str(x.pid) for x in holders(path)) or "not visible here"
            say(f"{label}: waiting for another process building it (FlashInfer's lock {path}, held by "
                f"pid {pids}){f'; {round(now - t0)} s so far' if now > t0 + 1 else ''}")
        time.sleep(poll)
    try:
        yield
    finally:
        lock.release()


def ninja_binary() -> str:
    """The ninja the server will run (another release's ``.ninja_log`` would make it rebuild); :raises NinjaError."""
    from flashinfer_sm120.core.toolkit import ninja

    return ninja.choose().path


def command(job, *extra: str) -> list[str]:
    return [ninja_binary(), "-C", str(job.build_dir.resolve()), "-f", str(job.ninja_path.resolve()), *extra]


def ninja_env() -> dict:
    """The environment with ninja's status format and a private temporary directory (P5)."""
    from flashinfer_sm120.safety.fs.atomic import build_env

    return build_env(dict(os.environ, NINJA_STATUS="[%f/%t] "))


def dry_run(job) -> list[str]:
    """Commands ``ninja -n`` says it would run for ``job`` (empty: up to date); :raises NinjaError."""
    from flashinfer_sm120.core.toolkit.ninja import NinjaError

    res = _proc.run(command(job, "-n"), timeout=120, max_output=_DRY_RUN_MAX, env=ninja_env())
    if not res.ok:
        why = ("timed out" if res.timed_out else f"printed more than {_DRY_RUN_MAX} bytes" if res.truncated
               else res.error or f"exit {res.returncode}")
        raise NinjaError(f"ninja -n failed for {job.label} ({why}): {res.text()[-2000:]}")
    return [m.group(3) for m in map(STATUS_RE.match, res.text().splitlines()) if m]


def steps(reaper: int) -> dict[int, str]:
    """``{pid: COMMAND}`` of the children of the processes under ``reaper`` (ninja) running ``/bin/sh -c COMMAND``,
    from Linux ``/proc``."""
    from flashinfer_sm120.safety.reaper import parents as all_parents

    parents = all_parents()
    ninjas = {pid for pid, parent in parents.items() if parent == reaper}
    out = {}
    for pid in (pid for pid, parent in parents.items() if parent in ninjas):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if len(argv) > 2 and argv[1] == "-c":  # else not yet /bin/sh -c (still ninja's argv), or exited (none)
            out[pid] = argv[2]
    return out


def step_name(command: str) -> str:
    """``sampling.cu`` for a compile step, ``link x.so`` for a link, else the command's start."""
    m = re.search(r" -c (\S+)", command)
    if m:
        return os.path.basename(m.group(1))
    so = re.search(r"-o (\S+\.so)\b", command)
    return f"link {os.path.basename(so.group(1))}" if so else command[:60]
