"""``build`` run as users run it, with a fake compiler (``helpers.warm``)."""

import pytest

from helpers import child
from helpers.warm import LOAD_AGAIN


def test_an_up_to_date_build_says_so_once_per_module(warmed):
    """Nothing to build: each module is reported ``up to date`` once (the report, on stdout), and the
    plan of jobs and memory is not printed; 0.3.0 said it twice, with the plan's lines on stderr."""
    env, manifest, _, _ = warmed
    proc = child.cli(["build", "--from", str(manifest), "-j", "2"], env, fakegpu=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (proc.stdout + proc.stderr).count("up to date") == 2, (proc.stdout, proc.stderr)
    assert proc.stdout.count("up to date") == 2 and "jobs:" not in proc.stderr, proc.stderr


@pytest.mark.slow  # seconds: a whole (fake-compiler) build and FlashInfer's own load in child processes
def test_flashinfers_own_load_after_a_build_compiles_nothing(warmed):
    """What ``build`` warmed is what FlashInfer's own ``build_and_load`` finds: its ninja run compiles nothing."""
    env, _, log, _ = warmed
    before = log.read_text()
    res, _ = child.run_py(LOAD_AGAIN, dict(env, FAKE_GPU_CAPS="12.0", FAKE_TORCH_CUDA="13.0"))
    assert "Ninja build failed" not in (res["err"] or "")
    assert log.read_text() == before
