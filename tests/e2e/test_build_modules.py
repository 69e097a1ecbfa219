"""``build NAME`` writes exactly the JIT modules FlashInfer's public API loads on its first call.

The reference is FlashInfer itself, per release: a child process calls the public
wrappers' ``plan()`` and the public functions on CPU tensors, with stand-ins
for the GPU (pinned host memory is plain memory, ``get_compute_capability`` says
12.0, per-stream scratch buffers are host buffers, and ``JitSpec.build_and_load`` writes the module's ``build.ninja``, notes its
name and text, and returns a stand-in module instead of compiling).  FlashInfer's
module getters are cached per process, so their caches are cleared before each
call: every API reports every module it loads, shared or not.  Then
``build --ninja-only`` must write the same modules, with byte-identical
``build.ninja``, and no other.

API calls and the FlashInfer code they reach (0.7.4; the same getters in 0.6.7 and 0.6.18):
``BatchPrefillWith{Paged,Ragged}KVCacheWrapper.plan`` -> ``prefill.get_batch_prefill_module``;
``BatchDecodeWithPagedKVCacheWrapper.plan`` -> ``decode.get_batch_decode_module``, and with
``use_tensor_cores=True`` (vLLM 0.11+ ``v1/attention/backends/flashinfer.py``) ->
``get_batch_prefill_module``; ``top_k_top_p_sampling_from_logits``, ``rmsnorm`` (its CUDA JIT
path, ``FLASHINFER_USE_CUDA_NORM=1``), ``apply_rope_with_cos_sin_cache_inplace``,
``silu_and_mul``, ``append_paged_kv_cache`` -> ``get_{sampling,norm,rope,act_and_mul,page}_module``.
0.4.0 is left out: its sdist's ``flashinfer/`` package has no attention sources to generate from.
"""

import json
import os
import sys

import pytest

from helpers.child import cli, run_py
from helpers.host import needs_flashinfer, release_dir

pytestmark = needs_flashinfer

RELEASES = [pytest.param("0.6.7", marks=pytest.mark.slow), pytest.param("0.6.18", marks=pytest.mark.slow),
            "installed"]

#: build name -> the API calls (keys of CALLS below) whose first use it must warm
API_OF = {"prefill": ["paged_prefill", "ragged_prefill"], "decode": ["decode", "decode_tensor_cores"],
          "sampling": ["sampling"], "norm": ["rmsnorm"], "rope": ["rope"], "activation": ["silu_and_mul"],
          "page": ["append_paged_kv_cache"]}

