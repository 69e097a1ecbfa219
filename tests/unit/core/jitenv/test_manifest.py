"""Manifests are data: a manifest names a FlashInfer generator and its parameters, and the source
compiled is what the local FlashInfer generates from them (docs/threat-model.md P2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers.child import cli, run_py
from helpers.host import needs_flashinfer

#: Host code a module would run when the server loads it, and a file of the builder's it would embed.
EVIL = ('#include "/etc/hostname"\n'
        '__attribute__((constructor)) static void evil() { system("touch /tmp/pwned"); }\n')

RECORD = """
import json, helpers.fakegpu, flashinfer_sm120, torch
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
    # entries carrying source text are those of 0.2.0: refused, naming the manifest line and the fix
    assert proc.returncode != 0 and report["ok"] is False, proc.stderr[-3000:]
    assert "m.jsonl:1" in report["error"] and "flashinfer-sm120 0.2" in report["error"], report
    assert "FLASHINFER_SM120_RECORD" in report["error"] and not report.get("modules")


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


CHECK = """
import json, sys, helpers.fakegpu, flashinfer_sm120, flashinfer
from flashinfer_sm120.warmup import replay
from flashinfer_sm120.core.jitenv.record import parse_entry
from flashinfer_sm120.errors import FormatError
entries = json.loads(sys.argv[1])
out = {}
for label, entry in entries.items():
    try:  # as build --from reads a manifest line (replay.load), then remakes it
        spec = replay.make_spec(parse_entry(entry, "manifest entry"), flashinfer.__version__)
        out[label] = "ok " + spec.name
    except (replay.CannotRegenerate, FormatError) as exc:
        out[label] = "refused " + str(exc)
for label, generator in json.loads(sys.argv[2]).items():
    try:
        replay.lookup(generator)
        out[label] = "found"
    except FormatError as exc:
        out[label] = "refused " + str(exc)
print("@@" + json.dumps(out))
"""


def _check(clean_env, entries: dict, lookups: dict = {}) -> dict:
    from helpers.child import run_code

    env = dict(clean_env, FAKE_GPU_CAPS="12.0", FAKE_TORCH_CUDA="13.0")
    proc = run_code(CHECK, env, 600, [json.dumps(entries), json.dumps(lookups)])
    line = next((x for x in reversed(proc.stdout.splitlines()) if x.startswith("@@")), None)
    assert line, proc.stderr[-3000:]
    return json.loads(line[2:])


def _legacy_sampling(**extra) -> dict:
    return dict({"format": 1, "name": "sampling", "flashinfer": "0.7.4", "targets": ["12.0f"], "toolchain": "nvcc",
                 "regenerable": True,
                 "spec": {"sources": ["@FLASHINFER@/data/csrc/sampling.cu", "@FLASHINFER@/data/csrc/renorm.cu",
                                      "@FLASHINFER@/data/csrc/flashinfer_sampling_binding.cu"],
                          "extra_cflags": None, "extra_cuda_cflags": ["-O3"], "extra_ldflags": None,
                          "extra_include_dirs": None, "needs_device_linking": False,
                          "extra_cuda_cflags_by_source": []}}, **extra)


@pytest.mark.parametrize("extra", [{}, {"generator": "flashinfer.jit.sampling:gen_sampling_module",
                                        "generated": {"@GEN@/sampling/x.inc": "x"}}])
def test_a_manifest_of_0_2_is_refused_naming_the_file_and_the_fix(tmp_path, extra):
    """Entries of 0.2.0 (``spec`` and ``generated`` source text) are no longer read: refused with the file's line and
    the fix (record again with this release)."""
    from flashinfer_sm120.warmup import replay
    from flashinfer_sm120.warmup.session import BuildError

    m = tmp_path / "m.jsonl"
    m.write_text(json.dumps(_legacy_sampling(**extra)) + "\n")
    with pytest.raises(BuildError) as info:
        replay.load(str(m))
    msg = str(info.value)
    assert f"{m}:1" in msg and "flashinfer-sm120 0.2" in msg and "'spec' or 'generated'" in msg, msg
    assert "record the manifest again with FLASHINFER_SM120_RECORD" in msg


@needs_flashinfer
def test_generators_come_only_from_flashinfer(clean_env, real_nvcc13):
    """The generator is looked up in FlashInfer's gen_*_module family, and must make the entry's module."""
    base = {"format": 1, "flashinfer": "0.7.4", "targets": ["12.0f"], "toolchain": "nvcc", "regenerable": True}
    got = _check(clean_env, {
        "other name": dict(base, name="norm", generator="flashinfer.jit.sampling:gen_sampling_module"),
        "refused values": dict(base, name="x_and_mul", generator="flashinfer.jit.activation:gen_act_and_mul_module",
                               params={"args": ["x"]}),
        "code as a value": dict(base, name="silu_and_mul", generator="flashinfer.jit.activation:gen_act_and_mul_module",
                                params={"args": ["silu(x) { system(1); }"]}),
        "customize": dict(base, name="d", generator="flashinfer.jit.attention.modules:"
                                                    "gen_customize_batch_decode_module"),
        "os.system": dict(base, name="sampling", generator="os:system", params={"args": ["id"]}),
        "activation": dict(base, name="gelu_and_mul", generator="flashinfer.jit.activation:gen_act_and_mul_module",
                           params={"args": ["gelu"]}),
    }, {"sampling": "flashinfer.jit.sampling:gen_sampling_module",
        "absent module": "flashinfer.jit.nothing_here:gen_x_module",
        "absent function": "flashinfer.jit.sampling:gen_nothing_module",
        "dunder": "flashinfer.__main__:gen_x_module",
        "spec maker": "flashinfer.jit.core:gen_jit_spec"})
    assert got["other name"].startswith("refused") and "makes 'sampling'" in got["other name"]
    assert got["refused values"].startswith("refused") and "refused the recorded parameters" in got["refused values"]
    assert "KeyError: " in got["refused values"] and "FLASHINFER_SM120_RECORD" in got["refused values"]  # P8: the error and the fix
    assert got["code as a value"].startswith("refused") and "never source text" in got["code as a value"]
    assert got["customize"].startswith("refused") and "customize" in got["customize"]
    assert got["os.system"].startswith("refused") and "not a module of FlashInfer" in got["os.system"]
    assert got["activation"] == "ok gelu_and_mul"
    assert got["sampling"] == "found"
    assert got["absent module"].startswith("refused") and "has no module" in got["absent module"]
    assert got["absent function"].startswith("refused") and "defines no function" in got["absent function"]
    assert got["dunder"].startswith("refused") and got["spec maker"].startswith("refused")
    assert all(len(v) < 1000 for v in got.values())


@needs_flashinfer
def test_a_manifest_whose_regenerable_entries_all_fail_is_not_ok(clean_env, tmp_path):
    """An entry of another FlashInfer release is a failure, not ``ok: true`` with ``modules: []`` and exit 0 (P8)."""
    entry = {"format": 1, "name": "sampling", "flashinfer": "0.6.0", "targets": ["12.0f"], "toolchain": "nvcc",
             "regenerable": True, "generator": "flashinfer.jit.sampling:gen_sampling_module",
             "params": {"args": [], "kwargs": {}}}
    proc, report = _build(clean_env, tmp_path, [entry])
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert report["ok"] is False and "not built: sampling" in report["error"] and report["modules"] == []
    assert "0.6.0" in report["cannot_regenerate"][0]["why"]
