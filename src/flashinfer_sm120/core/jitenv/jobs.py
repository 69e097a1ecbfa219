"""``MAX_JOBS`` for the server's JIT from the memory budget, and the user's ``MAX_JOBS`` and
``FLASHINFER_NVCC_THREADS`` read exactly as FlashInfer reads them.

FlashInfer runs one ninja per module with ``-j MAX_JOBS`` (or ninja's default, CPUs + 2).  When
the user has not set a ``MAX_JOBS`` FlashInfer can use, :func:`server_max_jobs` gives the value
exported: compiles of the heaviest module family that fit in what this process may use
(:mod:`.memory`) less :data:`MARGIN`, at most the CPUs.  Which module the server builds next is
not known, so the heaviest family decides; a family's estimate is its default, or the largest
peak ``build`` recorded here (``<cache root>/compile-memory.json``) plus :data:`RECORDED_MARGIN`.
``FLASHINFER_NVCC_THREADS`` is never chosen here (``--threads=N`` is part of the compile line ninja
records, so a value differing between ``build`` and the server would rebuild every module), but
enters the estimate: nvcc compiles up to ``min(threads, targets)`` targets at once.
"""

from __future__ import annotations

import dataclasses
import os

from flashinfer_sm120.safety.formats.reads import read_json_file
from flashinfer_sm120.safety.formats.base import shown
from flashinfer_sm120.errors import FormatError, StateFileError
from flashinfer_sm120.core.jitenv.memory import MIB, MemoryView, fmt_bytes, read_memory

__all__ = ["MARGIN", "RECORDED_KEEP", "RECORDED_MARGIN", "Family", "FAMILIES", "Estimate", "estimates_path",
           "recorded", "family_estimate", "heaviest_estimate", "cpus", "raw_env", "flashinfer_max_jobs",
           "user_threads", "server_max_jobs"]

#: Share of the memory read that compiles leave free (other processes, page cache, estimate error).
MARGIN = 0.15
#: Peaks kept per family; the estimate is the largest of them plus :data:`RECORDED_MARGIN`.
RECORDED_KEEP = 8
#: Added to a recorded peak: peaks are read per process (``ru_maxrss``), and a
#: compile step is nvcc plus the one tool it runs at a time (cicc, ptxas, cudafe++, gcc).
RECORDED_MARGIN = 0.15
_ESTIMATES_MAX_BYTES = 256 << 10
#: The largest ``-j`` every ninja takes: 1.11 parses it into an ``int`` and stops with
#: "invalid -j parameter" above (1.13 takes any value).
_NINJA_J_MAX = 2**31 - 1
_MAX_DIGITS = 64  # int() of a longer string of digits is refused here, not computed


@dataclasses.dataclass(frozen=True)
class Family:
    """Modules alike in what one compile takes: ``pattern`` is matched (``re.search``) against FlashInfer's
    module name; ``default_mib`` is one compile process's peak (``--threads 1``, one target) before any was
    recorded here; ``source`` says where it comes from."""

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


@dataclasses.dataclass(frozen=True)
class Estimate:
    """What one compile process of a module takes: bytes, its family, and where the figure comes from."""

    bytes: int
    family: str
    source: str


def estimates_path() -> str:
    """``<cache root>/compile-memory.json``.

    :raises StateFileError: no usable cache root."""
    from flashinfer_sm120.safety.fs.statedir import cache_root

    return os.path.join(cache_root(), "compile-memory.json")


