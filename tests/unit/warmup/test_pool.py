"""The job pool: shared slots, truthful progress (no "compiled" for a failed step,
up-to-date said once), per-module ninja logs that FlashInfer's own ninja run accepts."""

import io
import os
import signal
import subprocess
import threading
import time

from flashinfer_sm120.warmup import moddir, plan, pool
from helpers.warm import fake_job, most_at_once



def test_builds_reports_and_second_run_is_up_to_date_once(tmp_path):
    jobs = [fake_job(tmp_path, "a", 3), fake_job(tmp_path, "b", 2)]
    out = io.StringIO()
    res = pool.run_pool(jobs, 2, out, intro=("jobs: 2",))
    assert [r.status for r in res] == ["built", "built"], out.getvalue()
    text = out.getvalue()
    assert text.startswith("flashinfer-sm120: jobs: 2\n")
    assert "to build: 2 modules, 7 compile/link steps, -j 2" in text
    assert "a: compiled s0.cu" in text and "b: linked b.so" in text and "[7/7]" in text
    # FlashInfer's own run (ninja in the module dir, the one the patch puts first on PATH) finds nothing to do
    for j in jobs:
        proc = subprocess.run([moddir.ninja_binary(), "-C", str(j.build_dir), "-f", str(j.ninja_path)],
                              capture_output=True, text=True)
        assert "no work to do" in proc.stdout
    out = io.StringIO()
    res = pool.run_pool(jobs, 2, out, intro=("jobs: 2",))
    assert [r.status for r in res] == ["up to date", "up to date"]
    assert out.getvalue() == ""  # nothing to build: the caller's report says "up to date" once


def test_a_module_built_by_another_process_while_its_lock_was_held_is_up_to_date(tmp_path):
    """The pool waits for FlashInfer's lock a server holds; what that server built meanwhile is found up to date
    by the module's own ninja, not reported as built here (P5)."""
    from filelock import FileLock

    job = fake_job(tmp_path, "m", 1, sleep=0)
    theirs = FileLock(str(job.lock_path), thread_local=False)
    theirs.acquire()
    out = io.StringIO()
    res: list = []
    worker = threading.Thread(target=lambda: res.extend(pool.run_pool([job], 1, out, beat_s=0.2)))
    try:
        worker.start()
        deadline = time.monotonic() + 30
        while "waiting for another process" not in out.getvalue() and time.monotonic() < deadline:
            time.sleep(0.05)
        subprocess.run([moddir.ninja_binary(), "-C", str(job.build_dir), "-f", str(job.ninja_path)],
                       capture_output=True, check=True)  # the ninja the pool runs: another one's log rebuilds
    finally:
        theirs.release()
    worker.join(60)
    assert [r.status for r in res] == ["up to date"], out.getvalue()
    assert "up to date: m" in out.getvalue() and "done: m" not in out.getvalue()


def test_failure_is_never_reported_as_compiled(tmp_path):
    jobs = [fake_job(tmp_path, "good", 1), fake_job(tmp_path, "bad", 2, fail="s1.cu")]
    out = io.StringIO()
    res = pool.run_pool(jobs, 1, out)
    by = {r.label: r for r in res}
    assert by["good"].status == "built" and by["bad"].status == "failed"
    assert "identifier boom is undefined" in by["bad"].error
    text = out.getvalue()
    assert "FAILED bad: s1.cu" in text and "bad: compiled s1.cu" not in text
    assert "done: bad" not in text and "failed: bad" in text


def test_never_more_steps_than_slots(tmp_path):
    """Three modules, two slots: at most two compile steps at any moment (a link may run beside
    them: it holds no compile slot).  Read from the steps' own start/end record, not by sampling
    /proc, which under load sees one module's step end and another's start as both running."""
    jobs = [fake_job(tmp_path, f"m{i}", 3, sleep=0.6) for i in range(3)]
    res = pool.run_pool(jobs, 2, io.StringIO())
    assert all(r.status == "built" for r in res)
    log = (tmp_path / "order.log").read_text().splitlines()
    assert sum(line.startswith("start ") for line in log) == 9 and sum(line.startswith("end ") for line in log) == 9
    assert 1 <= most_at_once(log) <= 2, log


