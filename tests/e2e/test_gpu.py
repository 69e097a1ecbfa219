"""On a GPU: the kernels flashinfer-sm120 builds run and give the right numbers (issue 15 item 1).

Skipped, with the reason, where ``torch.cuda.is_available()`` is false (CI, these machines).
On a GPU machine (an H200: sm_90a; an RTX 5090 / RTX PRO 6000: sm_120f; a DGX Spark: sm_121a):

    python -m pytest -q -m gpu tests/e2e/test_gpu.py

runs ``benchmarks/gpu_check.py`` once (at most 8 minutes) and checks each of its results.
``GPU_CHECK_OUT`` keeps the JSON in that directory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from helpers import ROOT
from helpers.host import needs_flashinfer

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu, pytest.mark.slow, needs_flashinfer,
    pytest.mark.skipif(not torch.cuda.is_available(),
                       reason="torch.cuda.is_available() is false: no GPU here (or a CPU build of torch); "
                              "run on a GPU machine: python -m pytest -m gpu tests/e2e/test_gpu.py"),
]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = os.environ.get("GPU_CHECK_OUT") or str(tmp_path_factory.mktemp("gpu_check"))
    env = {k: v for k, v in os.environ.items() if k not in ("FLASHINFER_CUDA_ARCH_LIST", "FLASHINFER_SM120_DISABLE")}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--out", out, "--budget", "480"],
                          env=env, capture_output=True, text=True, timeout=600)
    path = os.path.join(out, "gpu_check.json")
    assert os.path.exists(path), proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(path) as fh:
        rep = json.load(fh)
    rep["_stdout"] = proc.stdout
    return rep


def status(rep, name):
    c = rep["checks"][name]
    return c["status"], c["detail"]


def test_build_in_a_fresh_workspace(report):
    assert status(report, "build")[0] == "pass", status(report, "build")
    assert {m["module"].split("-")[0] for m in report["checks"]["build"]["modules"]} == {"sampling", "decode", "prefill"}


@pytest.mark.parametrize("check", ["sampling", "decode", "prefill"])
def test_kernels_match_the_torch_reference(report, check):
    assert status(report, check)[0] == "pass", status(report, check)


def test_built_modules_hold_sass_for_this_gpu(report):
    assert status(report, "sass")[0] == "pass", status(report, "sass")


def test_modules_load_the_drivers_libcuda_and_torchs_libcudart(report):
    assert status(report, "link")[0] == "pass", status(report, "link")
    assert status(report, "runtime link")[0] == "pass", status(report, "runtime link")
    assert report["checks"]["runtime link"]["modules_loaded"]  # the JIT modules were mapped from the fresh workspace


def test_a_second_process_compiles_nothing(report):
    assert status(report, "warm")[0] == "pass", status(report, "warm")
    assert report["checks"]["warm"]["compiles"] == []


def test_the_shim_adds_nothing_at_run_time(report):
    assert status(report, "overhead")[0] == "pass", status(report, "overhead")


def test_json_names_the_gpu_driver_toolkit_and_targets(report):
    assert report["gpus"] and report["gpus"][0]["capability"]
    assert report["toolkit"]["cuda_version"] and report["targets"]
