"""Record the modules a real FlashInfer call path generates, replay them in a fresh process
with --arch and no GPU, get byte-identical build.ninja files; many writers never tear lines."""

import json
import shutil
import subprocess
import sys
import textwrap

from helpers.child import cli, run_py
from helpers.guards import until
from helpers.host import needs_flashinfer

RECORD = """
import json, helpers.fakegpu, flashinfer_sm120, torch
from flashinfer.jit.core import MissingJITCacheError, jit_spec_registry
from flashinfer.norm import get_norm_module
from flashinfer.sampling import get_sampling_module
from flashinfer.activation import get_act_and_mul_module
from flashinfer.decode import get_batch_decode_module
from flashinfer.prefill import get_batch_prefill_module
calls = [lambda: get_norm_module(), lambda: get_sampling_module(), lambda: get_act_and_mul_module("silu"),
         lambda: get_batch_decode_module(torch.bfloat16, torch.bfloat16, torch.bfloat16, torch.int32,
                                         128, 128, 0, False, False),
         lambda: get_batch_prefill_module("fa2", torch.float16, torch.float16, torch.float16, torch.int32,
                                          64, 64, 0, False, False, False)]
errors = []
for call in calls:
    try:
        call()
    except MissingJITCacheError:  # FLASHINFER_DISABLE_JIT: ninja files only, nothing compiled
        pass
    except Exception as e:
        errors.append(repr(e))
ninja = {}
for name, spec in jit_spec_registry.get_all_specs().items():
    spec.write_ninja()
    ninja[name] = spec.ninja_path.read_text()
print("@@" + json.dumps({"ninja": ninja, "errors": errors}))
"""

@needs_flashinfer
def test_record_then_replay_gives_identical_ninja_files(clean_env, tmp_path, real_nvcc13):
    manifest = tmp_path / "manifest.jsonl"
    env = dict(clean_env, FAKE_GPU_CAPS="12.0", FAKE_TORCH_CUDA="13.0", FLASHINFER_DISABLE_JIT="1",
               FLASHINFER_SM120_RECORD=str(manifest))
    rec, proc = run_py(RECORD, env)
    assert rec["errors"] == [], rec["errors"]
    assert len(rec["ninja"]) >= 5
    entries = [json.loads(x) for x in manifest.read_text().splitlines()]
    assert {e["name"] for e in entries} == set(rec["ninja"])
    assert all(e["targets"] == ["12.0f"] and e["regenerable"] for e in entries)
    decode = next(e for e in entries if e["name"].startswith("batch_decode"))
    # data, not code: the generator and its parameters, no source text, paths or flags
    assert decode["generator"] == "flashinfer.jit.attention.modules:gen_batch_decode_module"
    assert "generated" not in decode and "spec" not in decode

    # entries this release cannot regenerate are named and the rest is built; one recorded as
    # regenerable, and a refused line, make the build fail (never "ok" with a module missing)
    norm = next(e for e in entries if e["name"] == "norm")
    bad = [dict(norm, name="old_release_norm", flashinfer="0.6.9"),
           dict(norm, name="cute_kernel", toolchain="cute_dsl", regenerable=False,
                why="toolchain 'cute_dsl' is not built by nvcc/ninja"),
           dict(decode, name="evil", generated={"@GEN@/../../../escaped.cu": "x"})]
    assert all("generated" not in e for e in entries)
    with open(manifest, "a") as f:
        f.write("".join(json.dumps(b) + "\n" for b in bad) + "{torn\n")

    shutil.rmtree(env["FLASHINFER_WORKSPACE_BASE"])  # a fresh machine: no generated sources
    env2 = {k: v for k, v in clean_env.items() if k != "FLASHINFER_SM120_RECORD"}
    env2["FAKE_GPU_CAPS"] = ""  # no GPU on the builder
    proc = cli(["build", "--from", str(manifest), "--arch", "12.0", "--ninja-only", "--json"], env2, 300, fakegpu=True)
    assert proc.returncode == 1, proc.stderr[-4000:]
    report = json.loads(proc.stdout)
    assert not report["ok"] and "not built: old_release_norm" in report["error"], report["error"]
    assert "cute_kernel" not in report["error"] and "manifest line(s) refused" in report["error"]
    assert report["target_cuda_archs"] == ["sm_120f"]
    built = {m["name"]: open(m["ninja"]).read() for m in report["modules"]}
    assert built == rec["ninja"]  # byte-identical
    skipped = {s["name"]: s["why"] for s in report["cannot_regenerate"]}
    assert set(skipped) == {"old_release_norm", "cute_kernel"}
    assert "0.6.9" in skipped["old_release_norm"]
    assert "cannot regenerate old_release_norm" in proc.stderr and "is not valid JSON" in proc.stderr
    # the escaping entry carries source text (a 0.2.0 entry): refused where it is read, named by line, with the fix
    assert "'spec' or 'generated'" in proc.stderr and "flashinfer-sm120 0.2" in proc.stderr
    assert not (tmp_path / "escaped.cu").exists()


