"""Named FlashInfer JIT modules that ``flashinfer-sm120 build`` knows, with their variants.

Each name maps to one FlashInfer JIT generator (``flashinfer.jit.*.gen_*_module``);
attention modules expand into one variant per head dim and dtype chosen on the
command line (``--head-dim 64,128 --dtype bf16``), never a hard-coded guess.

Sources of the argument lists: FlashInfer 0.7.4 ``flashinfer/decode.py``
(``get_batch_decode_module`` as called by ``BatchDecodeWithPagedKVCacheWrapper.plan``)
and ``flashinfer/prefill.py`` (``get_batch_prefill_module`` with backend ``fa2``,
the backend SM 12.x uses), ``flashinfer/activation.py``, ``norm.py``, ``rope.py``,
``page.py`` and ``sampling.py``.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable

from ..errors import Sm120Error

__all__ = ["ModuleError", "Variant", "NAMES", "DTYPES", "ACTIVATIONS", "EXTRA_HEADERS", "describe_all", "expand",
           "missing_headers"]


class ModuleError(Sm120Error, ValueError):
    """A module name or variant flag ``build`` does not know; the message names the fix."""


#: ``--dtype`` spellings -> torch dtype attribute names (q, o; kv unless ``--kv-dtype``).
DTYPES = {"fp16": "float16", "bf16": "bfloat16", "fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2"}
#: ``--act`` values FlashInfer 0.7.4 knows (flashinfer/jit/activation.py ``act_func_def_str``).
ACTIVATIONS = ("silu", "gelu", "gelu_tanh")


@dataclasses.dataclass(frozen=True)
class Variant:
    """One concrete JIT module to generate: a label, what it is, and how to make its spec."""

    label: str
    what: str
    module: str
    generator: str
    make_args: Callable[[Any], tuple]
    headers: tuple[str, ...] = ()

    def spec(self):
        """Call the FlashInfer generator; returns its ``JitSpec`` (FlashInfer must be patched first)."""
        import torch

        gen = getattr(importlib.import_module(self.module), self.generator)
        return gen(*self.make_args(torch))


@dataclasses.dataclass(frozen=True)
class _Named:
    what: str
    module: str
    generator: str
    attention: bool = False
    activation: bool = False
    #: CUDA library headers beyond nvcc, cudart and curand that its sources include.
    headers: tuple[str, ...] = ()


#: Headers some modules include, and the ``cuda-toolkit`` extra (pip wheel) that brings them.
#: Read from FlashInfer 0.7.4: ``csrc/norm.cu`` includes ``flashinfer/norm/fused_dit_layernorm.cuh``,
#: which reaches ``flashinfer/trtllm/common/cudaUtils.h`` -> ``cublasLt.h`` and ``cublas_v2.h``.
EXTRA_HEADERS = {"cublasLt.h": ("cublas", "nvidia-cublas", "cuBLAS")}


NAMES: dict[str, _Named] = {
    "sampling": _Named("top-k/top-p/min-p sampling kernels (flashinfer.sampling)",
                       "flashinfer.jit.sampling", "gen_sampling_module"),
    "norm": _Named("RMSNorm, fused add+RMSNorm, LayerNorm (flashinfer.norm)",
                   "flashinfer.jit.norm", "gen_norm_module", headers=("cublasLt.h",)),
    "rope": _Named("rotary position embedding, Llama 3.1 RoPE (flashinfer.rope)",
                   "flashinfer.jit.rope", "gen_rope_module"),
    "activation": _Named("fused act-and-mul, e.g. silu_and_mul for SwiGLU MLPs (flashinfer.activation); --act",
                         "flashinfer.jit.activation", "gen_act_and_mul_module", activation=True),
    "page": _Named("append to a paged KV cache (flashinfer.page.append_paged_kv_cache)",
                   "flashinfer.jit.page", "gen_page_module"),
    "decode": _Named("batch decode attention on a paged KV cache (BatchDecodeWithPagedKVCacheWrapper); "
                     "--head-dim, --dtype, --kv-dtype",
                     "flashinfer.jit.attention.modules", "gen_batch_decode_module", attention=True),
    "prefill": _Named("batch prefill attention, FA2 backend (BatchPrefillWith{Paged,Ragged}KVCacheWrapper); "
                      "--head-dim, --dtype, --kv-dtype",
                      "flashinfer.jit.attention.modules", "gen_batch_prefill_module", attention=True),
}

#: Head dims of the common model families: 64 (GPT-2-size, some Phi), 128 (Llama 2/3,
#: Mistral, Qwen2/3, DeepSeek-V2-Lite dense layers), 256 (Gemma 2/3).
COMMON_HEAD_DIMS = (64, 128, 256)


def _csv(value: str | None, default: tuple, flag: str, parse=str) -> list:
    if value is None:
        return list(default)
    out = []
    for part in str(value).replace(" ", ",").split(","):
        if not part:
            continue
        try:
            out.append(parse(part))
        except ValueError:
            raise ModuleError(f"{flag}={value!r}: {part!r} is not valid; e.g. {flag} "
                              f"{','.join(map(str, default))}") from None
    if not out:
        raise ModuleError(f"{flag}={value!r} is empty; e.g. {flag} {','.join(map(str, default))}")
    return out


def _dtype(value: str, flag: str) -> str:
    if value not in DTYPES:
        raise ModuleError(f"{flag}={value!r} is not a dtype build knows; choose from {', '.join(DTYPES)}")
    return value


def expand(names: list[str], *, head_dims: str | None = None, dtypes: str | None = None,
           kv_dtypes: str | None = None, acts: str | None = None) -> list[Variant]:
    """Turn module names and variant flags into concrete variants, in order, without duplicates.

    :param names: module names from :data:`NAMES`, or ``all``.
    :param head_dims: ``--head-dim`` value, comma separated ints (default ``128``).
    :param dtypes: ``--dtype`` value for q/o (default ``bf16``); keys of :data:`DTYPES`.
    :param kv_dtypes: ``--kv-dtype`` value (default: the same as ``--dtype``).
    :param acts: ``--act`` value (default ``silu``); :data:`ACTIVATIONS`.
    :raises ModuleError: unknown name, head dim or dtype (the message lists the valid ones).
    """
    if "all" in names:
        names = list(NAMES) + [n for n in names if n not in NAMES and n != "all"]
    unknown = [n for n in names if n not in NAMES]
    if unknown:
        raise ModuleError(f"unknown module(s) {', '.join(unknown)}; choose from {', '.join(NAMES)} "
                          "(or all); `flashinfer-sm120 build --list` describes each")
    hds = _csv(head_dims, (128,), "--head-dim", int)
    bad = [h for h in hds if h not in COMMON_HEAD_DIMS and h not in (192, 96, 80)]
    if bad:
        raise ModuleError(f"--head-dim {bad[0]} is not one FlashInfer instantiates here; "
                          f"use {', '.join(map(str, COMMON_HEAD_DIMS))} (or 80, 96, 192)")
    dts = [_dtype(d, "--dtype") for d in _csv(dtypes, ("bf16",), "--dtype")]
    kvs = [_dtype(d, "--kv-dtype") for d in _csv(kv_dtypes, ("",), "--kv-dtype")] if kv_dtypes else [None]
    act_list = _csv(acts, ("silu",), "--act")
    for a in act_list:
        if a not in ACTIVATIONS:
            raise ModuleError(f"--act={a!r}; choose from {', '.join(ACTIVATIONS)}")
    out: list[Variant] = []
    for name in names:
        n = NAMES[name]
        if n.attention:
            for dt in dts:
                for kv in kvs:
                    kv = kv or dt
                    for hd in hds:
                        out.append(_attention(name, n, dt, kv, hd))
        elif n.activation:
            for a in act_list:
                out.append(Variant(f"activation-{a}", f"{a}_and_mul", n.module, n.generator,
                                   lambda torch, a=a: (a,), n.headers))
        else:
            out.append(Variant(name, n.what.split(" (")[0], n.module, n.generator, lambda torch: (), n.headers))
    seen: set[str] = set()
    return [v for v in out if not (v.label in seen or seen.add(v.label))]


def _attention(name: str, n: _Named, dt: str, kv: str, hd: int) -> Variant:
    label = f"{name}-{dt}" + (f"-kv{kv}" if kv != dt else "") + f"-hd{hd}"
    what = (f"{name}: q/o {dt}, kv {kv}, int32 indices, head_dim {hd}, no RoPE in kernel, "
            "no sliding window, no logits soft cap")

    def make_args(torch, dt=dt, kv=kv, hd=hd):
        q, k = getattr(torch, DTYPES[dt]), getattr(torch, DTYPES[kv])
        o = q if not dt.startswith("fp8") else torch.bfloat16
        common = (q, k, o, torch.int32, hd, hd, 0, False, False)
        return common if name == "decode" else ("fa2", *common, False)

    return Variant(label, what, n.module, n.generator, make_args, n.headers)


def missing_headers(variants: list[Variant], include_dirs: list[str], cuda_release: str,
                    pip_toolkit: bool, toolkit_root: str) -> list[str]:
    """One message per header some variants need that none of ``include_dirs`` holds, naming the fix.

    :param include_dirs: where nvcc will look (``$CUDA_HOME/include`` first).
    :param cuda_release: the chosen nvcc's ``major.minor``, so the fix installs a matching set.
    :param pip_toolkit: the chosen nvcc comes from pip wheels (the fix is then a pip install).
    :param toolkit_root: the chosen toolkit, named in the message.
    """
    import os

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
        msgs.append(f"{names} include{'s' if len(labels) == 1 else ''} {h} ({what}), which the toolkit at "
                    f"{toolkit_root} does not have (a CPU build of torch does not bring "
                    f"it; a CUDA build installs {wheel}). Fix: {fix}, or leave {names} out")
    return msgs


def describe_all() -> str:
    """The text of ``build --list``: each module, what it is, and its variant flags."""
    lines = ["Modules (flashinfer-sm120 build NAME ...; 'all' builds every one):"]
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
