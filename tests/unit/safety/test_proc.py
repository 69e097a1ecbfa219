"""The bounded runner: deadline, output cap, escaped descendants killed."""

from __future__ import annotations

import uuid

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


def test_group_is_killed_before_the_program_is_reaped(monkeypatch):
    """The program's pid must still be held (an unreaped zombie) when its process
    group is signalled, so the number cannot have been reused by an unrelated
    process in between (P6)."""
    import os as _os

    from flashinfer_sm120.safety import proc as _proc

    seen = []
    real_killpg = _os.killpg

    def spy(pgid, sig):
        seen.append(_os.path.exists(f"/proc/{pgid}"))
        return real_killpg(pgid, sig)

    monkeypatch.setattr(_proc.os, "killpg", spy)
    res = _proc.run(["/bin/sh", "-c", "echo hi"], timeout=10)
    assert res.returncode == 0 and res.output.strip() == b"hi"
    assert seen and all(seen), "the program was reaped before its group was killed"