API = r"""
import json, sys, helpers.fakegpu, flashinfer_sm120, torch, flashinfer
import flashinfer.jit.core as core
from unittest import mock

loaded = []

def build_and_load(self, *a, **k):  # stand-in: write the ninja file FlashInfer would build, load nothing
    self.write_ninja()
    loaded.append([self.name, self.ninja_path.read_text()])
    return mock.MagicMock(name=self.name)

core.JitSpec.build_and_load = build_and_load
_empty = torch.empty
torch.empty = lambda *a, **k: _empty(*a, **{n: v for n, v in k.items() if n != "pin_memory"})
torch.cuda.is_current_stream_capturing = lambda: False
import flashinfer.decode, flashinfer.prefill, flashinfer.sampling, flashinfer.norm, flashinfer.rope
import flashinfer.activation, flashinfer.page, flashinfer.utils as fu
mods = [m for n, m in sorted(sys.modules.items()) if n.startswith("flashinfer") and m is not None]

def stand_in(name, new):  # FlashInfer modules bind utils' helpers by name: replace each binding
    old = getattr(fu, name, None)  # absent before 0.7
    for m in mods:
        if getattr(m, name, None) is old:
            setattr(m, name, new)

stand_in("get_compute_capability", lambda device=None: (12, 0))
# sampling's per-CUDA-stream scratch buffers (0.7.4 utils._get_stream_cache_buf): plain host memory
stand_in("_get_stream_cache_buf", lambda name, num_bytes, device, zero_init=False, **k: torch.zeros(
    num_bytes, dtype=torch.uint8))

ws = torch.empty(128 << 20, dtype=torch.uint8)
i32 = lambda *v: torch.tensor(v, dtype=torch.int32)
bf = torch.bfloat16
CALLS = {
    "paged_prefill": lambda: flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD").plan(
        i32(0, 4), i32(0, 1), i32(0), i32(4), 32, 8, 128, 16, causal=True, q_data_type=bf, kv_data_type=bf),
    "ragged_prefill": lambda: flashinfer.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD").plan(
        i32(0, 4), i32(0, 4), 32, 8, 128, causal=True, q_data_type=bf, kv_data_type=bf),
    "decode": lambda: flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD").plan(
        i32(0, 1), i32(0), i32(4), 32, 8, 128, 16, q_data_type=bf, kv_data_type=bf),
    "decode_tensor_cores": lambda: flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        ws, "NHD", use_tensor_cores=True).plan(i32(0, 1), i32(0), i32(4), 32, 8, 128, 16,
                                              q_data_type=bf, kv_data_type=bf),
    "sampling": lambda: flashinfer.sampling.top_k_top_p_sampling_from_logits(torch.randn(2, 16), 4, 0.9),
    "rmsnorm": lambda: flashinfer.norm.rmsnorm(torch.randn(2, 64, dtype=bf), torch.ones(64, dtype=bf)),
    "rope": lambda: flashinfer.rope.apply_rope_with_cos_sin_cache_inplace(
        torch.arange(2), torch.randn(2, 512, dtype=bf), torch.randn(2, 128, dtype=bf), 128,
        torch.randn(16, 128), True),
    "silu_and_mul": lambda: flashinfer.activation.silu_and_mul(torch.randn(2, 128, dtype=bf)),
    "append_paged_kv_cache": lambda: flashinfer.page.append_paged_kv_cache(
        torch.randn(4, 8, 128, dtype=bf), torch.randn(4, 8, 128, dtype=bf), i32(0, 0, 0, 0), i32(0, 1, 2, 3),
        torch.zeros(2, 2, 16, 8, 128, dtype=bf), i32(0), i32(0, 1), i32(4)),
}
out = {"release": flashinfer.__version__, "calls": {}}
for name, call in CALLS.items():
    for m in mods:  # FlashInfer's getters are functools caches: make each call load what it needs
        for f in list(vars(m).values()):
            if callable(getattr(f, "cache_clear", None)):
                f.cache_clear()
    loaded.clear()
    try:
        call()
        err = None
    except Exception as e:  # after the load the stand-in module cannot run: only what loaded counts
        err = repr(e)[:300]
    out["calls"][name] = {"loaded": list(loaded), "error": err}
print("@@" + json.dumps(out))
"""


def _build(env, names):
    proc = cli(["build", "--arch", "12.0", "--ninja-only", "--json", *names], env, 300, fakegpu=True,
               python=sys.executable)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {m["name"]: m for m in json.loads(proc.stdout)["modules"]}


@pytest.mark.slow  # seconds: whole builds, servers or worker fleets in child processes
@pytest.mark.parametrize("release", RELEASES)
def test_build_writes_what_the_public_api_loads(release, clean_env, real_nvcc13):
    env = dict(clean_env, FAKE_GPU_CAPS="12.0", FLASHINFER_CUDA_ARCH_LIST="12.0")
    target = release_dir(release)
    if target:
        env["PYTHONPATH"] = target + os.pathsep + env["PYTHONPATH"]
    api, proc = run_py(API, dict(env, FLASHINFER_USE_CUDA_NORM="1"))
    if target:
        assert api["release"] == release
    want = {}
    for name, calls in API_OF.items():
        want[name] = {}
        for call in calls:
            got = api["calls"][call]
            assert got["loaded"], f"{call} loaded no JIT module on {api['release']}: {got['error']}"
            want[name].update(dict(got["loaded"]))
    # prefill alone (decode loads it too, so together they would hide a missing one), then the rest at once
    for names in (["prefill"], ["decode", "sampling", "norm", "rope", "activation", "page"]):
        built = _build(env, names)
        expect = {n: text for name in names for n, text in want[name].items()}
        assert set(built) == set(expect), (names, sorted(built), sorted(expect))
        for n, text in expect.items():
            with open(built[n]["ninja"]) as f:
                assert f.read() == text, f"{n}: build.ninja differs from the one FlashInfer writes"