def test_gencode_summary_says_sass_or_ptx():
    text = ("-gencode=arch=compute_120f,code=sm_120f -gencode=arch=compute_90a,code=sm_90a "
            "-gencode=arch=compute_121a,code=compute_121a")
    assert plan.gencode_summary(text) == ["PTX compute_121a", "SASS sm_120f", "SASS sm_90a"]


def test_spare_slot_goes_to_the_next_module(tmp_path):
    """a has 3 compile steps and gets both slots; while its last step runs alone, b starts.
    One of a's steps is held until b's step has started (a readiness signal, not a sleep): a pool
    that kept the spare slot would start b only after a's link, and the log would show it."""
    b_started = f"start {tmp_path}/b/s0.cu"
    jobs = [fake_job(tmp_path, "a", 3, sleep=0.1, hold=("s2.cu", b_started)),
            fake_job(tmp_path, "b", 1, sleep=0.1)]
    res = pool.run_pool(jobs, 2, io.StringIO())
    assert [r.status for r in res] == ["built", "built"]
    order = (tmp_path / "order.log").read_text().splitlines()
    assert order.index(b_started) < order.index(f"link {tmp_path}/a/a.so"), order


def test_the_module_with_the_most_steps_starts_first(tmp_path):
    """Longest first: a many-step module queued behind one-step ones would compile its steps
    on the few slots left while a slot stays idle.  The order given is kept among modules of equal size.  one1's step
    is held until a step of many started, so one2 cannot take a slot first on a slow machine."""
    jobs = [fake_job(tmp_path, "one1", 1, sleep=0.1, hold=("s0.cu", "start .*/many/.*")),
            fake_job(tmp_path, "one2", 1, sleep=0.1), fake_job(tmp_path, "many", 3, sleep=0.1)]
    out = io.StringIO()
    res = pool.run_pool(jobs, 2, out)
    assert [r.status for r in res] == ["built", "built", "built"], out.getvalue()  # results in the order given
    assert "to build: 3 modules, 8 compile/link steps, -j 2: many (4), one1 (2), one2 (2)" in out.getvalue()
    first_two = [line for line in (tmp_path / "order.log").read_text().splitlines()
                 if line.startswith("start ")][:2]  # the two slots' first steps
    assert any("/many/" in line for line in first_two), first_two


KILLED_POOL = """
import sys
from pathlib import Path
from flashinfer_sm120.warmup import moddir, plan, pool
d = Path(sys.argv[1])
pool.run_pool([pool.Job(d.name, d, d / "build.ninja", d.parent / "m.lock")], 2, sys.stdout)
"""


def _with_sleep(value: str) -> list[int]:
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if value.encode() in fh.read():
                    out.append(int(pid))
        except OSError:
            pass
    return out