WRITER = """
import os, sys, time
from flashinfer_sm120.core.jitenv.record import append
path, me, go = sys.argv[1], int(sys.argv[2]), sys.argv[3]
open(go + "." + str(me), "w").close()  # ready
while not os.path.exists(go):
    time.sleep(0.001)
for i in range(40):
    append(path, {"writer": me, "i": i, "pad": chr(65 + me) * (20000 + 97 * i)})
"""


def test_eight_processes_record_without_lost_or_torn_lines(tmp_path):
    path, go = tmp_path / "m.jsonl", tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(n), str(go)]) for n in range(8)]
    # all write together once all are ready (however long their start-up takes under load)
    until(lambda: all(p.poll() is not None or (tmp_path / f"go.{n}").exists() for n, p in enumerate(procs)), seconds=300)
    go.touch()
    assert all(p.wait(timeout=120) == 0 for p in procs)
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b""
    seen = set()
    for raw in lines[:-1]:
        e = json.loads(raw)  # a torn or interleaved line fails here
        assert e["pad"] == chr(65 + e["writer"]) * (20000 + 97 * e["i"])
        seen.add((e["writer"], e["i"]))
    assert len(lines) - 1 == 320 and len(seen) == 320


def test_recorder_off_by_default_and_never_raises(clean_env, tmp_path):
    code = textwrap.dedent("""
        import json, os
        os.environ["FLASHINFER_SM120_RECORD"] = "/proc/no/such/dir/m.jsonl"
        from flashinfer_sm120.core.jitenv import record
        record.install_if_enabled()
        record._record(type("S", (), {"name": "x", "toolchain": "nvcc"})())  # cannot write: logs once
        print("@@" + json.dumps({"installed": record._state["installed"]}))
    """)
    out, proc = run_py(code, clean_env)
    assert out["installed"] is True
    out, _ = run_py("import json, flashinfer_sm120\nfrom flashinfer_sm120.core.jitenv import record\n"
                    "print('@@' + json.dumps(record._state['installed']))", clean_env)
    assert out is False


@needs_flashinfer
def test_records_when_flashinfer_was_imported_first(clean_env, tmp_path, real_nvcc13):
    manifest = tmp_path / "m.jsonl"
    code = textwrap.dedent("""
        import json, helpers.fakegpu, flashinfer            # FlashInfer first, names already bound
        import flashinfer_sm120
        from flashinfer.rope import get_rope_module
        from flashinfer.jit.core import MissingJITCacheError
        try:
            get_rope_module()
        except MissingJITCacheError:
            pass
        print("@@" + json.dumps({}))
    """)
    run_py(code, dict(clean_env, FAKE_GPU_CAPS="12.0", FAKE_TORCH_CUDA="13.0", FLASHINFER_DISABLE_JIT="1",
                      FLASHINFER_SM120_RECORD=str(manifest)))
    (entry,) = [json.loads(x) for x in manifest.read_text().splitlines()]
    assert entry["name"] == "rope" and entry["targets"] == ["12.0f"]
    assert entry["generator"] == "flashinfer.jit.rope:gen_rope_module" and entry["params"] == {"args": [], "kwargs": {}}
