"""What vLLM and SGLang check and redirect at start-up, per release (read from vllm 0.33.0, 0.34.0, sglang 0.5.23;
a newer release is treated as its newest row, and said so).  Nothing here imports a server."""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass

from packaging.specifiers import SpecifierSet
from packaging.version import Version


@dataclass(frozen=True)
class Fallback:
    """A way to serve without FlashInfer's JIT: ``text`` to type, the ``default`` it turns off, and ``markers``
    (``(file in the package, text)``) that show its source defines the option."""

    text: str
    default: str
    markers: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class CacheRule:
    """A server setting FlashInfer's workspace base at import unless it is set."""

    variable: str
    from_variable: str
    default: str
    environ_file: str  # relative to the package: the file that holds ``function``
    function: str
    source: str


@dataclass(frozen=True)
class ArchRule:
    """A server's ``function`` of ``file`` setting ``variable`` per GPU (else ``<major>.<minor><suffix>`` from
    ``min_major``); SGLang 0.5.23 calls it in ``ModelRunner.load_model()``, after FlashInfer's import."""

    variable: str
    file: str
    function: str
    min_major: int
    suffix: str


@dataclass(frozen=True)
class ServerRelease:
    """One row: a server and the releases that behave as the one read."""

    key: str  # module and distribution name
    name: str
    versions: SpecifierSet
    read_from: Version
    flashinfer_check: str
    needs_nvcc_and_ninja: bool  # vLLM's has_flashinfer() asks for both
    nvcc_lookup: str
    cache_rule: CacheRule | None
    arch_rule: ArchRule | None
    fallbacks: tuple[Fallback, ...]