def test_a_name_gives_each_module_its_api_loads_once():
    from flashinfer_sm120.warmup.modules import expand

    labels = lambda *names, **kw: [v.label for v in expand(list(names), **kw)]
    # decode: the CUDA-core module and, for use_tensor_cores=True, the FA2 prefill module
    assert labels("decode") == ["decode-bf16-hd128", "prefill-bf16-hd128"]
    assert labels("prefill") == ["prefill-bf16-hd128"]
    assert labels("decode", "prefill", head_dims="64,128") == [
        "decode-bf16-hd64", "decode-bf16-hd128", "prefill-bf16-hd64", "prefill-bf16-hd128"]
    assert labels("prefill", kv_dtypes="fp8_e4m3") == ["prefill-bf16-kvfp8_e4m3-hd128"]
    gens = {v.label: (v.getter.module, v.getter.name) for v in expand(["all"])}
    assert gens["prefill-bf16-hd128"] == ("flashinfer.prefill", "get_batch_prefill_module")
    assert gens["decode-bf16-hd128"] == ("flashinfer.decode", "get_batch_decode_module")


def test_getter_arguments_follow_the_uri_signature():
    from types import SimpleNamespace

    from flashinfer_sm120.warmup.modules import ModuleError, _args_for, expand

    torch = SimpleNamespace(bfloat16="bf16", float16="f16", int32="i32")  # names stand for dtypes
    imported = "flashinfer" in sys.modules

    prefill = expand(["prefill"], head_dims="64")[0]
    values = prefill.make_args(torch)

    def uri_a(backend, dtype_q, dtype_kv, dtype_o, dtype_idx, head_dim_qk, head_dim_vo, pos_encoding_mode,
              use_sliding_window, use_logits_soft_cap, use_fp16_qk_reduction, use_token_head_sf=False, *rest):
        pass

    assert _args_for(uri_a, values, prefill) == ("fa2", "bf16", "bf16", "bf16", "i32", 64, 64, 0,
                                                 False, False, False, False)

    def uri_b(dtype_q, new_flag, dtype_kv):  # a release with a parameter build does not know
        pass

    with pytest.raises(ModuleError, match="'new_flag'.*FLASHINFER_SM120_RECORD"):
        _args_for(uri_b, values, prefill)
    assert ("flashinfer" in sys.modules) == imported  # not even the message imports FlashInfer


CAPTURE = r"""
import json, threading, wrapt, flashinfer
import flashinfer.jit.core as core
from flashinfer.jit.norm import gen_norm_module
from flashinfer_sm120.warmup import modules

# what another hook (warmup/record.py) leaves on the class: a wrapt wrapper; here it builds nothing
wrapt.wrap_function_wrapper(core.JitSpec, "build_and_load", lambda wrapped, self, a, k: "built " + self.name)
hooked = core.JitSpec.__dict__["build_and_load"]
other = []

def getter():  # as some FlashInfer getters do: fall back on any Exception
    spec = gen_norm_module()
    t = threading.Thread(target=lambda: other.append(spec.build_and_load()))
    t.start()
    t.join()  # another thread's build_and_load during the capture reaches the hook, not the capture
    try:
        return spec.build_and_load()
    except Exception:
        return "fallback"

v = modules.expand(["norm"])[0]
got = modules._first_load(getter, (), v)
out = {"name": got.name, "restored": core.JitSpec.__dict__["build_and_load"] is hooked, "other": other,
       "after": gen_norm_module().build_and_load()}
try:
    modules._first_load(lambda: None, (), v)
except modules.ModuleError as e:
    out["nothing"] = str(e)
print("@@" + json.dumps(out))
"""


def test_capture_takes_this_threads_first_load_and_restores_the_class(clean_env, real_nvcc13):
    out, proc = run_py(CAPTURE, dict(clean_env, FLASHINFER_CUDA_ARCH_LIST="12.0"))
    assert out["name"] == "norm" and out["restored"], proc.stderr[-2000:]
    assert out["other"] == ["built norm"] and out["after"] == "built norm"
    assert "get_norm_module loaded no JIT module for norm" in out["nothing"]
