"""benchmarks/gpu_check.py without a GPU: its CPU part (build through the shim in a fresh JIT
workspace, SASS check, link check) as CI runs it, and its GPU checks' references and index
arithmetic on the CPU, against stand-ins written from FlashInfer 0.7.4's API."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
import types

import pytest
import torch

from helpers.host import needs_flashinfer
from helpers import ROOT

SCRIPT = ROOT / "benchmarks" / "gpu_check.py"


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


gc = load_script()


def test_reference_top_k_then_top_p():
    row = torch.tensor(gc.SAMPLING_PROBS)
    ref = gc.reference_top_k_top_p(row, 5, 0.7)
    # top 5 renormalised: .3226 .2688 .2151 .1075 .0860; cumulative .3226 .5914 .8065 -> first 3 reach 0.7
    assert torch.allclose(ref, torch.tensor([0.4, 1 / 3, 0.8 / 3, 0, 0, 0, 0, 0]), atol=1e-6)
    assert torch.allclose(gc.reference_top_k_top_p(row, 8, 1.0), row / row.sum())
    assert torch.equal(gc.reference_top_k_top_p(row, 1, 0.99), torch.tensor([1.0, 0, 0, 0, 0, 0, 0, 0]))


def test_chi_square_counts_samples_outside_the_support():
    assert gc.chi_square([50, 50, 0], [50, 50, 0]) == (0.0, 0)
    stat, outside = gc.chi_square([60, 40, 3], [50, 50, 0])
    assert outside == 3 and math.isclose(stat, 4.0)


def test_causal_reference_aligns_at_the_bottom_right():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 8), torch.randn(5, 2, 8), torch.randn(5, 2, 8)
    out = gc.sdpa_reference(q, k, v, causal=True)
    for i in range(2):  # query i sees keys 0 .. i + (5 - 2)
        for h in range(4):
            kh, vh = k[: i + 4, h // 2], v[: i + 4, h // 2]
            w = torch.softmax(q[i, h] @ kh.T / math.sqrt(8), -1)
            assert torch.allclose(out[i, h], w @ vh, atol=1e-5)


# --------------------------------------------------------------------------- FlashInfer stand-ins


def _naive(q, k, v, causal):
    """Attention head by head with an explicit softmax; kv head of q head h is h // group."""
    group = q.shape[1] // k.shape[1]
    out = torch.empty(q.shape, dtype=torch.float32)
    lq, lk = q.shape[0], k.shape[0]
    for h in range(q.shape[1]):
        s = q[:, h].float() @ k[:, h // group].float().T / math.sqrt(q.shape[2])
        if causal:
            s = s.masked_fill(torch.ones(lq, lk, dtype=torch.bool).tril(lk - lq).logical_not(), float("-inf"))
        out[:, h] = torch.softmax(s, -1) @ v[:, h // group].float()
    return out.to(q.dtype)


def fake_flashinfer(wrong: str | None = None):
    """The three FlashInfer 0.7.4 entry points the GPU checks call, with their signatures
    (flashinfer/sampling.py ``top_k_top_p_sampling_from_probs``, flashinfer/decode.py
    ``BatchDecodeWithPagedKVCacheWrapper(ws, kv_layout, backend=...).plan(indptr, indices,
    last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, **kw).run(q, paged_kv_cache)``,
    flashinfer/prefill.py ``BatchPrefillWithRaggedKVCacheWrapper(ws, kv_layout, backend=...)
    .plan(qo_indptr, kv_indptr, num_qo_heads, num_kv_heads, head_dim_qk, causal=..., **kw).run(q, k, v)``),
    computed naively on the CPU; ``wrong`` breaks one of them on purpose."""

    def sample(probs, top_k, top_p, generator=None):
        dist = gc.reference_top_k_top_p(probs[0], top_k, top_p if wrong != "sampling" else 1.0)  # wrong: top-p ignored
        return torch.multinomial(dist.expand(probs.shape[0], -1), 1, replacement=True, generator=generator)[:, 0].int()

    class Decode:
        def __init__(self, ws, layout, backend="auto"):
            assert layout == "NHD" and backend == "fa2"

        def plan(self, indptr, indices, last, hq, hkv, d, page, **kw):
            self.p = (indptr, indices, last, page)

        def run(self, q, cache):
            indptr, indices, last, page = self.p
            out = []
            for b in range(q.shape[0]):
                pages = indices[indptr[b]:indptr[b + 1]].long()
                n = (len(pages) - 1) * page + int(last[b])
                kv = cache[pages if wrong != "decode" else pages.flip(0)]
                k, v = (kv[:, i].reshape(-1, *kv.shape[3:])[:n] for i in (0, 1))
                out.append(_naive(q[b:b + 1], k, v, causal=False))
            return torch.cat(out)

    class Prefill:
        def __init__(self, ws, layout, backend="auto"):
            assert layout == "NHD" and backend == "fa2"

        def plan(self, qo_indptr, kv_indptr, hq, hkv, d, causal=False, **kw):
            self.p = (qo_indptr, kv_indptr, causal and wrong != "prefill")

        def run(self, q, k, v):
            qo, kv, causal = self.p
            return torch.cat([_naive(q[qo[b]:qo[b + 1]], k[kv[b]:kv[b + 1]], v[kv[b]:kv[b + 1]], causal)
                              for b in range(len(qo) - 1)])

    return types.SimpleNamespace(sampling=types.SimpleNamespace(top_k_top_p_sampling_from_probs=sample),
                                 BatchDecodeWithPagedKVCacheWrapper=Decode, BatchPrefillWithRaggedKVCacheWrapper=Prefill)


def test_the_gpu_checks_pass_against_correct_kernels_on_the_cpu():
    fi = fake_flashinfer()
    s = gc.check_sampling(torch, fi, dev="cpu")
    assert s["pass"] and s["same_seed_same_samples"] and s["outside_support"] == 0, s
    d = gc.check_decode(torch, fi, dev="cpu", kv_lens=(1, 37, 130), hq=8, hkv=2, d=64)
    assert d["pass"], d
    p = gc.check_prefill(torch, fi, dev="cpu", lens=(1, 17, 40), hq=8, hkv=2, d=64)
    assert p["pass"], p


@pytest.mark.parametrize("broken", ["sampling", "decode", "prefill"])
def test_the_gpu_checks_fail_against_a_wrong_kernel(broken):
    fi = fake_flashinfer(wrong=broken)
    results = {"sampling": gc.check_sampling(torch, fi, dev="cpu"),
               "decode": gc.check_decode(torch, fi, dev="cpu", kv_lens=(1, 37, 130), hq=8, hkv=2, d=64),
               "prefill": gc.check_prefill(torch, fi, dev="cpu", lens=(1, 17, 40), hq=8, hkv=2, d=64)}
    assert {k: v["pass"] for k, v in results.items()} == {k: k != broken for k in results}


# --------------------------------------------------------------------------- the CPU part, as CI runs it


@needs_flashinfer
@pytest.mark.slow
@pytest.mark.nvcc
def test_cpu_part_builds_through_the_shim_and_checks_sass_and_links(clean_env, tmp_path, real_nvcc13):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), "--arch", "12.0", "--modules", "activation",
                           "--jobs", "2", "--budget", "600"], env=clean_env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rep = json.loads((out / "gpu_check.json").read_text())
    checks = rep["checks"]
    assert {k: checks[k]["status"] for k in ("build", "sass", "link")} == {"build": "pass", "sass": "pass", "link": "pass"}
    assert rep["targets"] == ["sm_120f"] and rep["toolkit"]["cuda_version"].startswith("13.")
    (mod,) = checks["build"]["modules"]
    assert mod["status"] == "built" and "/base/.cache/flashinfer/" in mod["library"]  # a fresh workspace
    assert checks["sass"]["modules"] == {"silu_and_mul.so": ["sm_120f"]}
    assert "libcudart.so.13" in checks["link"]["needed"]["silu_and_mul.so"]
    for name in ("sampling", "decode", "prefill", "runtime link", "warm", "overhead"):
        assert checks[name]["status"] == "skipped" and "torch.cuda.is_available()" in checks[name]["detail"]
    assert proc.stdout.splitlines()[0].split() == ["check", "status", "s", "detail"]
    assert not [p for p in out.iterdir() if p.name.startswith("gpu-check-")]  # the workspace went


