"""Third attack round, ``cache export``: what already lies beside the output.  Failed before its fix."""

from __future__ import annotations

import os

from helpers.child import cli
from helpers.host import needs_flashinfer

pytestmark = needs_flashinfer


def test_export_never_writes_through_or_over_what_lies_beside_its_output(warmed):
    """The archive was written to ``OUT.partial`` with a plain ``open()``: a file of that name was
    truncated and lost, a symlink of that name was followed (the archive written into its target),
    and ``OUT`` appearing meanwhile was replaced."""
    env, manifest, _log, tmp = warmed
    victim = tmp / "victim"
    victim.write_text("precious\n")
    out_link, out_file = tmp / "a.tar.gz", tmp / "b.tar.gz"
    os.symlink(victim, str(out_link) + ".partial")
    (tmp / "b.tar.gz.partial").write_text("mine\n")
    for out in (out_link, out_file):
        proc = cli(["cache", "export", "--from", str(manifest), str(out)], env, fakegpu=True)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert out.is_file() and not out.is_symlink() and out.stat().st_size > 100
    assert victim.read_text() == "precious\n"
    assert os.path.islink(str(out_link) + ".partial")
    assert (tmp / "b.tar.gz.partial").read_text() == "mine\n"


# --------------------------------------------------------------------------- FlashInfer's JIT directory as ninja reads it

def _build_ninja_only(env, *extra):
    return cli(["build", "--ninja-only", "--arch", "12.0", *extra, "norm"], env, fakegpu=True)


import pytest  # noqa: E402


@pytest.mark.parametrize("var,value,escaped", [
    ("FLASHINFER_WORKSPACE_BASE", "w$s", "w"),   # ninja reads '$s' as a variable: the .so went to <tmp>/w/...
    ("FLASHINFER_WORKSPACE_BASE", "w s", None),  # a space splits ninja's build line
    ("SGLANG_CACHE_DIR", "a:b", None),           # ':' ends the outputs of a build line
])
def test_a_jit_directory_ninja_cannot_carry_is_refused(clean_env, tmp_path, var, value, escaped):
    """FlashInfer writes its JIT directory unquoted into build.ninja: ``build --ninja-only`` said
    "ninja written" for a directory whose ``$`` made ninja build into another directory."""
    env = dict(clean_env, HOME=str(tmp_path))
    if var == "SGLANG_CACHE_DIR":
        env.pop("FLASHINFER_WORKSPACE_BASE")  # SGLang's setdefault keeps a set one
    env[var] = str(tmp_path / value)
    extra = ("--for", "sglang") if var == "SGLANG_CACHE_DIR" else ()
    proc = _build_ninja_only(env, *extra)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert var in proc.stderr and "Fix:" in proc.stderr and "build.ninja" in proc.stderr and "Traceback" not in proc.stderr
    if escaped:
        assert not (tmp_path / escaped).exists()


def test_import_warns_when_flashinfer_jit_directory_breaks_its_ninja_files(clean_env, tmp_path):
    from helpers.child import run_code

    env = dict(clean_env, FLASHINFER_WORKSPACE_BASE=str(tmp_path / "w s"), FLASHINFER_CUDA_ARCH_LIST="12.0")
    proc = run_code("import flashinfer_sm120; flashinfer_sm120.install(); import flashinfer.jit.core", env, 300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "FLASHINFER_WORKSPACE_BASE" in proc.stderr and "build.ninja" in proc.stderr
