"""What one compile of a FlashInfer module takes: per module *family* (:data:`FAMILIES`,
matched on FlashInfer's module name), a default peak per compile process, refined by
the peaks ``build`` recorded when it compiled a module of that family
(:func:`record_peak`, kept in ``<cache root>/compile-memory.json``; the largest of the
last :data:`RECORDED_KEEP` plus :data:`RECORDED_MARGIN`)."""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import time

from flashinfer_sm120.safety import formats
from flashinfer_sm120.errors import FormatError, StateFileError
from flashinfer_sm120.core.jitenv.memory import MIB, fmt_bytes

logger = logging.getLogger("flashinfer_sm120")

__all__ = ["Family", "Estimate", "FAMILIES", "family_of", "estimate", "family_estimate", "heaviest_estimate",
           "record_peak", "recorded", "estimates_path", "RECORDED_KEEP", "RECORDED_MARGIN"]

#: Peaks kept per family; the estimate is the largest of them plus :data:`RECORDED_MARGIN`.
RECORDED_KEEP = 8
#: Added to a recorded peak: peaks are read per process (``ru_maxrss``), and a
#: compile step is nvcc plus the one tool it runs at a time (cicc, ptxas, cudafe++, gcc).
RECORDED_MARGIN = 0.15
_ESTIMATES_MAX_BYTES = 256 << 10


@dataclasses.dataclass(frozen=True)
class Family:
    """Modules alike in what one compile takes.

    Attributes:
        name: the family.
        pattern: matched (``re.search``) against FlashInfer's module name.
        default_mib: peak memory of one compile process (``--threads 1``, one target)
            before anything was recorded here.
        source: where the default comes from.
    """

    name: str
    pattern: str
    default_mib: int
    source: str


#: First match wins; the last entry matches everything.  Defaults: measured here (the
#: largest process of one module build, ``ru_maxrss`` from ``wait4``: nvcc 13.0.88, one
#: target sm_120f, ``--threads 1``) with a margin, or, for the heavy CUTLASS families we
#: cannot build on these machines, FlashInfer's own AOT baseline
#: (``scripts/jit_cache_build_common.sh``: 8 GB per job) and the 3-8 GiB per nvcc of
#: FlashInfer issue 3634.
FAMILIES: tuple[Family, ...] = (
    Family("cutlass_gemm", r"gemm|bmm|cutlass|fp4|fp8|mxfp|nvfp|tgv|groupwise", 8192,
           "FlashInfer scripts/jit_cache_build_common.sh: 8 GB per job; issue 3634: 3-8 GiB per nvcc"),
    Family("fused_moe", r"moe", 8192,
           "FlashInfer scripts/jit_cache_build_common.sh: 8 GB per job; issue 3634: fused_moe_120"),
    Family("attention", r"decode|prefill|attention|mla|pod|fmha|xqa|cascade|sparse", 1024,
           "measured 475 MiB for batch_decode hd128 bf16; prefill not measured: x2"),
    Family("sampling", r"sampling", 1280, "measured 1039 MiB"),
    Family("light", r"norm|rope|page|and_mul|act|quantiz|cat|topk|logits", 512,
           "measured 402 MiB for silu_and_mul"),
    Family("other", r"", 4096, "not measured: a middle value"),
)


def family_of(module: str) -> Family:
    """The family of FlashInfer module ``module`` (``sampling``, ``fp4_gemm_cutlass_sm120``)."""
    for fam in FAMILIES:
        if re.search(fam.pattern, module):
            return fam
    return FAMILIES[-1]


@dataclasses.dataclass(frozen=True)
class Estimate:
    """What one compile process of a module takes.

    Attributes:
        bytes: the estimate.
        family: the module's family.
        source: ``recorded`` or ``default``, with the figures, for people.
    """

    bytes: int
    family: str
    source: str


def estimates_path() -> str:
    """``<cache root>/compile-memory.json``.

    :raises StateFileError: no usable cache root."""
    from flashinfer_sm120.safety.fs.statedir import cache_root

    return os.path.join(cache_root(), "compile-memory.json")


def recorded() -> dict[str, list[int]]:
    """``{family: [peak bytes, ...]}`` recorded here (see :func:`record_peak`)."""
    return _load()


def _load() -> dict[str, list[int]]:
    """``{family: [peak bytes, ...]}`` recorded here; anything malformed is dropped."""
    try:
        data = formats.read_json_file(estimates_path(), _ESTIMATES_MAX_BYTES, follow=False,
                                      owners=(0, os.geteuid()))
    except (FormatError, StateFileError):
        return {}
    out: dict[str, list[int]] = {}
    fams = data.get("families") if isinstance(data, dict) and data.get("schema") == 1 else None
    if not isinstance(fams, dict):
        return {}
    known = {f.name for f in FAMILIES}
    for name, entry in fams.items():
        peaks = entry.get("peaks") if isinstance(entry, dict) else None
        if name in known and isinstance(peaks, list):
            good = [p for p in peaks if type(p) is int and 0 < p < (1 << 45)]
            if good:
                out[name] = good[-RECORDED_KEEP:]
    return out


def estimate(module: str, recorded: dict[str, list[int]] | None = None) -> Estimate:
    """Peak memory of one compile process of ``module`` (``--threads 1``): the largest
    recent recorded peak of its family plus :data:`RECORDED_MARGIN`, else the family default."""
    return family_estimate(family_of(module), _load() if recorded is None else recorded)


def family_estimate(fam: Family, recorded: dict[str, list[int]]) -> Estimate:
    peaks = recorded.get(fam.name)
    if peaks:
        peak = max(peaks)
        return Estimate(int(peak * (1 + RECORDED_MARGIN)), fam.name,
                        f"recorded: {fam.name} peaked at {fmt_bytes(peak)} here, the largest of the last "
                        f"{len(peaks)}, +{RECORDED_MARGIN:.0%}")
    return Estimate(fam.default_mib * MIB, fam.name, f"default for {fam.name}, {fam.source}")


def heaviest_estimate() -> Estimate:
    """The largest estimate over the known families: what a run-time JIT build may need
    when which module comes next is not known."""
    recorded = _load()
    return max((family_estimate(f, recorded) for f in FAMILIES[:-1]), key=lambda e: e.bytes)


def record_peak(module: str, peak_bytes: int, threads_factor: int = 1) -> None:
    """Remember that one compile of ``module`` peaked at ``peak_bytes`` (divided by
    ``threads_factor``, the targets nvcc compiled at once).  Never raises: a file that
    cannot be written only costs accuracy later (logged at INFO)."""
    if peak_bytes <= 0:
        return
    fam = family_of(module).name
    per = int(peak_bytes / max(1, threads_factor))
    try:
        from flashinfer_sm120.safety.fs.statefiles import write_json_atomic

        data = _load()
        data[fam] = (data.get(fam, []) + [per])[-RECORDED_KEEP:]
        write_json_atomic(estimates_path(), {"schema": 1, "at": time.time(),
                                             "families": {k: {"peaks": v} for k, v in sorted(data.items())}})
    except StateFileError as exc:
        logger.info("flashinfer-sm120: compile memory not recorded: %s", exc)
