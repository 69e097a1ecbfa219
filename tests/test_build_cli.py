"""build --list, variant flags and their errors, and named variants written as ninja files."""

import json
import os
import subprocess
import sys

from conftest import needs_flashinfer, run_code


def cli(args, env, timeout=300):
    code = "import sys, fakegpu\nfrom flashinfer_sm120.cli import main\nsys.exit(main(sys.argv[1:]))"
    return run_code(code, env, timeout, args)


def test_list_names_every_module_and_flag(clean_env):
    proc = cli(["build", "--list"], clean_env)
    assert proc.returncode == 0
    for word in ("sampling", "norm", "rope", "activation", "page", "decode", "prefill",
                 "--head-dim", "--dtype", "--kv-dtype", "--act"):
        assert word in proc.stdout


def test_bad_variant_flags_name_the_value_and_the_choices(clean_env):
    for args, words in ((["decode", "--head-dim", "99"], ["99", "128"]),
                        (["decode", "--dtype", "f32"], ["'f32'", "bf16"]),
                        (["activation", "--act", "relu"], ["'relu'", "silu"]),
                        ([], ["--list", "--from"])):
        proc = cli(["build", "--arch", "12.0", *args], clean_env)
        assert proc.returncode == 2 and all(w in proc.stderr for w in words), (args, proc.stderr)


def test_missing_manifest_says_how_to_record_one(clean_env, tmp_path):
    proc = cli(["build", "--from", str(tmp_path / "none.jsonl")], clean_env)
    assert proc.returncode == 2 and "FLASHINFER_SM120_RECORD=" in proc.stderr


@needs_flashinfer
def test_variants_from_flags_become_flashinfer_modules(clean_env, real_nvcc13):
    env = dict(clean_env, FAKE_GPU_CAPS="")
    proc = cli(["build", "--arch", "12.0", "decode", "prefill", "page", "--head-dim", "64,256",
                "--dtype", "bf16", "--kv-dtype", "fp8_e4m3", "--ninja-only", "--json"], env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    mods = {m["module"]: m for m in json.loads(proc.stdout)["modules"]}
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
