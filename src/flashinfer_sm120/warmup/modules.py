"""The modules ``build`` knows, as data: each :class:`Variant` calls the getter its FlashInfer API calls on first
use and takes the spec it reaches ``build_and_load`` with, so the URI and ``build.ninja`` are FlashInfer's own."""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import inspect
import itertools
import os
import sys
import threading
from typing import Any, Callable

from flashinfer_sm120.errors import UsageError
from flashinfer_sm120.safety.formats.base import some


class ModuleError(UsageError):
    """A module name or variant flag ``build`` does not know: bad usage (exit 2) wherever it is given."""


#: ``--dtype`` spellings -> torch dtype attribute names (q, o; kv unless ``--kv-dtype``).
DTYPES = {"fp16": "float16", "bf16": "bfloat16", "fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2"}
#: ``--act`` values FlashInfer 0.7.4 knows (flashinfer/jit/activation.py ``act_func_def_str``).
ACTIVATIONS = ("silu", "gelu", "gelu_tanh")


@dataclasses.dataclass(frozen=True)
class Getter:
    """A getter a public API calls on first use; ``uri``: the URI function naming its attention arguments;
    ``fallback``: ``(module, generator)`` where a release lacks it (0.6.7's ``get_norm_module``, with CuTe DSL)."""

    module: str
    name: str
    label: str
    uri: str | None = None
    fallback: tuple[str, str] | None = None


PREFILL = Getter("flashinfer.prefill", "get_batch_prefill_module", "prefill", uri="get_batch_prefill_uri")
DECODE = Getter("flashinfer.decode", "get_batch_decode_module", "decode", uri="get_batch_decode_uri")
ACTIVATION = Getter("flashinfer.activation", "get_act_and_mul_module", "activation")  # one variant per --act


@dataclasses.dataclass(frozen=True)
class Variant:
    """One JIT module: its label (``sampling``, ``decode-bf16-hd128``), the getter and ``make_args(torch)`` (the
    URI function's parameters by name when ``getter.uri`` is set, else the getter's arguments)."""

    label: str
    getter: Getter
    make_args: Callable[[Any], Any]
    headers: tuple[str, ...] = ()

    def spec(self):
        """The ``JitSpec`` the getter builds first (FlashInfer patched); :raises ModuleError: none here."""
        import torch

        g = self.getter
        mod = importlib.import_module(g.module)
        values = self.make_args(torch)
        if g.uri:
            uri_fn = getattr(mod, g.uri, None)
            if uri_fn is None:
                raise ModuleError(f"{_release()} has no {g.module}.{g.uri}, so build cannot tell the arguments of "
                                  f"{g.name} for {self.label}; {_RECORD}")
            args = _args_for(uri_fn, values, self)
        else:
            args = tuple(values)
        getter = getattr(mod, g.name, None)
        if getter is not None:
            return _first_load(getter, args, self)
        if g.fallback is not None:
            return getattr(importlib.import_module(g.fallback[0]), g.fallback[1])(*args)
        raise ModuleError(f"{_release()} has no {g.module}.{g.name}, so build cannot tell which JIT module its "
                          f"API loads for {self.label}; {_RECORD}")


_RECORD = "record the module with FLASHINFER_SM120_RECORD and build --from it"


def _release() -> str:
    version = getattr(sys.modules.get("flashinfer"), "__version__", None)
    return f"FlashInfer {version}" if isinstance(version, str) else "this FlashInfer"


def _args_for(uri_fn: Callable, values: dict, variant: Variant) -> tuple:
    """``uri_fn``'s positional parameters in order, each from ``values`` by name, else its default."""
    out = []
    for p in inspect.signature(uri_fn).parameters.values():
        if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            break
        if p.name in values:
            out.append(values[p.name])
        elif p.default is not p.empty:
            out.append(p.default)
        else:
            raise ModuleError(f"{_release()}'s {uri_fn.__name__} takes {p.name!r}, which build does not set, "
                              f"so it cannot make {variant.label}; {_RECORD}")
    return tuple(out)


