# Stand-in written from SGLang 0.5.23 sglang/srt/arg_groups/fields/exec_.py: the dataclass fields
# behind --attention-backend and --sampling-backend.
from dataclasses import dataclass
from typing import Optional


@dataclass
class ExecFields:
    attention_backend: Optional[str] = None
    sampling_backend: Optional[str] = None
