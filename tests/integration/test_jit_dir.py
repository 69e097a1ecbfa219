"""Fourth attack round, where FlashInfer builds: a JIT directory another user can change is refused.

Failed before its fix: ``build`` (and ``cache import``) wrote ``build.ninja`` files and ran ninja in a
JIT directory under a directory another user owns or everyone may write (``sudo`` keeping another
user's ``HOME``; a shared ``FLASHINFER_WORKSPACE_BASE``), where that user could replace a level and
swap the ``build.ninja`` ninja runs or the ``.so`` the server loads.
"""

from __future__ import annotations

import sys

import pytest

from helpers.untrusted import make_unsafe
from helpers.child import cli
from helpers.host import needs_flashinfer

pytestmark = needs_flashinfer


def _build(env):
    return cli(["build", "--ninja-only", "--arch", "12.0", "sampling"], env, 600, python=sys.executable)


@pytest.mark.parametrize("how", ["world-writable", "another user's"])
def test_a_jit_directory_another_user_can_change_is_refused(clean_env, tmp_path, how):
    base = tmp_path / "base"
    base.mkdir()
    make_unsafe(base, how)
    env = dict(clean_env, FLASHINFER_WORKSPACE_BASE=str(base))
    proc = _build(env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "Traceback" not in out, out[-3000:]
    # another user's tree is refused before FlashInfer's import could create its cache in it (P4)
    said = "would be created inside" if how == "another user's" else "not safe to build in"
    assert said in out and str(base) in out and "FLASHINFER_WORKSPACE_BASE" in out, out[-3000:]
    assert not list(base.rglob("build.ninja"))
    if how == "another user's":
        assert not (base / ".cache").exists()


def test_a_jit_directory_of_your_own_is_used(clean_env, tmp_path):
    env = dict(clean_env, FLASHINFER_WORKSPACE_BASE=str(tmp_path / "mine"))
    proc = _build(env)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert list((tmp_path / "mine").rglob("build.ninja"))
