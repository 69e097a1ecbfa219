"""Cases from a fresh user's walk through the README (kept so they stay fixed)."""

import os
import sys

from helpers.child import cli, run_py
from helpers.host import needs_flashinfer

SUMMARY = """
import json, os, helpers.fakegpu, flashinfer_sm120, flashinfer
print("@@" + json.dumps({"summary": flashinfer_sm120.status()["summary"]}))
"""


@needs_flashinfer
def test_summary_says_targets_came_from_the_arch_list_when_no_gpu(clean_env, real_nvcc13):
    env = dict(clean_env, FAKE_GPU_CAPS="", FLASHINFER_CUDA_ARCH_LIST="12.0")
    out, proc = run_py(SUMMARY, env)
    assert "targets sm_120f (from FLASHINFER_CUDA_ARCH_LIST='12.0')" in out["summary"], out
    # with GPUs and no list, the GPUs are named as the source
    env = dict(clean_env, FAKE_GPU_CAPS="12.0")
    out, _ = run_py(SUMMARY, env)
    assert "targets sm_120f (GPUs from" in out["summary"], out


@needs_flashinfer
def test_missing_cuda_home_is_named_once(clean_env, real_nvcc13, tmp_path):
    missing = str(tmp_path / "nonexistent" / "cuda")
    env = dict(clean_env, FAKE_GPU_CAPS="12.0", CUDA_HOME=missing)
    out, _ = run_py(SUMMARY, env)
    summary = out["summary"]  # the value, why, the fix, and the value once
    assert f"CUDA_HOME='{missing}'" in summary and "directory does not exist" in summary, out
    assert "Fix: unset CUDA_HOME" in summary and summary.count(missing) == 1, out


def test_enable_refuses_a_site_dir_that_does_not_exist(tmp_path, clean_env):
    typo = tmp_path / "no-such-site"
    proc = cli(["enable", "--site-dir", str(typo)], clean_env, 120, python=sys.executable)
    assert proc.returncode == 2 and str(typo) in proc.stderr and "Fix: give one of those" in proc.stderr, proc.stderr
    assert not typo.exists()


@needs_flashinfer
def test_build_for_an_unknown_gpu_prints_the_fix_once(clean_env, real_nvcc13):
    env = dict(clean_env, FAKE_GPU_CAPS="")
    proc = cli(["build", "--arch", "15.0", "sampling", "--ninja-only"], env, 600, fakegpu=True)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.count("Fix: upgrade flashinfer-sm120") == 1, proc.stderr[-3000:]
    assert "--arch '15.0'" in proc.stderr  # the value as given, not the variable --arch sets


def test_enable_refuses_a_directory_python_reads_no_pth_in(tmp_path, clean_env):
    """``enable --site-dir /etc`` writes no .pth there: a site directory is required, not any existing one (P4)."""
    plain = tmp_path / "etc"
    plain.mkdir()
    proc = cli(["enable", "--site-dir", str(plain)], clean_env, 120, python=sys.executable)
    assert proc.returncode == 2 and str(plain) in proc.stderr and "Fix: give one of those" in proc.stderr, proc.stderr
    assert "site-packages" in proc.stderr and os.listdir(plain) == []
    debian = tmp_path / "dist-packages"
    debian.mkdir()
    assert cli(["enable", "--site-dir", str(debian)], clean_env, 120, python=sys.executable).returncode == 0