def recorded() -> dict[str, list[int]]:
    """``{family: [peak bytes, ...]}`` recorded here; anything malformed is dropped."""
    try:
        data = read_json_file(estimates_path(), _ESTIMATES_MAX_BYTES, follow=False,
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


def family_estimate(fam: Family, recorded: dict[str, list[int]]) -> Estimate:
    peaks = recorded.get(fam.name)
    if peaks:
        peak = max(peaks)
        return Estimate(int(peak * (1 + RECORDED_MARGIN)), fam.name,
                        f"recorded: {fam.name} peaked at {fmt_bytes(peak)} here, the largest of the last "
                        f"{len(peaks)}, +{RECORDED_MARGIN:.0%}")
    return Estimate(fam.default_mib * MIB, fam.name, f"default for {fam.name}, {fam.source}")


def heaviest_estimate() -> Estimate:
    """The largest estimate over the known families: what a run-time JIT build may need."""
    known = recorded()
    return max((family_estimate(f, known) for f in FAMILIES[:-1]), key=lambda e: e.bytes)


def cpus() -> int:
    """CPUs this process may run on (``sched_getaffinity``)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def raw_env(name: str, env) -> str | None:
    """``name`` in ``env`` (default ``os.environ``) as text, or ``None``."""
    value = (os.environ if env is None else env).get(name)
    return value if value is None or isinstance(value, str) else str(value)


def flashinfer_max_jobs(raw: str | None) -> tuple[int | None, str | None]:
    """``(-j FlashInfer passes to ninja, problem)`` for ``MAX_JOBS=raw``, read exactly as FlashInfer
    0.7.x reads it (``flashinfer/jit/cpp_ext.py`` ``_get_num_workers``: ``raw.isdigit()``, then
    ``int(raw)``; ``0`` is ninja's "no limit").  ``problem`` is set when FlashInfer cannot use the
    value as set: it ignores it (not all digits: ninja's default of CPUs + 2 jobs, whatever the
    memory), crashes on it (``'²'.isdigit()`` is true, ``int('²')`` raises), or ninja 1.11 stops
    on it (above 2147483647)."""
    if raw is None:
        return None, None
    fix = ("Fix: set MAX_JOBS to a whole number such as 4 (ASCII digits only), or unset it to let "
           "flashinfer-sm120 choose from the memory")
    if not raw.isdigit():
        return None, (f"MAX_JOBS={shown(raw, 20)} is ignored by FlashInfer (not all digits), so its JIT "
                      f"builds would run ninja's default of CPUs + 2 jobs whatever the memory. {fix}")
    try:
        value = int(raw) if len(raw) <= _MAX_DIGITS else None
    except ValueError:
        value = None
    if value is None:
        return None, (f"MAX_JOBS={shown(raw, 20)} makes every FlashInfer JIT build raise ValueError "
                      f"(FlashInfer's isdigit() accepts it, int() does not). {fix}")
    if value > _NINJA_J_MAX:
        return None, (f"MAX_JOBS={shown(raw, 20)} is above {_NINJA_J_MAX}: ninja 1.11 stops with "
                      f"'invalid -j parameter'. {fix}")
    return value, None


def user_threads(env=None) -> tuple[str | None, int | None]:
    """``(raw FLASHINFER_NVCC_THREADS, value FlashInfer uses)``, read as FlashInfer 0.7.x reads it
    (``get_nvcc_parallelism_flags``: ``int(value)``, which takes `` 2 ``, ``+4``, ``1_0`` and other
    scripts' digits; unparsable or below 1: it warns and uses 1); ``(None, None)`` when unset."""
    raw = raw_env("FLASHINFER_NVCC_THREADS", env)
    if raw is None:
        return None, None
    try:
        value = int(raw) if len(raw) <= _MAX_DIGITS else 1
    except ValueError:
        value = 1
    return raw, value if value >= 1 else 1


def server_max_jobs(targets: int = 1, env=None, view: MemoryView | None = None) -> tuple[int | None, str]:
    """``(MAX_JOBS to export, why)`` for the server's run-time JIT; ``(None, why)`` when the user set a
    ``MAX_JOBS`` FlashInfer uses (theirs wins) or memory cannot be read."""
    raw = raw_env("MAX_JOBS", env)
    _value, problem = flashinfer_max_jobs(raw)
    if raw is not None and problem is None:
        return None, f"MAX_JOBS={shown(raw, 20)} set by you: kept"
    refused = f"{problem} Instead: " if problem else ""
    view = view or read_memory()
    if view.available is None:
        return None, refused + f"MAX_JOBS not exported: memory unknown ({view.describe()}), ninja's default applies"
    factor = max(1, min(user_threads(env)[1] or 1, targets))
    est = heaviest_estimate()
    per = est.bytes * factor
    budget = int(view.available * (1 - MARGIN))
    n_cpus = cpus()
    value = max(1, min(n_cpus, budget // max(1, per)))
    return value, refused + (
        f"MAX_JOBS={value} exported: {fmt_bytes(budget)} for compiles ({fmt_bytes(view.available)} available "
        f"less {MARGIN:.0%}: {view.source}), {fmt_bytes(per)} per compile of the heaviest family ({est.source}"
        + (f", x{factor} targets compiled at once" if factor > 1 else "") + f"), at most {n_cpus} CPUs")