SERVERS: tuple[ServerRelease, ...] = (
    ServerRelease(
        key="vllm", name="vLLM", versions=SpecifierSet(">=0.33,<0.35"), read_from=Version("0.34.0"),
        flashinfer_check=("has_flashinfer() (vllm/utils/flashinfer.py): flashinfer importable, and "
                          "flashinfer-cubin (or VLLM_HAS_FLASHINFER_CUBIN=1) or both an nvcc "
                          "(CUDA_HOME, CUDA_PATH, which nvcc, /usr/local/cuda) and ninja on PATH"),
        needs_nvcc_and_ninja=True,
        nvcc_lookup="_flashinfer_nvcc_path() in vllm/utils/flashinfer.py",
        cache_rule=None,
        arch_rule=None,  # vllm 0.33.0 and 0.34.0 never set FLASHINFER_CUDA_ARCH_LIST
        # Every FlashInfer-backed default of vLLM 0.33.0 and 0.34.0 (vllm/envs.py, vllm/platforms/cuda.py, the MoE
        # oracles); docs/servers.md says what each turns off, and which are left out and why.
        fallbacks=(
            Fallback("VLLM_USE_FLASHINFER_SAMPLER=0", "VLLM_USE_FLASHINFER_SAMPLER defaults to True (vllm/envs.py)",
                     (("envs.py", '"VLLM_USE_FLASHINFER_SAMPLER"'),)),
            Fallback("--attention-backend TRITON_ATTN",
                     "FLASHINFER is in the automatic attention choice (vllm/platforms/cuda.py "
                     "_get_backend_priorities: first on SM100, after FLASH_ATTN on SM120)",
                     (("engine/arg_utils.py", '"--attention-backend"'),
                      ("v1/attention/backends/registry.py", "TRITON_ATTN = "))),
            Fallback("VLLM_BLOCKSCALE_FP8_GEMM_FLASHINFER=0",
                     "VLLM_BLOCKSCALE_FP8_GEMM_FLASHINFER defaults to True (vllm/envs.py)",
                     (("envs.py", '"VLLM_BLOCKSCALE_FP8_GEMM_FLASHINFER"'),)),
            Fallback("VLLM_ALLREDUCE_USE_FLASHINFER=0", "VLLM_ALLREDUCE_USE_FLASHINFER defaults to True (vllm/envs.py)",
                     (("envs.py", '"VLLM_ALLREDUCE_USE_FLASHINFER"'),)),
            Fallback("--moe-backend triton", "--moe-backend auto can pick flashinfer_cutlass/flashinfer_trtllm "
                     "(vllm/model_executor/layers/fused_moe/oracle/, vllm/config/kernel.py MoEBackend)",
                     (("engine/arg_utils.py", '"--moe-backend"'), ("config/kernel.py", '"triton",'))),
        ),
    ),
    ServerRelease(
        key="sglang", name="SGLang", versions=SpecifierSet(">=0.5.23,<0.6"), read_from=Version("0.5.23"),
        flashinfer_check=("is_flashinfer_available() (sglang/srt/utils/common.py): "
                          "SGLANG_IS_FLASHINFER_AVAILABLE, flashinfer importable, and "
                          "torch.cuda.is_available(); no nvcc or ninja check"),
        needs_nvcc_and_ninja=False,
        nvcc_lookup=("cuda_home() (sglang/kernels/jit/utils/compile/toolchain.py) and "
                     "_jit_cuda_version() (sglang/kernels/jit/utils/arch.py)"),
        cache_rule=CacheRule("FLASHINFER_WORKSPACE_BASE", "SGLANG_CACHE_DIR", "~/.cache/sglang",
                             "srt/environ.py", "third_party_cache_defaults",
                             "sglang/__init__.py redirect_third_party_caches() -> sglang/srt/environ.py "
                             "third_party_cache_defaults(), os.environ.setdefault"),
        arch_rule=ArchRule("FLASHINFER_CUDA_ARCH_LIST", "srt/utils/common.py", "set_cuda_arch", 9, "a"),
        # Every FlashInfer-backed default of SGLang 0.5.23, and is_flashinfer_available(), which all of
        # them and set_cuda_arch() ask first; docs/servers.md says what each turns off, and what is left out.
        fallbacks=(
            Fallback("--sampling-backend pytorch", "sampling_backend defaults to flashinfer when FlashInfer is "
                     "available (sglang/srt/arg_groups/overrides.py _sampling_backend_default)",
                     (("srt/server_args.py", '"--sampling-backend"'), ("srt/arg_groups/choices.py", '"pytorch"'))),
            Fallback("--attention-backend triton", "attention_backend defaults to flashinfer for MHA models when "
                     "FlashInfer is available, SM120 included (sglang/srt/arg_groups/model_override_base.py)",
                     (("srt/arg_groups/fields/exec_.py", "attention_backend: "),
                      ("srt/arg_groups/choices.py", '"triton",'))),
            Fallback("--fp4-gemm-backend marlin", "fp4_gemm_runner_backend 'auto' picks flashinfer_cutlass on "
                     "SM120 (sglang/srt/arg_groups/fields/exec_.py)",
                     (("srt/arg_groups/fields/exec_.py", '"--fp4-gemm-backend"'),
                      ("srt/arg_groups/choices.py", '"marlin",'))),
            Fallback("--fp8-gemm-backend triton", "fp8_gemm_runner_backend 'auto' picks FlashInfer's CUTLASS MXFP8 "
                     "GEMM on Blackwell other than SM100/SM103 (sglang/srt/arg_groups/fields/exec_.py)",
                     (("srt/arg_groups/fields/exec_.py", '"--fp8-gemm-backend"'),
                      ("srt/arg_groups/choices.py", '"triton",'))),
            Fallback("--moe-runner-backend triton", "moe_runner_backend 'auto' can pick a flashinfer_* runner "
                     "(sglang/srt/arg_groups/fields/exec_.py, MOE_RUNNER_BACKEND_CHOICES)",
                     (("srt/arg_groups/fields/exec_.py", "moe_runner_backend: "),
                      ("srt/arg_groups/choices.py", '"triton",'))),
            Fallback("SGLANG_IS_FLASHINFER_AVAILABLE=false", "SGLANG_IS_FLASHINFER_AVAILABLE defaults to true "
                     "(sglang/srt/utils/common.py is_flashinfer_available)",
                     (("srt/utils/common.py", '"SGLANG_IS_FLASHINFER_AVAILABLE"'),)),
        ),
    ),
)


@dataclass(frozen=True)
class Installed:
    """A server installed here, its row, and whether the row was read from another version."""

    release: ServerRelease
    version: Version
    assumed: bool  # no row covers this version: the newest row is used

    def label(self) -> str:
        note = f"; checks as read from {self.release.read_from}" if self.assumed else ""
        return f"{self.release.name} {self.version}{note}"


def newest(key: str) -> ServerRelease:
    return max((r for r in SERVERS if r.key == key), key=lambda r: r.read_from)


def installed() -> list[Installed]:
    from flashinfer_sm120.errors import FormatError
    from flashinfer_sm120.safety.formats.grammar import parse_version

    out = []
    for key in dict.fromkeys(r.key for r in SERVERS):
        try:
            text = importlib.metadata.version(key)
            version = parse_version(text, f"{key}'s package metadata")
        except (importlib.metadata.PackageNotFoundError, FormatError):
            continue
        row = next((r for r in SERVERS if r.key == key and r.versions.contains(version, prereleases=True)), None)
        out.append(Installed(row or newest(key), version, row is None))
    return out
