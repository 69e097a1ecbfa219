"""Manifests are data: a manifest names a FlashInfer generator and its parameters, and the source
compiled is what the local FlashInfer generates from them (docs/threat-model.md P2)."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import cli, needs_flashinfer, run_py

#: Host code a module would run when the server loads it, and a file of the builder's it would embed.
EVIL = ('#include "/etc/hostname"\n'
        '__attribute__((constructor)) static void evil() { system("touch /tmp/pwned"); }\n')

RECORD = """
import json, fakegpu, flashinfer_sm120, torch
from flashinfer.jit.core import MissingJITCacheError
from flashinfer.sampling import get_sampling_module
from flashinfer.decode import get_batch_decode_module
for call in (lambda: get_sampling_module(),
             lambda: get_batch_decode_module(torch.bfloat16, torch.bfloat16, torch.bfloat16, torch.int32,
                                             128, 128, 0, False, False)):
    try:
        call()
    except MissingJITCacheError:  # FLASHINFER_DISABLE_JIT: nothing compiled
        pass
print("@@" + json.dumps({}))
"""


def _record(clean_env, tmp_path) -> list[dict]:
    """Entries a real FlashInfer call path records (no GPU, nothing compiled)."""
    manifest = tmp_path / "recorded.jsonl"
    env = dict(clean_env, FAKE_GPU_CAPS="12.0", FAKE_TORCH_CUDA="13.0", FLASHINFER_DISABLE_JIT="1",
               FLASHINFER_SM120_RECORD=str(manifest), FLASHINFER_WORKSPACE_BASE=str(tmp_path / "rec-ws"))
    run_py(RECORD, env)
    return [json.loads(x) for x in manifest.read_text().splitlines()]


def _build(clean_env, tmp_path, entries: list[dict]):
    m = tmp_path / "m.jsonl"
    m.write_text("".join(json.dumps(e) + "\n" for e in entries))
    env = dict(clean_env, FAKE_GPU_CAPS="")
    proc = cli(["build", "--from", str(m), "--arch", "12.0", "--ninja-only", "--json"], env, 600)
    return proc, json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else {}


def _everything_under(root: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in root.rglob("*") if p.is_file() and not p.is_symlink())


@needs_flashinfer
def test_source_text_in_a_manifest_is_never_written_or_compiled(clean_env, tmp_path, real_nvcc13):
    """Issue 19 finding 5: build --from wrote an entry's 'generated' text into FlashInfer's generated
    directory and compiled it (host code run at load, any readable file embedded)."""
    entries = _record(clean_env, tmp_path)
    decode = next(e for e in entries if e["name"].startswith("batch_decode"))
    sampling = next(e for e in entries if e["name"] == "sampling")
    # 1. the recorded module's own generated file, with other text
    forged = json.loads(json.dumps(decode))
    name = next(k for k in forged.get("generated") or {"@GEN@/" + decode["name"] + "/batch_decode_config.inc": ""}
                if k.endswith("batch_decode_config.inc"))
    forged.setdefault("generated", {})[name] = EVIL
    # 2. an entry of a parameterless module that adds a source file of its own
    extra = json.loads(json.dumps(sampling))
    extra["name"] = "sampling"
    extra["generated"] = {"@GEN@/evil/evil.cu": EVIL}
    extra["spec"] = {"sources": ["@GEN@/evil/evil.cu"], "extra_cflags": None, "extra_cuda_cflags": None,
                     "extra_ldflags": None, "extra_include_dirs": None, "needs_device_linking": False,
                     "extra_cuda_cflags_by_source": []}
    proc, report = _build(clean_env, tmp_path, [forged, extra])
    ws = Path(clean_env["FLASHINFER_WORKSPACE_BASE"])
    assert "system(" not in _everything_under(ws), proc.stderr[-3000:]
    assert "evil" not in _everything_under(ws), proc.stderr[-3000:]
    skipped = {s["name"]: s["why"] for s in report.get("cannot_regenerate", [])}
    assert decode["name"] in skipped and "differs from what FlashInfer" in skipped[decode["name"]], proc.stderr[-3000:]
    assert "sampling" in skipped and "evil" in skipped["sampling"], proc.stderr[-3000:]
    assert not [m for m in report.get("modules", []) if m["name"] in (decode["name"], "sampling")]


@needs_flashinfer
def test_an_honest_manifest_is_built_from_its_parameters(clean_env, tmp_path, real_nvcc13):
    """Recorded entries name their generator and parameters; replay regenerates the same sources."""
    entries = _record(clean_env, tmp_path)
    decode = next(e for e in entries if e["name"].startswith("batch_decode"))
    assert decode["generator"] == "flashinfer.jit.attention.modules:gen_batch_decode_module"
    assert {"dtype": "bfloat16"} in decode["params"]["args"] and 128 in decode["params"]["args"]
    proc, report = _build(clean_env, tmp_path, entries)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert {m["name"] for m in report["modules"]} == {e["name"] for e in entries}
    gen = Path(clean_env["FLASHINFER_WORKSPACE_BASE"])
    assert list(gen.rglob("batch_decode_config.inc")), "FlashInfer wrote its own generated sources"
