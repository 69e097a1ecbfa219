"""A later process with the inputs of a recorded one replays its decision (core/patch/laststatus.replay):
no discovery, the view checked again (P2); any changed input, or a record file another
uid owns or others can write (P2), resolves afresh (P1)."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from helpers.child import cli, run_py
from helpers.host import needs_flashinfer
from helpers.probing import OTHER_UID, needs_root

#: Prints the resolution and whether discovery ran.
CHILD = """
import json, sys
import flashinfer_sm120, flashinfer
st = flashinfer_sm120.status()
print("@@" + json.dumps({"mode": st["mode"], "resolution": st["resolution"], "summary": st["summary"],
                         "discovered": "flashinfer_sm120.core.toolkit.sources" in sys.modules}))
"""


@pytest.fixture
def env(clean_env, real_nvcc13):
    return dict(clean_env, FLASHINFER_CUDA_ARCH_LIST="12.0")


def fresh(env: dict, tmp_path) -> dict:
    """The resolution a first process reaches under ``env`` (in an empty cache of its own, named as
    ``env``'s in what it returns)."""
    cache = str(tmp_path / "fresh")
    out, proc = run_py(CHILD, dict(env, FLASHINFER_SM120_CACHE_DIR=cache))
    assert out["discovered"], proc.stderr
    return json.loads(json.dumps(out["resolution"]).replace(cache, env["FLASHINFER_SM120_CACHE_DIR"]))


@needs_flashinfer
def test_a_later_process_replays_the_decision(env):
    first, proc = run_py(CHILD, env)
    assert first["mode"] == "patched" and first["discovered"], proc.stderr
    later, proc = run_py(CHILD, env)
    assert later["mode"] == "patched" and not later["discovered"], proc.stderr
    assert later["resolution"] == first["resolution"] and later["summary"] == first["summary"]


def linked_toolkit(root: str, at) -> str:
    """A toolkit of links to the real one at ``root``, whose ``bin/nvcc`` is a copy (replaceable)."""
    (at / "bin").mkdir(parents=True)
    for name in os.listdir(root):
        if name != "bin":
            os.symlink(os.path.join(root, name), at / name)
    for name in os.listdir(os.path.join(root, "bin")):
        src = os.path.join(root, "bin", name)
        if name == "nvcc":
            shutil.copy(src, at / "bin" / name)
        else:
            os.symlink(src, at / "bin" / name)
    return str(at)


@needs_flashinfer
@pytest.mark.parametrize("change", ["targets", "cuda_home", "nvcc"])
def test_a_changed_input_resolves_afresh(env, real_nvcc13, tmp_path, change):
    tk = linked_toolkit(real_nvcc13, tmp_path / "tk")
    if change == "nvcc":
        env = dict(env, CUDA_HOME=tk)
    first, proc = run_py(CHILD, env)
    assert first["mode"] == "patched", proc.stderr
    changed = {"targets": dict(env, FLASHINFER_CUDA_ARCH_LIST="12.1"), "cuda_home": dict(env, CUDA_HOME=tk),
               "nvcc": env}[change]
    if change == "nvcc":  # the same path, another file (as an upgrade in place leaves it)
        nvcc = os.path.join(tk, "bin", "nvcc")
        os.replace(shutil.copy(nvcc, nvcc + ".new"), nvcc)
    later, proc = run_py(CHILD, changed)
    assert later["discovered"], f"{change} changed, yet the recorded decision was replayed (P1)"
    assert later["resolution"] == fresh(changed, tmp_path)


@needs_flashinfer
@pytest.mark.parametrize("how", ["group_writable", "world_writable", pytest.param("other_uid", marks=needs_root)])
def test_a_record_others_could_write_is_not_replayed(env, how):
    first, proc = run_py(CHILD, env)
    assert first["mode"] == "patched", proc.stderr
    record = os.path.join(env["FLASHINFER_SM120_CACHE_DIR"], "last-status.json")
    if how == "other_uid":
        os.chown(record, OTHER_UID, OTHER_UID)
    else:
        os.chmod(record, 0o620 if how == "group_writable" else 0o602)
    later, proc = run_py(CHILD, env)
    assert later["discovered"], f"a record {how.replace('_', ' ')} was replayed (P2)"
    assert later["resolution"] == first["resolution"], proc.stderr


@needs_flashinfer
def test_a_toolkit_others_can_now_write_is_not_replayed(env, real_nvcc13, tmp_path):
    """The same inputs (no nvcc or variable changed), but the chosen toolkit's directory became writable
    by others: the trust rule is applied again, not remembered (P2)."""
    env = dict(env, CUDA_HOME=linked_toolkit(real_nvcc13, tmp_path / "tk"))
    first, proc = run_py(CHILD, env)
    assert first["mode"] == "patched" and first["resolution"]["choice"]["toolkit"]["root"] == env["CUDA_HOME"], \
        proc.stderr
    os.chmod(env["CUDA_HOME"], 0o777)
    later, proc = run_py(CHILD, env)
    assert later["discovered"], "a toolkit others can write was replayed (P2)"
    assert later["resolution"]["choice"]["toolkit"]["root"] != env["CUDA_HOME"], proc.stderr


@needs_flashinfer
@pytest.mark.parametrize("fault", ["incomplete", "writable"])
def test_a_toolkit_refused_for_its_files_is_looked_at_again_once_fixed(env, real_nvcc13, tmp_path, fault):
    """``CUDA_HOME`` refused for a missing ``include`` (or a directory others can write), then fixed as the message
    said: the next process, ``status`` and ``build`` still replayed the refusal, whose reason was no longer true,
    since the fix changes no input (P1, P8); a record keeps choices, never refusals."""
    tk = linked_toolkit(real_nvcc13, tmp_path / "tk")
    env = dict(env, CUDA_HOME=tk)
    include = os.path.join(tk, "include")
    if fault == "incomplete":
        os.replace(include, include + ".away")
    else:
        os.chmod(tk, 0o777)
    first, proc = run_py(CHILD, env)
    assert first["resolution"]["choice"]["toolkit"]["root"] != tk and first["resolution"]["settings"], proc.stderr
    if fault == "incomplete":
        os.replace(include + ".away", include)
    else:
        os.chmod(tk, 0o755)
    later, proc = run_py(CHILD, env)
    assert later["discovered"], "a refusal was replayed after its fix (P1)"
    assert later["resolution"]["choice"]["toolkit"]["root"] == tk and not later["resolution"]["settings"], \
        later["summary"]
    proc = cli(["status", "--json"], env)
    assert json.loads(proc.stdout)["toolkit"]["root"] == tk, proc.stdout[-3000:]


@needs_flashinfer
def test_status_fresh_resolves_again_instead_of_replaying(env):
    """``status --fresh`` "ignores the record": its own import replayed the recorded decision."""
    first, proc = run_py(CHILD, env)
    assert first["mode"] == "patched", proc.stderr
    fresh_status, proc = run_py("import contextlib, io, json, sys\nfrom flashinfer_sm120.cli import main\n"
                                "with contextlib.redirect_stdout(io.StringIO()):\n    main(['status', '--fresh'])\n"
                                "print('@@' + json.dumps('flashinfer_sm120.core.toolkit.sources' in sys.modules))",
                                env)
    assert fresh_status is True, proc.stderr