class _Loaded(BaseException):
    """Raised in place of ``JitSpec.build_and_load`` with the spec (a getter's ``except Exception`` lets it by)."""

    def __init__(self, spec):
        super().__init__(getattr(spec, "name", "?"))
        self.spec = spec


_CAPTURE_LOCK = threading.Lock()


def _first_load(getter: Callable, args: tuple, variant: Variant):
    """The spec ``getter``'s body (past any ``functools.cache``) calls ``build_and_load`` on first (this thread only)."""
    import flashinfer.jit.core as core

    body = inspect.unwrap(getter)
    me = threading.get_ident()
    classes, seen = [core.JitSpec], {}
    while classes:  # JitSpec and any subclass with its own build_and_load
        cls = classes.pop()
        classes += cls.__subclasses__()
        if "build_and_load" in vars(cls):
            seen[cls] = vars(cls)["build_and_load"]

    def intercept(original):
        def build_and_load(self, *a, **k):
            if threading.get_ident() == me:
                raise _Loaded(self)
            return original.__get__(self, type(self))(*a, **k)
        return build_and_load

    with _CAPTURE_LOCK:
        try:
            for cls, original in seen.items():
                setattr(cls, "build_and_load", intercept(original))
            body(*args)
        except _Loaded as got:
            return got.spec
        finally:
            for cls, original in seen.items():
                setattr(cls, "build_and_load", original)
    raise ModuleError(f"{_release()}'s {variant.getter.name} loaded no JIT module for {variant.label} "
                      "(a prebuilt or non-JIT kernel): nothing to build")


@dataclasses.dataclass(frozen=True)
class _Named:
    what: str
    getters: tuple[Getter, ...]
    #: CUDA library headers beyond nvcc, cudart and curand that its sources include.
    headers: tuple[str, ...] = ()


#: Headers some modules include, and the ``cuda-toolkit`` extra (pip wheel) that brings them.
#: Read from FlashInfer 0.7.4: ``csrc/norm.cu`` includes ``flashinfer/norm/fused_dit_layernorm.cuh``,
#: which reaches ``flashinfer/trtllm/common/cudaUtils.h`` -> ``cublasLt.h`` and ``cublas_v2.h``.
EXTRA_HEADERS = {"cublasLt.h": ("cublas", "nvidia-cublas", "cuBLAS")}


#: Which getter each public API reaches on its first call (FlashInfer 0.4.0 - 0.7.4 ``prefill.py``,
#: ``decode.py``, ``sampling.py``, ``norm/__init__.py``, ``rope.py``, ``activation.py``, ``page.py``).
#: Tensor-core decode: ``BatchDecodeWithPagedKVCacheWrapper.plan`` with ``use_tensor_cores=True`` calls
#: ``get_batch_prefill_module`` with the prefill wrappers' arguments; vLLM's FlashInfer backend always
#: sets it (``vllm/v1/attention/backends/flashinfer.py`` ``_get_decode_wrapper``), SGLang's
#: ``should_use_tensor_core`` for an fp8 KV cache or a GQA group of 4+ (``flashinfer_backend.py``).
NAMES: dict[str, _Named] = {
    "sampling": _Named("top-k/top-p/min-p sampling kernels (flashinfer.sampling)",
                       (Getter("flashinfer.sampling", "get_sampling_module", "sampling"),)),
    "norm": _Named("RMSNorm, fused add+RMSNorm, LayerNorm (flashinfer.norm): its CUDA JIT module; FlashInfer "
                   "0.6.7+ runs CuTe DSL kernels instead (no nvcc, not built here) unless "
                   "FLASHINFER_USE_CUDA_NORM=1 or the installed CuTe DSL cannot target the GPU",
                   (Getter("flashinfer.norm", "get_norm_module", "norm",
                           fallback=("flashinfer.jit.norm", "gen_norm_module")),), headers=("cublasLt.h",)),
    "rope": _Named("rotary position embedding, Llama 3.1 RoPE (flashinfer.rope)",
                   (Getter("flashinfer.rope", "get_rope_module", "rope"),)),
    "activation": _Named("fused act-and-mul, e.g. silu_and_mul for SwiGLU MLPs (flashinfer.activation); --act",
                         (ACTIVATION,)),
    "page": _Named("append to a paged KV cache (flashinfer.page.append_paged_kv_cache)",
                   (Getter("flashinfer.page", "get_page_module", "page"),)),
    "decode": _Named("batch decode attention on a paged KV cache: BatchDecodeWithPagedKVCacheWrapper loads "
                     "decode-* (CUDA cores, its default) or, with use_tensor_cores=True (vLLM always; SGLang "
                     "with an fp8 KV cache or 4+ query heads per KV head), the FA2 prefill module prefill-*; "
                     "builds both; "
                     "--head-dim, --dtype, --kv-dtype", (DECODE, PREFILL)),
    "prefill": _Named("batch prefill attention, FA2 backend: BatchPrefillWithPagedKVCacheWrapper and "
                      "BatchPrefillWithRaggedKVCacheWrapper both load prefill-* (on FlashInfer 0.7.4 the "
                      "..._kv_stride_equal module; paged K and V caches with different strides load a second "
                      "one lazily, not built); --head-dim, --dtype, --kv-dtype", (PREFILL,)),
}

