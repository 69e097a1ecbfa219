"""The bounded runner: deadline, output cap, escaped descendants killed."""

from __future__ import annotations

import uuid

import pytest

from flashinfer_sm120.safety import proc
from helpers.guards import hang_guard, until
from helpers.probing import alive_with, kill_all_with


def _token() -> str:
    return str(800000 + uuid.uuid4().int % 99999)


def test_plain_run_returns_output_and_status():
    r = proc.run(["sh", "-c", "echo out; echo err >&2; exit 3"], timeout=10)
    assert r.returncode == 3 and b"out\n" in r.output and b"err\n" in r.output
    assert not r.timed_out and not r.truncated and not r.ok


def test_missing_program_is_an_error_not_an_exception(tmp_path):
    r = proc.run([str(tmp_path / "absent")], timeout=5)
    assert r.returncode is None and str(tmp_path / "absent") in r.error


def test_detached_child_holding_the_pipe_neither_hangs_nor_survives():
    tok = _token()
    try:
        r = proc.run(["sh", "-c", f"setsid sleep {tok} & (setsid sh -c 'sleep {tok}1' &); echo done"],
                     timeout=20)
        assert not r.timed_out, "waited for the pipe the detached children hold"
        assert r.returncode == 0 and r.output == b"done\n"
        assert until(lambda: alive_with(f"sleep {tok}") == []), alive_with(f"sleep {tok}")  # SIGKILL takes a moment
    finally:
        kill_all_with(tok)


def test_scrubbed_environment_in_same_session_is_still_killed():
    tok = _token()
    try:
        r = proc.run(["sh", "-c", f"env -i sleep {tok} & echo x"], timeout=10)
        assert r.returncode == 0
        assert until(lambda: alive_with(f"sleep {tok}") == []), alive_with(f"sleep {tok}")  # SIGKILL takes a moment
    finally:
        kill_all_with(tok)


def test_hang_is_cut_at_the_deadline():
    tok = _token()
    try:
        with hang_guard(60):  # the sleep is days long: a run not cut at its deadline hangs here
            r = proc.run(["sh", "-c", f"sleep {tok} & wait"], timeout=1)
        assert r.timed_out
        assert alive_with(f"sleep {tok}") == []
    finally:
        kill_all_with(tok)


def test_endless_output_is_capped_and_stopped():
    r = proc.run(["sh", "-c", "exec yes garbage"], timeout=30, max_output=4096)
    assert r.truncated and len(r.output) == 4096 and not r.timed_out  # stopped at the cap, not the deadline


def test_the_runner_is_signalled_before_it_is_reaped(monkeypatch):
    """The pid signalled at the deadline must still be held (running or an unreaped zombie), so the number
    cannot have been reused by an unrelated process in between (P6)."""
    import os as _os

    tok = _token()
    seen = []
    real_kill = _os.kill

    def spy(pid, sig):
        seen.append(_os.path.exists(f"/proc/{pid}"))
        return real_kill(pid, sig)

    monkeypatch.setattr(proc.os, "kill", spy)
    try:
        r = proc.run(["sh", "-c", f"sleep {tok}"], timeout=1)
        assert r.timed_out and alive_with(f"sleep {tok}") == []
        assert seen and all(seen), "a pid was signalled after it was reaped"
    finally:
        kill_all_with(tok)


_EXECED = " until grep -qs '^sleep' /proc/$!/cmdline; do sleep 0.01; done"  # sleep runs, not env before its exec


@pytest.mark.parametrize("escape", ["setsid env -i sleep {tok} &" + _EXECED,  # new session, no environment
                                    "setsid env -i sleep {tok} >/dev/null 2>&1 </dev/null &",  # no pipe held
                                    "(setsid env -i sh -c 'sleep {tok} & wait' &)"])  # grandchild of an orphan
def test_a_descendant_that_leaves_session_group_and_environment_is_killed(escape):
    """Nothing a program leaves, whatever session, group or environment it took, outlives the run (P6)."""
    tok = _token()
    try:
        with hang_guard(120):
            r = proc.run(["sh", "-c", escape.format(tok=tok) + "\necho done"], timeout=60)
        assert not r.timed_out and r.returncode == 0 and r.output == b"done\n"
        assert alive_with(f"sleep {tok}") == []  # gone when the run returns: the reaper waited for it
    finally:
        kill_all_with(tok)


def test_exit_status_signal_and_a_program_that_cannot_start_are_told_apart(tmp_path):
    assert proc.run(["sh", "-c", "kill -TERM $$"], timeout=10).returncode == -15
    (tmp_path / "noexec").write_text("#!/bin/sh\n")
    r = proc.run([str(tmp_path / "noexec")], timeout=10)
    assert r.returncode is None and r.errno == 13 and "noexec" in r.error  # EACCES: not executable


@pytest.mark.parametrize("host", ["/bin/true", "/bin/sleep", ""])
def test_an_embedding_program_as_sys_executable_still_runs_the_program(monkeypatch, host):
    # uwsgi and other programs that embed Python leave sys.executable naming themselves (or empty): the helper
    # that runs the program must still be a Python, and a run must not be blamed on the program (P6, P8)
    monkeypatch.setattr("sys.executable", host)
    with hang_guard(60):
        r = proc.run(["sh", "-c", "echo ran; exit 4"], timeout=30)
    assert r.returncode == 4 and r.output == b"ran\n", r