def test_a_killed_build_leaves_no_ninja_or_compiler_running(tmp_path):
    """After ``kill -9`` of ``build``, its ninja and compilers do not run on, orphaned, compiling the
    same module beside the next build (P5, P6)."""
    import signal
    import sys

    mark = "297.314159"  # the compile steps sleep this long: found by it in /proc
    job = fake_job(tmp_path, "m", 2, sleep=mark)
    proc = subprocess.Popen([sys.executable, "-c", KILLED_POOL, str(job.build_dir)], stdout=subprocess.PIPE, text=True)
    try:
        for _ in range(600):
            if len(_with_sleep(mark)) >= 2:
                break
            time.sleep(0.05)
        assert len(_with_sleep(mark)) >= 2, "the compile steps did not start"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    for _ in range(1200):  # ninja's reaper gets SIGTERM as its parent dies, and stops all (60 s under load)
        left = [p for p in _with_sleep(mark) if not _zombie(p)]
        if not left:
            break
        time.sleep(0.05)
    for p in left:
        os.kill(p, signal.SIGKILL)
    assert not left, "left running after kill -9 of the build"


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def _group_alive(pgid: int) -> list[int]:
    """Pids of processes of group ``pgid`` that are not zombies (/proc)."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(pid))
    return out


def _group_gone(pgid: int) -> bool:
    """Whether group ``pgid`` is gone within 30 s (a killed group goes at once; the bound is for load)."""
    for _ in range(600):
        if not _group_alive(pgid):
            return True
        time.sleep(0.05)
    return False


def _stubborn(tmp_path, name: str) -> str:
    """A script that starts a child ignoring TERM, INT and HUP (its group id written to ``name``.pgid),
    which keeps the step's output pipe open; returns the path."""
    script = tmp_path / f"{name}.sh"
    script.write_text(f"(trap '' TERM INT HUP; cut -d' ' -f5 /proc/self/stat > {tmp_path}/{name}.pgid; "
                      "exec sleep 297.27) &\n"  # the step waits for that file: its reaper kills the child once it ends
                      f"until [ -s {tmp_path}/{name}.pgid ]; do sleep 0.05; done\n")
    return str(script)


def test_a_step_that_exited_is_done_and_its_leftovers_are_killed(tmp_path):
    """An nvcc that exits 0 but leaves a child holding its output open and ignoring SIGTERM: the step is
    done when the process ninja started exits (not at EOF on its pipe), and that child's group is killed
    (P6).  On 0.3.0 this build never ended."""
    job = fake_job(tmp_path, "m", 1, sleep=0, after=f" && sh {_stubborn(tmp_path, 'left')}")
    t0 = time.monotonic()
    res = pool.run_pool([job], 1, io.StringIO())
    assert time.monotonic() - t0 < 250  # the leftover sleeps 297 s: returning before it ends is the fix
    assert res[0].status == "built", res[0].error
    pgid = int((tmp_path / "left.pgid").read_text())
    assert _group_gone(pgid)


def test_a_leftover_that_left_ninjas_session_is_killed_too(tmp_path, monkeypatch):
    """An nvcc whose child calls setsid(), drops its environment and keeps the step's output open: killing the
    step's group misses it and ninja waits on the pipe for ever; once the step has exited, ninja's reaper, to
    which it was re-parented, kills it (P6)."""
    monkeypatch.setattr(pool, "_STOP_S", 1)
    escape = tmp_path / "escape.sh"
    escape.write_text("setsid env -i sh -c "
                      f"'trap \"\" TERM INT HUP; echo $$ > {tmp_path}/escaped.pid; exec sleep 297.29' &\n"
                      f"while [ ! -s {tmp_path}/escaped.pid ]; do sleep 0.05; done\n")
    job = fake_job(tmp_path, "m", 1, sleep=0, after=f" && sh {escape}")
    t0 = time.monotonic()
    res = pool.run_pool([job], 1, io.StringIO())
    assert time.monotonic() - t0 < 250  # the leftover sleeps 297 s: returning before it ends is the fix
    assert res[0].status == "built", res[0].error
    assert _group_gone(int((tmp_path / "escaped.pid").read_text()))  # setsid made it its group's leader


def test_a_step_past_its_deadline_is_killed_with_its_group_and_named(tmp_path, monkeypatch):
    """A compile step that hangs ignoring SIGTERM is stopped at its deadline: SIGKILL to its group after
    the grace period, the module fails naming the file and the deadline (P6)."""
    monkeypatch.setattr(pool, "_STOP_S", 1)
    job = fake_job(tmp_path, "m", 1, sleep=0, after=f" && sh {_stubborn(tmp_path, 'hang')} && sleep 297.28")
    t0 = time.monotonic()
    res = pool.run_pool([job], 1, io.StringIO(), step_timeout=2)
    assert time.monotonic() - t0 < 250  # the leftover sleeps 297 s: returning before it ends is the fix
    assert res[0].status == "failed"
    assert "s0.cu" in res[0].error and "2 s" in res[0].error, res[0].error
    pgid = int((tmp_path / "hang.pgid").read_text())
    assert _group_gone(pgid)


