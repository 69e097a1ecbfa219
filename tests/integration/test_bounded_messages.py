"""What a long environment value makes the import and the commands print: bounded (P6, P8).

Unbounded, a ``FLASHINFER_SM120_CACHE_DIR`` of 100,000 characters would come back whole in the
warning every ``import flashinfer`` prints, and in ``status``, ``doctor`` and ``build`` (100 KB each), since the cache root's reasons and the package's log records quote it.
Every record of the ``flashinfer_sm120`` logger is bounded, and so are the cache root's reasons.
"""

from __future__ import annotations

import json
import logging

import pytest

from helpers.child import cli

LONG = 100_000
#: What one command may print with one hostile value (its normal output is a few KB).
MAX_OUT = 40_000

VARIABLES = ["FLASHINFER_SM120_CACHE_DIR", "XDG_CACHE_HOME", "HOME", "TMPDIR", "CUDA_HOME", "CUDA_PATH",
             "FLASHINFER_WORKSPACE_BASE", "FLASHINFER_SM120_RECORD", "MAX_JOBS", "FLASHINFER_NVCC_THREADS",
             "CXX", "FLASHINFER_NVCC_LAUNCHER", "FLASHINFER_SM120_COMPILER_CACHE", "SCCACHE_SERVER_PORT",
             "FLASHINFER_CUDA_ARCH_LIST"]


@pytest.mark.parametrize("name", VARIABLES)
def test_a_long_value_gives_bounded_output(clean_env, name):
    value = "/tmp/" + "c" * LONG if name not in ("MAX_JOBS", "FLASHINFER_NVCC_THREADS", "SCCACHE_SERVER_PORT") \
        else "9" * LONG
    env = dict(clean_env, **{name: value})
    proc = cli(["status"], env, timeout=300)
    out = proc.stdout + proc.stderr
    assert "Traceback" not in out, out[-3000:]
    assert len(out) < MAX_OUT, (name, len(out), out[:400])


def test_every_log_record_of_the_package_is_bounded(caplog):
    import flashinfer_sm120  # noqa: F401  (adds the filter)

    with caplog.at_level(logging.WARNING, logger="flashinfer_sm120"):
        logging.getLogger("flashinfer_sm120").warning("not using %r; x", "/tmp/" + "c" * LONG)
        logging.getLogger("flashinfer_sm120").warning("short %s", "message")
    long, short = [r.getMessage() for r in caplog.records]
    assert len(long) < 400 and "characters" in long and long.endswith(" x"), long[:500]
    assert short == "short message"


@pytest.mark.parametrize("name", ["FLASHINFER_NVCC", "CUDA_PATH"])
def test_doctor_verbose_cuts_a_long_value_wherever_it_quotes_it(clean_env, name):
    """``doctor --verbose`` prints the report as JSON lines: each value quoted is cut at 4,096 characters (it printed a
    120 KB value nine times whole, on lines of 120,000 characters)."""
    env = dict(clean_env, FLASHINFER_CUDA_ARCH_LIST="12.0", **{name: "/x" + "A/" * 60_000})
    proc = cli(["doctor", "--verbose"], env, timeout=300)
    out = proc.stdout + proc.stderr
    assert "Traceback" not in out, out[-3000:]
    assert max(map(len, out.splitlines())) < 4_200, max(map(len, out.splitlines()))
    assert len(out) < 200_000, len(out)
    assert "characters)" in proc.stdout  # the cut says so


@pytest.mark.parametrize("args", [["status", "--json"], ["doctor", "--json"], ["build", "--json", "activation"]])
def test_json_commands_under_ulimit_f_0_print_one_document_without_a_traceback(clean_env, tmp_path, args):
    """``ulimit -f 0``: tempfile finds "no usable temporary directory" (its probe file cannot be written), which
    escaped as a traceback with nothing on stdout; every outcome is one JSON document (P8)."""
    import resource
    import subprocess
    import sys

    env = dict(clean_env, FLASHINFER_CUDA_ARCH_LIST="12.0")
    proc = subprocess.run([sys.executable, "-m", "flashinfer_sm120", *args], env=env, capture_output=True, text=True,
                          timeout=600, preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0)))
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert isinstance(json.loads(proc.stdout), dict) and proc.returncode in (1, 2), proc.stdout[-2000:]
