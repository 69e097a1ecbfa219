"""The one scheduler of warm-up builds: ``jobs`` compile slots (and memory) shared by modules, each built by its own
ninja under FlashInfer's per-module lock, every step watched, every ninja stopped with what it started (P5, P6)."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from filelock import FileLock  # a dependency (and FlashInfer's)

from flashinfer_sm120.errors import PlaceError
from flashinfer_sm120.safety import proc as _proc
from flashinfer_sm120.safety import reaper
from flashinfer_sm120.safety.formats.base import plural
from flashinfer_sm120.warmup.moddir import STATUS_RE, command, dry_run, ninja_env, step_name, steps, try_take

_LINE_MAX = 1 << 16  # characters of one line of ninja's output kept (the rest of it dropped)
_FAILED_MAX = 2000  # lines of a failure's output kept
_STOP_S = 10  # seconds a stopped step or ninja gets after SIGTERM before SIGKILL
#: Default deadline of one compile step (``build --step-timeout``): a wide margin over the longest
#: compile (sampling.cu: minutes, more on two loaded cores).
STEP_TIMEOUT_S = 3600
BEAT_S = 30  # seconds between progress lines


@dataclasses.dataclass
class Job:
    """One module to build; ``mem``: the bytes one of its compile steps takes (0: not counted)."""

    label: str
    build_dir: Path
    ninja_path: Path
    lock_path: Path | None = None
    mem: int = 0


@dataclasses.dataclass
class Result:
    """``status``: ``built``, ``up to date`` or ``failed``; ``peak_rss``: of its largest process (``wait4``)."""

    label: str
    status: str
    seconds: float = 0.0
    error: str | None = None
    peak_rss: int | None = None


class _Running:
    def __init__(self, job: Job, steps: int, slots: int, lock: FileLock, events: queue.Queue) -> None:
        self.job, self.steps, self.slots = job, steps, slots
        self.lock = lock  # FlashInfer's lock on the module, released when it ends
        self.finished = 0  # ninja's own count of finished steps (%f), failed ones included
        self.pending_since = 0.0
        self.t0 = time.monotonic()
        self.lines: collections.deque[str] = collections.deque(maxlen=40)  # the last lines, for a failure
        self.pending: str | None = None  # last status line, not yet known to have succeeded
        self.failed: list[str] = []
        self.in_failure = False
        self.peak_rss: int | None = None
        self.seen: dict[int, list] = {}  # step pid -> [its file, first seen, SIGTERM sent at]
        self.running: list = []  # steps running at the last watch()
        self.timed_out: list[str] = []  # what was stopped at its deadline, for the error
        # under its own reaper: nothing a step leaves holds ninja's output or outlives the build (P6); SIGTERM
        # to it stops ninja, which stops its compilers, and after _STOP_S kills all; so does this process's death
        self.proc = _proc.start(command(job, "-j", str(slots)), stdout=subprocess.PIPE, env=ninja_env(),
                                grace=_STOP_S, text=True, errors="replace")
        self.thread = threading.Thread(target=self._read, args=(events,), daemon=True)
        self.thread.start()

    def _read(self, events: queue.Queue) -> None:
        assert self.proc.stdout is not None
        cut = False
        while True:  # bounded lines: a ninja printing one endless line must not fill memory
            line = self.proc.stdout.readline(_LINE_MAX)
            if not line:
                break
            if not cut:
                events.put((self, line.rstrip("\n")))
            cut = not line.endswith("\n")
        with contextlib.suppress(ChildProcessError):  # reaped here for its tree's peak RSS, or by Popen.wait() (Ctrl-C)
            _, status, usage = os.wait4(self.proc.pid, 0)
            self.proc.returncode = os.waitstatus_to_exitcode(status)
            self.peak_rss = usage.ru_maxrss * 1024  # kilobytes on Linux
        events.put((self, None))

    def watch(self, now: float, step_timeout: float) -> None:
        """Find the steps ninja runs; stop one past ``step_timeout`` (P6)."""
        self.running = []
        found = steps(self.proc.pid)  # what an exited step left, its reaper kills
        for pid, cmd in found.items():
            seen = self.seen.setdefault(pid, [step_name(cmd), now, None])
            if now - seen[1] > step_timeout and seen[2] is None:
                seen[2] = now
                self.timed_out.append(f"{seen[0]}: stopped after {step_timeout:g} s, the deadline of one step "
                                      "(build --step-timeout MINUTES)")
                _proc.signal_group(pid, signal.SIGTERM)  # ninja puts each step in its own group
            elif seen[2] is not None and now - seen[2] > _STOP_S:
                _proc.signal_group(pid, signal.SIGKILL)
            self.running.append((seen[0], now - seen[1]))
        self.seen = {pid: self.seen[pid] for pid in found}

    def committed(self) -> int:
        """Compile slots this module can still use; the link runs last and holds none (short and light)."""
        linking = sum(1 for name, _ in self.running if name.startswith("link "))
        left = max(0, self.steps - self.finished - len(self.running))
        if left and not linking:
            left -= 1  # the link has not started: it is among the steps left
        return min(self.slots, len(self.running) - linking + left)


def run_pool(jobs: list[Job], max_jobs: int, stream=None, mem_budget: int | None = None,
             *, intro: tuple[str, ...] = (), step_timeout: float = STEP_TIMEOUT_S,
             beat_s: float = BEAT_S) -> list[Result]:
    """Build ``jobs`` sharing ``max_jobs`` compile slots and ``mem_budget`` bytes (``None``: not counted), each
    under FlashInfer's per-module lock, progress on ``stream``; one :class:`Result` per job, in order."""
    stream = stream or sys.stderr
    results: dict[str, Result] = {}
    pending: list[tuple[Job, int]] = []
    for job in jobs:
        try:
            n = len(dry_run(job))
        except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
            results[job.label] = Result(job.label, "failed", error=str(exc))
            stream.write(f"FAILED {job.label}: {exc}\n")
            continue
        if n:
            pending.append((job, n))
        else:
            results[job.label] = Result(job.label, "up to date")
    # most steps first (longest-processing-time order, stable; measured by benchmarks/bench_build.py)
    pending.sort(key=lambda t: -t[1])
    total = sum(n for _, n in pending)
    if pending:
        stream.write("".join(f"flashinfer-sm120: {line}\n" for line in intro))
        stream.write(f"to build: {plural(len(pending), 'module')}, {plural(total, 'compile/link step')}, "
                     f"-j {max_jobs}: " + ", ".join(f"{j.label} ({n})" for j, n in pending) + "\n")
    stream.flush()
    pool = _Pool(pending, results, stream, total, beat_s)
    with _proc.signals_as_exit():  # SIGTERM/SIGHUP run the clean-up, as Ctrl-C does
        try:
            pool.run(max_jobs, mem_budget, step_timeout)
        finally:
            pool.stop()
    return [results[j.label] for j in jobs]