INTERRUPTED_POOL = """
import faulthandler, io, signal, sys
faulthandler.dump_traceback_later(200, exit=True)  # a hang shows where it waits, before the test's bound
# Ctrl-C as at a terminal: a runner started in the background by a non-interactive shell passes
# SIGINT down ignored (POSIX), and Python then keeps it ignored
signal.signal(signal.SIGINT, signal.default_int_handler)
sys.path.insert(0, "tests")
from pathlib import Path
from flashinfer_sm120.warmup import moddir, plan, pool
pool._STOP_S = 1
d = Path(sys.argv[1])
try:
    pool.run_pool([pool.Job("m", d, d / "build.ninja")], 1, io.StringIO())
except KeyboardInterrupt:
    print("interrupted", flush=True)
"""


def test_ctrl_c_kills_steps_that_ignore_term_int_and_hup(tmp_path):
    """After SIGINT, a compile step ignoring TERM, INT and HUP is killed with its group (SIGKILL after
    the grace period) before ``build`` exits (P6); 0.3.0 left it running."""
    import signal
    import sys

    job = fake_job(tmp_path, "m", 1, sleep=0, after=f" && sh {_stubborn(tmp_path, 'int')} && sleep 297.29")
    proc = subprocess.Popen([sys.executable, "-c", INTERRUPTED_POOL, str(job.build_dir)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pgid_file = tmp_path / "int.pgid"
    try:
        for _ in range(600):
            if pgid_file.exists() and pgid_file.read_text().strip():
                break
            time.sleep(0.05)
        pgid = int(pgid_file.read_text())
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=250)  # far beyond the 1 s grace: load cannot reach it
    finally:
        proc.kill()
    assert "interrupted" in out, err[-5000:]
    left = _group_alive(pgid)
    for p in left:
        os.kill(p, signal.SIGKILL)
    assert not left, "left running after Ctrl-C"


def test_progress_line_names_running_steps_elapsed_and_what_is_left(tmp_path):
    """Every ``beat_s`` seconds (30 in ``build``) a line says which steps run (whole file names), for how
    long, and what is left; 0.3.0 said only 'compiling now' on a terminal.  The interval is injected."""
    job = fake_job(tmp_path, "m", 2, sleep=1.5)
    out = io.StringIO()
    res = pool.run_pool([job], 1, out, beat_s=0.2)
    assert res[0].status == "built"
    text = out.getvalue()
    assert "running: m/s0.cu (" in text, text
    assert "left: " in text and "3 steps" in text, text


def test_only_children_running_a_step_are_steps():
    """ninja forks, then execs ``/bin/sh -c COMMAND``: a child seen before the exec still carries
    ninja's own argv and once showed as ``module//path/ninja -C …`` in the running line.  Only
    ``sh -c`` children are steps, named by their command."""
    from flashinfer_sm120.warmup.moddir import steps

    plain = subprocess.Popen(["sleep", "297.31"])
    step = subprocess.Popen(["/bin/sh", "-c", "sleep 297.32; nvcc -c /x/sampling.cu -o /x/sampling.cuda.o"],
                            start_new_session=True)  # its group is killed at the end: no sleep left behind
    try:
        for _ in range(600):  # until the shell has exec'd
            found = steps(os.getppid())  # under ninja's parent
            if found.get(step.pid):
                break
            time.sleep(0.05)
        assert plain.pid not in found
        assert found[step.pid].startswith("sleep 297.32;")
    finally:
        plain.kill()
        os.killpg(step.pid, signal.SIGKILL)
        plain.wait()
        step.wait()