#: Head dims FlashInfer instantiates: 64 (GPT-2-size, some Phi), 128 (Llama 2/3, Mistral, Qwen2/3,
#: DeepSeek-V2-Lite dense layers), 256 (Gemma 2/3), and 80, 96, 192.
HEAD_DIMS = (64, 128, 256, 80, 96, 192)


def _csv(value: str | None, default: tuple, flag: str, allowed, parse=str) -> list:
    """``value``'s comma- or space-separated items (``default`` when unset); :raises ModuleError: one not allowed."""
    if value is None:
        return list(default)
    parts = [p for p in str(value).replace(" ", ",").split(",") if p]
    choices = [str(a) for a in allowed]
    bad = next((p for p in parts if p not in choices), None) if parts else value
    if bad is not None:
        raise ModuleError(f"{flag} {bad!r} is not one build knows", f"choose from {', '.join(choices)}")
    return [parse(p) for p in parts]


def expand(names: list[str], *, head_dims: str | None = None, dtypes: str | None = None,
           kv_dtypes: str | None = None, acts: str | None = None) -> list[Variant]:
    """Module names (or ``all``) and the variant flags as variants, in order, each module once (``decode
    prefill`` share one); imports nothing of FlashInfer.  :raises ModuleError: naming the valid values."""
    if "all" in names:
        names = list(NAMES) + [n for n in names if n not in NAMES and n != "all"]
    unknown = [n for n in names if n not in NAMES]
    if unknown:
        close = difflib.get_close_matches(unknown[0].lower(), [*NAMES, "all"], n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ModuleError(f"unknown module(s) {some(unknown)}{hint}", f"choose from {', '.join(NAMES)} (or all); "
                          "`flashinfer-sm120 build --list` describes each")
    hds = _csv(head_dims, (128,), "--head-dim", HEAD_DIMS, int)
    dts = _csv(dtypes, ("bf16",), "--dtype", DTYPES)
    kvs = _csv(kv_dtypes, (), "--kv-dtype", DTYPES) if kv_dtypes else [None]
    act_list = _csv(acts, ("silu",), "--act", ACTIVATIONS)
    out: list[Variant] = []
    for name in names:
        n = NAMES[name]
        for g in n.getters:
            if g.uri:  # attention: one variant per dtype, KV dtype and head dim
                out += [_attention(g, dt, kv or dt, hd, n.headers) for dt, kv, hd in itertools.product(dts, kvs, hds)]
            elif g is ACTIVATION:
                out += [Variant(f"activation-{a}", g, lambda torch, a=a: (a,), n.headers) for a in act_list]
            else:
                out.append(Variant(g.label, g, lambda torch: (), n.headers))
    return list({v.label: v for v in out}.values())


def _attention(g: Getter, dt: str, kv: str, hd: int, headers: tuple[str, ...] = ()) -> Variant:
    def make_args(torch, dt=dt, kv=kv, hd=hd):
        q, k = getattr(torch, DTYPES[dt]), getattr(torch, DTYPES[kv])
        # FA2 writes no fp8 output: an fp8 query needs o_data_type, and bf16 is what servers pass
        o = q if not dt.startswith("fp8") else torch.bfloat16
        # the wrappers' plan(): PosEncodingMode NONE, window_left -1, logits_soft_cap 0,
        # use_fp16_qk_reduction False (flashinfer/prefill.py, flashinfer/decode.py 0.4.0 - 0.7.4)
        return {"backend": "fa2", "dtype_q": q, "dtype_kv": k, "dtype_o": o, "dtype_idx": torch.int32,
                "head_dim_qk": hd, "head_dim_vo": hd, "pos_encoding_mode": 0, "use_sliding_window": False,
                "use_logits_soft_cap": False, "use_fp16_qk_reduction": False}

    # build's name for it: decode-bf16-hd128, prefill-bf16-kvfp8_e4m3-hd128
    return Variant(f"{g.label}-{dt}" + (f"-kv{kv}" if kv != dt else "") + f"-hd{hd}", g, make_args, headers)


def missing_headers(variants: list[Variant], include_dirs: list[str], cuda_release: str,
                    pip_toolkit: bool, toolkit_root: str) -> list[tuple[list[str], str, str]]:
    """``(labels, why, fix)`` per header some variants need that none of ``include_dirs`` holds, the fix for the
    toolkit at ``toolkit_root`` (a pip install when ``pip_toolkit``)."""
    out: dict[str, list[str]] = {}
    for v in variants:
        for h in v.headers:
            if not any(os.path.isfile(os.path.join(d, h)) for d in include_dirs):
                out.setdefault(h, []).append(v.label)
    msgs = []
    for h, labels in out.items():
        extra, wheel, what = EXTRA_HEADERS[h]
        names = ", ".join(labels)
        fix = (f"pip install 'cuda-toolkit[{extra}]=={cuda_release}.*' (the {wheel} wheel of your nvcc's release)"
               if pip_toolkit else f"install {what} for CUDA {cuda_release} into that toolkit (NVIDIA's "
               f"installer, or your distribution's {what} development package)")
        msgs.append((labels, f"{names} include{'s' if len(labels) == 1 else ''} {h} ({what}), which the toolkit at "
                     f"{toolkit_root} does not have (a CPU build of torch does not bring it; a CUDA build installs "
                     f"{wheel})", fix))
    return msgs


def describe_all() -> str:
    lines = ["Modules (flashinfer-sm120 build NAME ...; 'all' builds every one the toolkit has the headers for, "
             "naming any left out). Each builds the JIT "
             "module(s) the named FlashInfer API loads on its first call, for the installed release:"]
    width = max(map(len, NAMES))
    for name, n in NAMES.items():
        needs = "".join(f"; needs {h} (pip: cuda-toolkit[{EXTRA_HEADERS[h][0]}])" for h in n.headers)
        lines.append(f"  {name:<{width}}  {n.what}{needs}")
    lines += [
        "",
        "Variant flags (attention modules get one variant per combination):",
        "  --head-dim 64,128,256   head dims (default 128); common: 64, 128 (Llama, Mistral, Qwen), 256 (Gemma)",
        f"  --dtype bf16,fp16       q/o dtype (default bf16); one of {', '.join(DTYPES)}",
        "  --kv-dtype fp8_e4m3     KV-cache dtype (default: the same as --dtype)",
        f"  --act silu,gelu_tanh    activation for 'activation' (default silu); one of {', '.join(ACTIVATIONS)}",
        "",
        "Example: flashinfer-sm120 build --arch 12.0 sampling rope activation page decode prefill "
        "--head-dim 128 --dtype bf16",
    ]
    return "\n".join(lines)