def test_without_a_gpu_or_arch_the_script_says_what_to_pass(clean_env, tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path)], env=clean_env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "--arch" in proc.stderr


def test_a_relative_out_is_made_absolute_and_a_failed_build_still_names_its_reason_whole_and_targets(
        tmp_path, monkeypatch, capsys):
    reason = "flashinfer-sm120: " + " ".join(f"word{i}" for i in range(60)) + " Fix: the-fix-named-last"
    calls = []

    def run(argv, env, timeout):
        calls.append(dict(env))
        return 2, "", "noise\n" + reason + "\n"

    monkeypatch.setattr(gc, "_run", run)
    monkeypatch.chdir(tmp_path)
    rc = gc.main(["--out", "results/", "--arch", "12.0", "--modules", "activation", "--cpu-only"])
    out = capsys.readouterr().out
    assert rc == 1
    assert all(os.path.isabs(calls[0][k]) for k in ("FLASHINFER_WORKSPACE_BASE", "FLASHINFER_SM120_CACHE_DIR"))
    assert (tmp_path / "results" / "gpu_check.json").is_file()
    assert reason in out  # the reason whole, its fix included
    build_row = next(ln for ln in out.splitlines() if ln.startswith("build "))
    shown = build_row.split("exit 2: ", 1)[1].split()
    assert all(w in ["noise", *reason.split()] or w.startswith("[") or w.endswith("]") for w in shown), build_row
    assert "12.0" in out.strip().splitlines()[-1].split("targets ", 1)[1]


