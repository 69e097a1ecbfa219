"""build --list, variant flags and their errors, and named variants written as ninja files."""

import json
import os

import pytest

from helpers.child import cli, run_code
from helpers.host import needs_flashinfer
from helpers.probing import created, home_env, needs_root, user_home
from flashinfer_sm120.cli.buildjson import FIELDS


def test_list_names_every_module_and_flag(clean_env):
    proc = cli(["build", "--list"], clean_env, fakegpu=True)
    assert proc.returncode == 0
    for word in ("sampling", "norm", "rope", "activation", "page", "decode", "prefill",
                 "--head-dim", "--dtype", "--kv-dtype", "--act"):
        assert word in proc.stdout


def test_bad_variant_flags_name_the_value_and_the_choices(clean_env):
    for args, words in ((["decode", "--head-dim", "99"], ["99", "128"]),
                        (["decode", "--dtype", "f32"], ["'f32'", "bf16"]),
                        (["activation", "--act", "relu"], ["'relu'", "silu"]),
                        ([], ["--list", "--from"])):
        proc = cli(["build", "--arch", "12.0", *args], clean_env, fakegpu=True)
        assert proc.returncode == 2 and all(w in proc.stderr for w in words), (args, proc.stderr)


def test_missing_manifest_says_how_to_record_one(clean_env, tmp_path):
    proc = cli(["build", "--from", str(tmp_path / "none.jsonl")], clean_env, fakegpu=True)
    assert proc.returncode == 2 and "FLASHINFER_SM120_RECORD=" in proc.stderr


@needs_flashinfer
def test_variants_from_flags_become_flashinfer_modules(clean_env, real_nvcc13):
    env = dict(clean_env, FAKE_GPU_CAPS="")
    proc = cli(["build", "--arch", "12.0", "decode", "prefill", "page", "--head-dim", "64,256",
                "--dtype", "bf16", "--kv-dtype", "fp8_e4m3", "--ninja-only", "--json"], env, fakegpu=True)
    mods = {m["module"]: m for m in _one_document(proc)["modules"]}
    assert set(mods) == {"decode-bf16-kvfp8_e4m3-hd64", "decode-bf16-kvfp8_e4m3-hd256",
                         "prefill-bf16-kvfp8_e4m3-hd64", "prefill-bf16-kvfp8_e4m3-hd256", "page"}
    name = mods["decode-bf16-kvfp8_e4m3-hd256"]["name"]
    assert "dtype_q_bf16" in name and "dtype_kv_e4m3" in name and "head_dim_qk_256" in name
    assert all(os.path.exists(m["ninja"]) for m in mods.values())


def test_result_lines_name_the_library_directory_once(capsys):
    """Each result line repeated FlashInfer's long module name twice (its directory and its file),
    about 420 characters a line."""
    from flashinfer_sm120.cli.build import _print_human

    jit = "/home/user/.cache/flashinfer/0.7.4/120f/nvcc13.0.88-0123abcd/cached_ops"
    long = "batch_decode_with_kv_cache_dtype_q_bf16_dtype_kv_bf16_dtype_o_bf16_dtype_idx_i32_head_dim_qk_128"
    mods = [{"module": "decode-bf16-hd128", "status": "built", "library": f"{jit}/{long}/{long}.so",
             "bytes": 12_345_678, "seconds": 61.2, "binary": ["SASS sm_120f"]},
            {"module": "sampling", "status": "up to date", "library": f"{jit}/sampling/sampling.so",
             "bytes": 2048, "seconds": 0.0, "binary": ["SASS sm_120f"]}]
    _print_human({"cuda_home": "/opt/cu13", "cuda_version": "13.0", "target_cuda_archs": ["sm_120f"],
                  "modules": mods, "cannot_regenerate": []})
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == "built decode-bf16-hd128 (11.8 MiB, 61.2 s; SASS sm_120f)"
    assert lines[2] == "up to date sampling (2.0 KiB, 0.0 s; SASS sm_120f)"
    assert lines[3] == f"libraries in {jit} (one directory per FlashInfer module; --json gives each path)"
    assert long not in "\n".join(lines)


def _one_document(proc) -> dict:
    """stdout is exactly one JSON document with every build --json field."""
    doc = json.loads(proc.stdout)  # raises on anything before or after the document
    assert tuple(doc) == FIELDS, doc
    assert doc["ok"] is (doc["error"] is None) and doc["ok"] is (proc.returncode == 0), (doc, proc.stderr[-2000:])
    return doc


@pytest.mark.parametrize("args, words", [
    (["nosuch", "--arch", "12.0"], ["'nosuch'", "--list"]),
    (["page", "--arch", "banana"], ["'banana'", "12.0"]),
    (["--from", "/nonexistent/m.jsonl"], ["/nonexistent/m.jsonl", "FLASHINFER_SM120_RECORD="]),
    ([], ["--list", "--from"]),
])
def test_json_is_one_document_when_build_refuses(clean_env, args, words):
    proc = cli(["build", "--json", *args], clean_env, fakegpu=True)
    doc = _one_document(proc)
    assert proc.returncode == 2 and not doc["ok"] and all(w in doc["error"] for w in words), doc
    assert doc["modules"] == [] and doc["target_cuda_archs"] is None


