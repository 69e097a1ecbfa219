"""Signals: a ``build`` stopped by SIGTERM or SIGHUP (``kill``, ``systemctl stop`` of a unit that
signals only the main process, a closed terminal) leaves nothing running (P5, P6).

The pool's clean-up must run on every such signal, not on Ctrl-C only: were SIGTERM's default action
to end Python at once, ninja and its compilers would go on building into the module's directory with
FlashInfer's per-module lock already released, and the next ``build`` (or the server's JIT) would run
a second ninja on the same directory beside them.
"""

from __future__ import annotations

import os
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import TESTS
SLEEP = "97.531"  # a unique argument: the fake compiler's sleep is found by it in /proc

CHILD = f"""
import signal, sys
from pathlib import Path
for sig in (signal.SIGTERM, signal.SIGHUP):  # as under a terminal or systemd: `nohup pytest` hands SIGHUP ignored
    signal.signal(sig, signal.SIG_DFL)
sys.path.insert(0, {str(TESTS)!r})
from helpers.warm import fake_job
from flashinfer_sm120.warmup import pool
root = Path(sys.argv[1])
jobs = [fake_job(root, "m", n_src=1, sleep={SLEEP})]
pool.run_pool(jobs, 1)
"""


def _ours(root: Path) -> list[str]:
    """Command lines of live processes that belong to this test's build (by the unique sleep or the root)."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = next((ln for ln in Path(f"/proc/{pid}/status").read_text().splitlines()
                          if ln.startswith("State:")), "")
        except OSError:
            continue
        if (SLEEP in cmd or str(root) in cmd) and "Z" not in state.split(":")[1][:3]:
            out.append(f"{pid}: {cmd.strip()}")
    return out


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_build_stopped_by_a_signal_leaves_no_compiler_running(tmp_path, sig):
    root = tmp_path / "b"
    root.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(root)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)  # signalled alone, not its group
    try:
        deadline = time.monotonic() + 120  # hang guard: the compile starts within seconds
        while not (root / "order.log").exists():
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "the fake compile never started"
            time.sleep(0.1)
        os.kill(proc.pid, sig)
        proc.wait(timeout=60)
        left = []
        for _ in range(600):  # what it killed may take a moment to go (60 s under load); what it left never goes
            left = _ours(root)
            if not left:
                break
            time.sleep(0.1)
        assert not left, left
        assert proc.returncode != 0
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        for line in _ours(root):
            try:
                os.kill(int(line.split(":")[0]), signal.SIGKILL)
            except OSError:
                pass


def test_every_command_cleans_up_on_sigterm(tmp_path):
    """The command line runs each command with SIGTERM/SIGHUP raising ``SystemExit`` (exit 143/129), so
    the ``finally`` clauses that stop the bounded runner's programs, remove a half-built view and release
    locks run (a stand-in command signals itself and records whether its clean-up ran)."""
    code = ("import os, signal, sys, time\nfrom flashinfer_sm120 import cli\nfrom flashinfer_sm120.cli import status\n"
            "def run(args):\n    try:\n        os.kill(os.getpid(), signal.SIGTERM)\n        time.sleep(60)\n"
            "    finally:\n        print('CLEANED UP', flush=True)\n    return 0\n"
            "status.run_status = run\nsys.exit(cli.main(['status']))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "CLEANED UP" in proc.stdout and proc.returncode == 128 + signal.SIGTERM, (proc.returncode, proc.stderr[-2000:])
    assert "stopped by SIGTERM" in proc.stderr, proc.stderr  # said, not a silent exit 143 (P8)


def test_ctrl_c_cleans_up_and_prints_no_traceback():
    """Ctrl-C (SIGINT) ran the clean-up but ended in a ``KeyboardInterrupt`` traceback; now one line and
    exit 130, as shells report it."""
    # as at a terminal: a suite started in the background (``&``) hands its children SIGINT ignored
    code = ("import os, signal, sys, time\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
            "from flashinfer_sm120 import cli\nfrom flashinfer_sm120.cli import status\n"
            "def run(args):\n    try:\n        os.kill(os.getpid(), signal.SIGINT)\n        time.sleep(60)\n"
            "    finally:\n        print('CLEANED UP', flush=True)\n    return 0\n"
            "status.run_status = run\nsys.exit(cli.main(['status']))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "CLEANED UP" in proc.stdout and proc.returncode == 130, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr and "interrupted" in proc.stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_command_with_json_stopped_by_a_signal_prints_its_one_document(sig):
    """``build --json`` stopped by SIGTERM or Ctrl-C still prints its one JSON document on stdout (P8)."""
    code = ("import json, os, signal, sys, time\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
            "from flashinfer_sm120 import cli\nfrom flashinfer_sm120.cli import status\n"
            f"def run(args):\n    os.kill(os.getpid(), {int(sig)})\n    time.sleep(60)\n    return 0\n"
            "status.run_status = run\nsys.exit(cli.main(['status', '--json']))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 128 + sig, (proc.returncode, proc.stderr[-2000:])
    doc = json.loads(proc.stdout)  # exactly one document
    assert doc["ok"] is False and f"interrupted by {signal.Signals(sig).name}" in json.dumps(doc), doc