# --------------------------------------------------------------------------- the GPU part's bookkeeping


def fake_child(jit, shim_us=100.0, alone_us=100.0, compile_in_warm=False, calls=None):
    """Stands in for ``gpu_check.py --child`` (which needs CUDA): the JSON line it prints."""
    so = jit / "sampling" / "sampling.so"
    maps_before = ("7f-7f r-xp 0 08:01 1 /usr/lib/x86_64-linux-gnu/libcuda.so.1\n"
                   "7f-7f r-xp 0 08:01 2 /venv/nvidia/cu13/lib/libcudart.so.13\n")

    def run(argv, env, timeout):
        mode = argv[-1]
        calls.append((mode, dict(env)))
        if mode == "shim" and compile_in_warm and len(calls) == 2:
            with open(jit / "sampling" / ".ninja_log", "a") as fh:
                fh.write("1\t2\t3\tsampling.cuda.o\tabc\n")  # what ninja appends when it compiles
        us = shim_us if mode == "shim" else alone_us
        out = {"mode": mode, "gpu_name": "NVIDIA H200", "import_s": 3.0, "first_call_s": 4.0,
               "checks": {n: {"pass": True, "seconds": 0.1, "max_abs_err": 0.001} for n in ("sampling", "decode", "prefill")},
               "timing": {n: {"us": us, "spread": 0.01} for n in ("sampling", "decode", "prefill")},
               "maps_before": maps_before, "maps_after": maps_before + f"7f-7f r-xp 0 08:01 3 {so}\n"}
        return 0, "noise\n@@" + json.dumps(out) + "\n", ""

    return run


def gpu_runs(tmp_path, monkeypatch, **kw):
    jit = tmp_path / "base" / "0.7.4" / "90a" / "nvcc13.0.88-1a2b3c4d" / "cached_ops"
    (jit / "sampling").mkdir(parents=True)
    (jit / "sampling" / "sampling.so").write_bytes(b"\x7fELF")
    (jit / "sampling" / ".ninja_log").write_text("# ninja log v5\n")
    (jit.parent / "generated").mkdir()
    calls = []
    monkeypatch.setattr(gc, "_run", fake_child(jit, calls=calls, **kw))
    rep = gc.Report(types.SimpleNamespace(budget=480.0))
    gc._gpu_runs(rep, {"PATH": "/usr/bin"}, str(tmp_path / "view"), str(jit))
    return rep.data, calls, jit


def test_gpu_part_bookkeeping_passes_for_a_good_run(tmp_path, monkeypatch):
    data, calls, jit = gpu_runs(tmp_path, monkeypatch)
    checks = data["checks"]
    assert [m for m, _ in calls] == ["shim", "shim", "alone"]
    alone_env = calls[2][1]
    assert alone_env["FLASHINFER_SM120_DISABLE"] == "1" and alone_env["CUDA_HOME"] == str(tmp_path / "view")
    plain = jit.parent.parent  # FlashInfer's own workspace points at the same modules
    assert os.readlink(plain / "cached_ops") == str(jit) and os.readlink(plain / "generated") == str(jit.parent / "generated")
    assert {n: checks[n]["status"] for n in gc.GPU_CHECKS} == dict.fromkeys(gc.GPU_CHECKS, "pass")
    assert checks["runtime link"]["modules_loaded"] == [str(jit / "sampling" / "sampling.so")]
    assert checks["warm"]["compiles"] == [] and data["timings"]["warm_first_call_s"] == 4.0
    assert checks["overhead"]["ratios"]["decode"]["ratio"] == 1.0


def test_gpu_part_bookkeeping_fails_on_a_compile_in_the_warm_process_and_on_overhead(tmp_path, monkeypatch):
    data, _, _ = gpu_runs(tmp_path, monkeypatch, compile_in_warm=True, alone_us=70.0)
    checks = data["checks"]
    assert checks["warm"]["status"] == "fail" and checks["warm"]["compiles"] == ["sampling"]
    assert checks["overhead"]["status"] == "fail" and checks["overhead"]["ratios"]["sampling"]["ratio"] == 0.7


@pytest.mark.slow  # over 4 s in the quick run (--durations, 2026-12-02)
def test_the_child_prints_one_json_line_with_checks_timings_and_maps(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "flashinfer", fake_flashinfer())
    monkeypatch.setattr(gc, "TIMING_ITERS", 1)
    monkeypatch.setattr(gc, "TIMING_REPEATS", 3)
    gc.child_main("alone", dev="cpu")
    out = gc._child_result(capsys.readouterr().out, "child")
    assert "error" not in out, out.get("error")
    assert {n: c["pass"] for n, c in out["checks"].items()} == {"sampling": True, "decode": True, "prefill": True}
    assert set(out["timing"]) == {"sampling", "decode", "prefill"} and all(t["us"] > 0 for t in out["timing"].values())
    assert out["first_call_s"] > 0 and "/" in out["maps_after"]