@needs_flashinfer
def test_json_of_a_guarded_build_names_the_fix(clean_env):
    """``build --arch 5.0 --json`` said "see the message above", which a JSON reader never sees (P8)."""
    proc = cli(["build", "--json", "sampling", "--arch", "5.0"], clean_env, fakegpu=True)
    doc = _one_document(proc)
    assert proc.returncode == 2 and "Fix: remove '5.0' from --arch" in doc["error"], doc


def test_json_is_one_document_when_a_dependency_is_missing(hiding):
    proc = cli(["build", "page", "--arch", "12.0", "--json"], hiding("filelock"), fakegpu=True)
    doc = _one_document(proc)
    assert not doc["ok"] and "filelock" in doc["error"], doc


BROKEN_MODULES = """
import sys
class Broken:
    def find_spec(self, name, path=None, target=None):
        if name == "flashinfer_sm120.warmup.modules":
            raise ImportError("injected: the build module is broken", name=name)
sys.meta_path.insert(0, Broken())
from flashinfer_sm120.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_broken_build_module_leaves_the_other_commands_and_json(clean_env):
    """Each command registers itself: one broken module leaves the others working."""
    proc = run_code(BROKEN_MODULES, clean_env, 300, ["doctor", "--help"])
    assert proc.returncode == 0 and "--timeout" in proc.stdout, proc.stderr[-2000:]
    proc = run_code(BROKEN_MODULES, clean_env, 300, ["build", "page", "--json"])
    doc = _one_document(proc)
    assert proc.returncode == 2 and "injected" in doc["error"] and "'build' is unavailable" in doc["error"]


@needs_flashinfer
def test_json_names_where_the_targets_came_from(clean_env, real_nvcc13):
    """The origin is a field of the session, not text cut out of the summary."""
    env = dict(clean_env, FAKE_GPU_CAPS="")
    proc = cli(["build", "--arch", "120", "page", "--ninja-only", "--json"], env, fakegpu=True)
    doc = _one_document(proc)
    assert doc["ok"] and doc["targets_from"] == "from --arch 120" and doc["target_cuda_archs"] == ["sm_120f"]
    assert "(from --arch 120)" in proc.stderr and "FLASHINFER_CUDA_ARCH_LIST=" not in proc.stderr
    proc = cli(["build", "page", "--ninja-only", "--json"], dict(env, FLASHINFER_CUDA_ARCH_LIST="12.0"), fakegpu=True)
    doc = _one_document(proc)
    assert doc["ok"] and doc["targets_from"] == "from FLASHINFER_CUDA_ARCH_LIST='12.0'"
    assert "(from FLASHINFER_CUDA_ARCH_LIST='12.0')" in proc.stderr


@needs_root
def test_build_as_root_with_a_users_home_refuses_before_importing_flashinfer(shared_tmp):
    """build as root with a user's HOME (sudo -E) refuses before importing FlashInfer, so no root-owned
    ~/.cache/flashinfer is made in that home; it checks first, as status does, and says the fix (P4)."""
    home = user_home(shared_tmp)
    env = home_env(home, shared_tmp / "tmp")
    env.pop("FLASHINFER_WORKSPACE_BASE", None)
    proc = cli(["build", "--arch", "12.0", "--ninja-only", "--json", "activation"], env, timeout=300)
    assert proc.returncode == 2 and created(home) == [], proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    assert doc["ok"] is False and doc["error"].startswith("FlashInfer was not imported: ")
    assert str(home) in doc["error"] and "sudo -H" in doc["error"] and "FLASHINFER_WORKSPACE_BASE" in doc["error"]


def test_a_module_named_and_recorded_is_built_and_reported_once_under_builds_name(monkeypatch):
    """``build --from MANIFEST sampling`` reported ``up to date sampling`` twice, and with ``decode`` both
    ``decode-bf16-hd128`` and FlashInfer's ``batch_decode_with_kv_cache_...``: one module under two names."""
    from types import SimpleNamespace as NS

    from flashinfer_sm120.warmup import replay

    monkeypatch.setattr(replay, "make_spec", lambda entry, _release: NS(name=entry["name"]))
    named = (("sampling", "sampling"), ("decode-bf16-hd128", "batch_decode_long"), ("decode-again", "batch_decode_long"))
    variants = [NS(label=label, spec=lambda n=name: NS(name=n)) for label, name in named]
    entries = [{"name": n} for n in ("sampling", "batch_decode_long", "rope", "rope")]  # rope: two target sets
    made, not_made = replay.specs(variants, entries, "0.7.4")
    assert [(label, spec.name) for label, spec in made] == [
        ("sampling", "sampling"), ("decode-bf16-hd128", "batch_decode_long"), ("rope", "rope")]
    assert not_made == []
