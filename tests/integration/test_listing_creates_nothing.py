"""A command that only lists creates nothing in FlashInfer's JIT cache (threat-model P4): ``status`` and
``doctor`` import FlashInfer, whose import makes its workspace, and the patch made one per toolkit."""

import getpass
import os

import pytest

from helpers.child import cli
from helpers.host import needs_flashinfer
from helpers.probing import created


@needs_flashinfer
@pytest.mark.parametrize("args", [
    pytest.param(["status", "--arch", "9.0a"], id="status"),  # another machine's targets: its directory
    pytest.param(["status", "--json", "--fresh"], id="status-no-targets"),
    pytest.param(["status", "--arch", "7.0"], id="status-guard"),  # no CUDA 13 nvcc builds sm_70: unpatched
    pytest.param(["status", "--arch", "9.0a", "DISABLE"], id="status-disabled"),
    pytest.param(["doctor", "--arch", "9.0a"], id="doctor", marks=pytest.mark.slow),  # and FlashInfer alone
    pytest.param(["build", "--list"], id="build-list"),
    pytest.param(["--version"], id="version"),
])
def test_a_listing_command_creates_nothing_in_flashinfer_s_cache(clean_env, tmp_path, args):
    """``status --arch 9.0a`` made ``0.7.4/90a/nvcc13.0.88-*/flashinfer_jit.log``, ``doctor`` FlashInfer
    alone's ``0.7.4/90a/flashinfer_jit.log`` too."""
    ws, tmp = tmp_path / "ws", tmp_path / "tmp"
    ws.mkdir()
    tmp.mkdir(mode=0o700)
    before = created(ws)
    env = dict(clean_env, TMPDIR=str(tmp), FLASHINFER_WORKSPACE_BASE=str(ws))
    if "DISABLE" in args:
        args, env["FLASHINFER_SM120_DISABLE"] = args[:-1], "1"
    proc = cli(args, env, 600)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    assert created(ws) == before, proc.stdout[-2000:]
    # its own private directory is removed at exit, with what FlashInfer's dependencies make with tempfile at
    # import in FlashInfer alone's child (cuda-tile's mkdtemp, left by its os._exit: one empty tmpXXXXXXXX per run);
    # CuTe DSL's one cache under $TMPDIR/$USER may stay
    assert [p for p in os.listdir(tmp) if p not in (env.get("USER"), getpass.getuser())] == [], proc.stderr[-2000:]


@needs_flashinfer
@pytest.mark.parametrize("arch", ["12.2", "7.0"])
def test_a_refused_build_creates_nothing_in_flashinfer_s_cache(clean_env, tmp_path, arch):
    """``build --arch 12.2 sampling`` (no toolkit of this release builds sm_122a: FlashInfer guarded) made
    ``0.7.4/122a/flashinfer_jit.log`` before refusing: FlashInfer's import gets a private workspace until the checks
    pass (P4: check, then create)."""
    ws, tmp = tmp_path / "ws", tmp_path / "tmp"
    ws.mkdir()
    tmp.mkdir(mode=0o700)
    before = created(ws)
    proc = cli(["build", "--arch", arch, "sampling"], dict(clean_env, TMPDIR=str(tmp), FLASHINFER_WORKSPACE_BASE=str(ws)),
               600)
    assert proc.returncode in (1, 2) and "sm_" in proc.stderr, proc.stderr[-3000:]
    assert created(ws) == before, proc.stderr[-2000:]
    assert not [p for p in os.listdir(tmp) if p.startswith("flashinfer-sm120-list-")]
