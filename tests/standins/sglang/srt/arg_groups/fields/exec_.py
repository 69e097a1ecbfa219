# Stand-in written from SGLang 0.5.23 sglang/srt/arg_groups/fields/exec_.py: the dataclass fields
# behind --attention-backend, --sampling-backend and the "auto" GEMM and MoE runner backends, whose
# automatic choice can be FlashInfer's (fp4: flashinfer_cutlass on SM120).
from dataclasses import dataclass
from typing import Optional

# the real file declares each with Arg(cli_name=...); the names as the real file spells them
CLI_NAMES = {"fp8_gemm_runner_backend": "--fp8-gemm-backend", "fp4_gemm_runner_backend": "--fp4-gemm-backend"}


@dataclass
class ExecFields:
    attention_backend: Optional[str] = None
    sampling_backend: Optional[str] = None
    fp8_gemm_runner_backend: str = "auto"
    fp4_gemm_runner_backend: str = "auto"
    moe_runner_backend: str = "auto"
