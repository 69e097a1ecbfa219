"""The job pool: shared slots, truthful progress (no "compiled" for a failed step,
up-to-date said once), per-module ninja logs that FlashInfer's own ninja run accepts."""

import io
import os
import subprocess
import threading
import time

from flashinfer_sm120.warmup import ninjacmd, pool
from helpers.warm import fake_job, most_at_once



def test_builds_reports_and_second_run_is_up_to_date_once(tmp_path):
    jobs = [fake_job(tmp_path, "a", 3), fake_job(tmp_path, "b", 2)]
    out = io.StringIO()
    res = pool.run_pool(jobs, 2, out)
    assert [r.status for r in res] == ["built", "built"], out.getvalue()
    text = out.getvalue()
    assert "to build: 2 modules, 7 compile/link steps, -j 2" in text
    assert "a: compiled s0.cu" in text and "b: linked b.so" in text and "[7/7]" in text
    # FlashInfer's own run (ninja in the module dir) finds nothing to do
    for j in jobs:
        proc = subprocess.run(["ninja", "-C", str(j.build_dir), "-f", str(j.ninja_path)],
                              capture_output=True, text=True)
        assert "no work to do" in proc.stdout
    out = io.StringIO()
    res = pool.run_pool(jobs, 2, out)
    assert [r.status for r in res] == ["up to date", "up to date"]
    assert out.getvalue().count("up to date: a") == 1 and "to build" not in out.getvalue()


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
    assert ninjacmd.gencode_summary(text) == ["PTX compute_121a", "SASS sm_120f", "SASS sm_90a"]


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
from flashinfer_sm120.warmup import pool
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
    for _ in range(1200):  # ninja gets SIGTERM as its parent dies, and stops its compilers (60 s under load)
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