class _Pool:
    """Starts modules while compile slots and memory are free, reads their ninja's output, ends each; says a
    line per finished or failed step, and every ``beat_s`` the steps that run and what is left."""

    def __init__(self, pending: list[tuple[Job, int]], results: dict[str, Result], stream, total: int,
                 beat_s: float) -> None:
        self.pending, self.results, self.stream, self.total, self.beat_s = pending, results, stream, total, beat_s
        self.done = 0
        self.t0 = self.last_beat = time.monotonic()
        self.events: queue.Queue = queue.Queue()
        self.running: dict[str, _Running] = {}
        self.waiting_said: set[str] = set()

    def say(self, text: str, step: bool = False) -> None:
        self.done += step
        self.stream.write(f"[{self.done}/{self.total}] {text}  ({time.monotonic() - self.t0:.0f} s)\n")
        self.stream.flush()

    def run(self, max_jobs: int, mem_budget: int | None, step_timeout: float) -> None:
        while self.pending or self.running:
            committed = {lbl: r.committed() for lbl, r in self.running.items()}
            free = max_jobs - sum(committed.values())
            mem_left = (mem_budget or 0) - sum(  # not counted without a budget
                committed[lbl] * r.job.mem for lbl, r in self.running.items())
            for item in list(self.pending):
                if free < 1:
                    break
                job, n = item
                fit = free if mem_budget is None or job.mem <= 0 else int(mem_left // job.mem)
                if fit < 1 and self.running:
                    continue  # a lighter module further on may fit; with nothing running, one step always runs
                give = max(1, min(free, n - 1, fit))  # n - 1: the link runs last
                if self.start(item, give):
                    free -= give
                    mem_left -= give * job.mem
            self.drain(timeout=0.5)
            now = time.monotonic()
            for r in self.running.values():
                if r.pending is not None and now - r.pending_since > 0.3:
                    self.confirm(r)  # ninja prints FAILED right after the status line
                r.watch(now, step_timeout)
            if now - self.last_beat >= self.beat_s:
                self.last_beat = now
                shown = ", ".join(f"{lbl}/{name} ({s:.0f} s)" for lbl, r in self.running.items()
                                  for name, s in r.running) or "none (waiting)"
                self.say(f"running: {shown}; left: {plural(self.total - self.done, 'step')}")

    def start(self, item: tuple[Job, int], slots: int) -> bool:
        """Start ``item``'s ninja under FlashInfer's per-module lock; whether it started (a module another
        process holds waits; one built meanwhile is found up to date by its ninja)."""
        job, n = item
        try:
            # no lock path: a FileLock never taken, whose release() does nothing
            lock = FileLock(os.devnull) if job.lock_path is None else try_take(job.lock_path, job.label)
        except PlaceError as exc:
            self.pending.remove(item)
            self.total -= n
            self.results[job.label] = Result(job.label, "failed", error=str(exc))
            self.say(f"FAILED {job.label}: {exc}")
            return False
        if lock is None:
            if job.label not in self.waiting_said:
                self.waiting_said.add(job.label)
                self.say(f"{job.label}: waiting for another process building it (lock {job.lock_path})")
            return False
        self.pending.remove(item)
        self.running[job.label] = _Running(job, n, slots, lock, self.events)
        return True

    def stop(self) -> None:
        """Stop every ninja through its reaper (it kills all ninja started after ``_STOP_S``, P6), release the
        locks; signals wait."""
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGHUP, signal.SIGINT})
        try:
            for r in self.running.values():
                if not _proc.exited(r.proc):  # not reaped yet: the pid is still the reaper's
                    os.kill(r.proc.pid, signal.SIGTERM)
            deadline = time.monotonic() + _STOP_S + 2 * reaper.KILL_S
            for r in self.running.values():
                while not _proc.exited(r.proc) and time.monotonic() < deadline:
                    time.sleep(0.05)
                if not _proc.exited(r.proc):  # a reaper that does not end: its group
                    _proc.signal_group(r.proc.pid, signal.SIGKILL)
                r.proc.wait()
            for r in self.running.values():
                r.lock.release()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)

    def drain(self, timeout: float) -> None:
        """Handle ninja's output for up to ``timeout`` s, returning once a slot may be free."""
        deadline = time.monotonic() + timeout
        freed = False
        while True:
            try:
                r, line = self.events.get(timeout=0 if freed else max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return
            if line is None:
                self.finish(r)
                freed = True
                continue
            r.lines.append(line)
            m = STATUS_RE.match(line)
            if m or line.startswith("ninja: build stopped"):
                self.confirm(r)
                r.in_failure = False
                if m:
                    r.pending, r.pending_since = m.group(3), time.monotonic()
                    r.finished = max(r.finished, int(m.group(1)))
                    freed = True
            elif line.startswith("FAILED: "):
                what = step_name(r.pending or line)
                r.pending = None
                r.in_failure = True
                r.failed.append(f"{what}:")
                self.say(f"FAILED {r.job.label}: {what}", step=True)
            elif r.in_failure and len(r.failed) < _FAILED_MAX:
                r.failed.append(line)

    def confirm(self, r: _Running) -> None:
        """Say the step ninja last announced finished: no FAILED line followed it."""
        if r.pending is not None:
            what = step_name(r.pending)
            verb = "linked" if what.startswith("link ") else "compiled"
            self.say(f"{r.job.label}: {verb} {what.removeprefix('link ')}", step=True)
            r.pending = None

    def finish(self, r: _Running) -> None:
        rc = r.proc.wait()  # its reaper ends once nothing ninja started is left (P6)
        label = r.job.label
        if rc == 0 and "ninja: no work to do." in r.lines:  # built by another process while we waited for its lock
            self.total -= r.steps
            self.results[label] = Result(label, "up to date")
            self.say(f"up to date: {label}")
        elif rc == 0:
            self.confirm(r)
            self.results[label] = Result(label, "built", round(time.monotonic() - r.t0, 1), peak_rss=r.peak_rss)
            self.say(f"done: {label}")
        else:
            err_lines = [x for x in r.failed if x.strip()] or list(r.lines)
            errors = [x for x in err_lines if "error" in x.lower()]
            text = "\n".join(r.timed_out + (errors or err_lines)[:30])
            self.results[label] = Result(label, "failed", round(time.monotonic() - r.t0, 1), text, r.peak_rss)
            self.say(f"failed: {label} (ninja exit {rc}):\n    " + text.replace("\n", "\n    "))
        del self.running[label]
        r.lock.release()

