"""The memory budget of JIT compiles: what this process may use (cgroups, ``MemAvailable``, unified-memory GPUs),
what one compile takes per module family, ``MAX_JOBS`` and ``FLASHINFER_NVCC_THREADS`` as FlashInfer reads them."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import re

from flashinfer_sm120.core.toolkit.memo import Memo
from flashinfer_sm120.errors import FormatError
from flashinfer_sm120.safety.formats.base import shown
from flashinfer_sm120.safety.formats.reads import read_text
from flashinfer_sm120.safety.formats.fields import iter_lines

MIB = 1 << 20
GIB = 1 << 30
#: Share of the memory read that compiles leave free (other processes, page cache, estimate error).
MARGIN = 0.15
#: Peaks kept per family; the estimate is the largest of them plus :data:`RECORDED_MARGIN`.
RECORDED_KEEP = 8
#: Added to a recorded peak: ``ru_maxrss`` is per process, and nvcc runs one tool (cicc, ptxas, gcc) at a time.
RECORDED_MARGIN = 0.15
_V1_UNLIMITED = 1 << 60  # a cgroup v1 limit this high is "no limit" (PAGE_COUNTER_MAX pages)
_DIGITS = re.compile(r"[0-9]{1,20}")  # ASCII only: str.isdigit() accepts '²', which int() refuses
_NINJA_J_MAX = 2**31 - 1  # ninja 1.11 stops with "invalid -j parameter" above
_MAX_DIGITS = 64  # int() of a longer string of digits is refused here, not computed
#: Per cgroup version: the limit file, the usage file, the reclaimable-cache keys of ``memory.stat``.
_FILES = {"2": ("memory.max", "memory.current", ("inactive_file",)),
          "1": ("memory.limit_in_bytes", "memory.usage_in_bytes", ("total_inactive_file", "inactive_file"))}


def fmt_bytes(n: int | None) -> str:
    """``1.5 GiB``, ``300.0 MiB``, ``2.0 KiB``, ``512 B``; ``?`` for ``None``."""
    if n is None:
        return "?"
    for unit, size in (("GiB", GIB), ("MiB", MIB), ("KiB", 1024)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


@dataclasses.dataclass(frozen=True)
class Bound:
    """One limit on what this process may still use: what it is, bytes left, how computed (for ``doctor``)."""

    source: str
    available: int
    detail: str


@dataclasses.dataclass(frozen=True)
class MemoryView:
    """Every bound read; ``available`` is the lowest (``None`` when none could be read); ``notes``: what could not be."""

    available: int | None
    bounds: tuple[Bound, ...]
    notes: tuple[str, ...] = ()

    @property
    def source(self) -> str:
        """The lowest bound's source."""
        return min(self.bounds, key=lambda b: b.available).source if self.bounds else "unknown"

    def to_dict(self) -> dict:
        return dict(dataclasses.asdict(self), source=self.source)


def _number(path: str, *keys: str) -> int | None:
    """A cgroup file's integer (``None``: ``max``, unreadable); with ``keys``: the first in a ``memory.stat``, else 0."""
    try:
        text = read_text(path, 64 << 10)
    except FormatError:
        text = ""
    if not keys:
        return int(text.strip()) if _DIGITS.fullmatch(text.strip()) else None
    found = dict(line.partition(" ")[::2] for line in text.splitlines()[:200])
    return next((int(found[k].strip()) for k in keys if _DIGITS.fullmatch(found.get(k, "").strip())), 0)


def _lines(path: str, max_line: int, max_lines: int) -> list[str]:
    try:
        return [raw.decode("utf-8", "replace") for _, raw in iter_lines(path, max_line=max_line, max_lines=max_lines)]
    except FormatError:
        return []


def _cgroup_bounds(proc_root: str, notes: list[str]) -> list[Bound]:
    """Per hierarchy accounting our memory, the lowest ``limit - (usage - inactive file cache)`` from our cgroup up to
    the mount point (a parent's limit binds its children; the cache as the kubelet counts it)."""
    mounts = []  # (cgroup version, root, mount point)
    for line in _lines(os.path.join(proc_root, "self", "mountinfo"), 8192, 20000):
        fields = line.split(" ")
        sep = fields.index("-") if "-" in fields else -1
        # proc(5): id parent dev root point opts ... - fstype src super; space, tab, newline, backslash escaped \040
        fstype, opts = (fields[sep + 1], fields[sep + 3].split(",")) if 5 <= sep < len(fields) - 3 else ("", [])
        if fstype == "cgroup2" or (fstype == "cgroup" and "memory" in opts):
            root, point = (re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), f) for f in fields[3:5])
            mounts.append(("2" if fstype == "cgroup2" else "1", root, point))
    bounds = []
    for line in _lines(os.path.join(proc_root, "self", "cgroup"), 4096, 256):
        parts = line.split(":", 2)
        if len(parts) != 3 or not (parts[:2] == ["0", ""] or "memory" in parts[1].split(",")):
            continue
        version, path, chain = "2" if parts[:2] == ["0", ""] else "1", parts[2], None
        for v, root, point in mounts:
            base = root.rstrip("/")  # our path outside the mount's root: a cgroup namespace, whose root we are
            rel = (path[len(base):] if (path + "/").startswith(base + "/") else "").strip("/")
            if v == version and not (rel and any(p in ("", ".", "..") for p in rel.split("/"))):
                chain = [os.path.join(point, rel) if rel else point]
                while chain[-1] != point and len(chain) <= 64:
                    chain.append(os.path.dirname(chain[-1]))
                break
        if chain is None:
            continue
        limit_file, used_file, cache_keys = _FILES[version]
        found = []
        for d in chain:
            limit = _number(os.path.join(d, limit_file))
            if limit is None or (version == "1" and limit >= _V1_UNLIMITED):
                continue
            used = _number(os.path.join(d, used_file))
            cache = _number(os.path.join(d, "memory.stat"), *cache_keys)
            working = max(0, (used or 0) - min(cache, used or 0))
            found.append(Bound(f"cgroup v{version} {d}", max(0, limit - working),
                               f"{limit_file} {fmt_bytes(limit)}, {used_file} {fmt_bytes(used)} "
                               f"of which {fmt_bytes(cache)} reclaimable cache"))
        if found:
            bounds.append(min(found, key=lambda b: b.available))
        else:
            has = os.path.exists(os.path.join(chain[0], limit_file))
            notes.append(f"cgroup v{version} {chain[0]}: " + ("no memory limit" if has else "no memory controller"))
    return bounds


def _gpu_held() -> tuple[int | None, str] | None:
    """``(bytes, how)`` the GPU processes of a unified-memory GPU (GB10, 12.1) hold per NVML, ``(None, why)``, or
    ``None``; per process, as GB10 drivers answer "Not Supported" to ``nvmlDeviceGetMemoryInfo``."""
    try:
        import pynvml as nvml  # nvidia-ml-py, a dependency

        nvml.nvmlInit()
    except Exception:
        return None
    try:
        held, how = 0, []
        for i in range(int(nvml.nvmlDeviceGetCount())):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            if tuple(nvml.nvmlDeviceGetCudaComputeCapability(h)) != (12, 1):
                continue
            procs = []
            for getter in (nvml.nvmlDeviceGetComputeRunningProcesses, nvml.nvmlDeviceGetGraphicsRunningProcesses):
                with contextlib.suppress(Exception):  # a driver without graphics processes: the compute ones count
                    procs += list(getter(h))
            used = [getattr(p, "usedGpuMemory", None) for p in procs]
            if not all(isinstance(u, int) and u >= 0 for u in used):
                return None, f"GPU {i}: NVML reports no memory use for some GPU processes"
            held += sum(used)
            how.append(f"GPU {i}: {fmt_bytes(sum(used))} held by {len(used)} GPU process(es)")
        return (held, "; ".join(how)) if how else None
    except Exception as exc:
        return None, f"NVML failed ({exc})"[:200]
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()


def read_memory(*, proc_root: str = "/proc", gpu: bool = True) -> MemoryView:
    """Memory this process may still use: the lowest bound; never raises (``proc_root``: for tests)."""
    notes: list[str] = []
    bounds: list[Bound] = []
    try:
        bounds += _cgroup_bounds(proc_root, notes)
    except Exception as exc:  # a strange cgroup tree must not stop a build
        notes.append(f"cgroups unreadable: {exc!r}"[:200])
    info = {}
    for line in _lines(os.path.join(proc_root, "meminfo"), 256, 400):
        k, _, rest = line.partition(":")
        words = rest.split()
        if words and _DIGITS.fullmatch(words[0]):
            info[k.strip()] = int(words[0]) * (1024 if words[1:2] == ["kB"] else 1)
    if "MemAvailable" in info:
        bounds.append(Bound("MemAvailable", info["MemAvailable"],
                            f"/proc/meminfo MemAvailable of MemTotal {fmt_bytes(info.get('MemTotal'))}"))
    else:  # absent, or not a number of at most 20 digits (a bind-mounted meminfo)
        notes.append("no readable MemAvailable in /proc/meminfo")
    gpu_side = _gpu_held() if gpu and "MemTotal" in info else None
    if gpu_side is not None and gpu_side[0] is None:
        notes.append(f"unified-memory GPU: cannot tell what the GPU side holds ({gpu_side[1]})")
    elif gpu_side is not None:
        bounds.append(Bound("unified-memory GPU", max(0, info["MemTotal"] - gpu_side[0]),
                            f"MemTotal {fmt_bytes(info['MemTotal'])} less {gpu_side[1]}"))
    return MemoryView(min((b.available for b in bounds), default=None), tuple(bounds), tuple(notes))


#: Modules alike in what one compile takes: ``pattern`` is searched in the name; ``default_mib`` one compile's peak
#: (``--threads 1``, one target) until one is recorded here; ``source`` where it comes from.
Family = collections.namedtuple("Family", "name pattern default_mib source")
#: What one compile process of a module takes: bytes, its family, and where the figure comes from.
Estimate = collections.namedtuple("Estimate", "bytes family source")
#: First match wins; the last entry matches everything.  Measured here (``ru_maxrss`` of one module build:
#: nvcc 13.0.88, sm_120f, ``--threads 1``) with a margin, or for heavy CUTLASS families FlashInfer's AOT
#: baseline (``scripts/jit_cache_build_common.sh``: 8 GB per job) and issue 3634 (3-8 GiB per nvcc).
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


def _peaks(e: dict) -> bool:
    peaks = e.get("peaks")
    return isinstance(peaks, list) and all(type(p) is int and 0 < p < (1 << 45) for p in peaks)


#: ``build``'s measured ``peaks`` (bytes, the newest last) per family, in ``<cache root>/compile-memory.json``.
ESTIMATES = Memo("compile-memory.json", 16, _peaks)


def recorded() -> dict[str, list[int]]:
    """``{family: [peak bytes, ...]}`` recorded here by ``build``; a malformed entry is dropped."""
    known = {f.name for f in FAMILIES}
    return {k: e["peaks"][-RECORDED_KEEP:] for k, e in ESTIMATES.entries().items() if k in known and e["peaks"]}


def family_estimate(fam: Family, recorded: dict[str, list[int]]) -> Estimate:
    peaks = recorded.get(fam.name)
    if peaks:
        return Estimate(int(max(peaks) * (1 + RECORDED_MARGIN)), fam.name,
                        f"recorded: {fam.name} peaked at {fmt_bytes(max(peaks))} here, the largest of the last "
                        f"{len(peaks)}, +{RECORDED_MARGIN:.0%}")
    return Estimate(fam.default_mib * MIB, fam.name, f"default for {fam.name}, {fam.source}")


def heaviest_estimate() -> Estimate:
    """The largest estimate over the known families: which module a server builds next is not known."""
    known = recorded()
    return max((family_estimate(f, known) for f in FAMILIES[:-1]), key=lambda e: e.bytes)


def cpus() -> int:
    """CPUs this process may run on (``sched_getaffinity``: the package is Linux-only)."""
    return len(os.sched_getaffinity(0))


def max_jobs(env=None) -> tuple[str | None, int | None, str | None]:
    """``(raw MAX_JOBS, -j FlashInfer passes to ninja, problem)`` as 0.7.x ``_get_num_workers`` reads it (``isdigit()``,
    ``int()``); ``problem``: it ignores, raises on (``'²'``), passes 0 (no limit) or a -j ninja 1.11 stops on."""
    raw = (os.environ if env is None else env).get("MAX_JOBS")
    if raw is None:
        return None, None, None
    try:
        value = int(raw) if raw.isdigit() and len(raw) <= _MAX_DIGITS else None
    except ValueError:  # '²'.isdigit(), int('²') fails
        value = None
    if value is not None and 1 <= value <= _NINJA_J_MAX:
        return raw, value, None
    return raw, None, (f"MAX_JOBS={shown(raw, 20)} is not a whole number from 1 to {_NINJA_J_MAX} in digits: "
                       f"FlashInfer ignores it (ninja's default of CPUs + 2 jobs, whatever the memory), raises "
                       f"ValueError on it, or runs ninja with no limit or one it refuses. Fix: set MAX_JOBS to a whole "
                       f"number such as 4, or unset it to let flashinfer-sm120 choose from the memory")


def user_threads(env=None) -> tuple[str | None, int | None]:
    """``(raw FLASHINFER_NVCC_THREADS, value FlashInfer uses)``, read as 0.7.x ``get_nvcc_parallelism_flags`` does
    (``int(value)``: `` 2 ``, ``+4``, ``1_0``, other scripts' digits; else, or below 1: 1); ``(None, None)`` unset."""
    raw = (os.environ if env is None else env).get("FLASHINFER_NVCC_THREADS")
    if raw is None:
        return None, None
    try:
        value = int(raw) if len(raw) <= _MAX_DIGITS else 1
    except ValueError:
        value = 1
    return raw, max(1, value)


@dataclasses.dataclass(frozen=True)
class Budget:
    """``budget`` bytes for compiles (``None``: memory unknown), ``per`` bytes each, and where each comes from."""

    budget: int | None
    budget_from: str
    per: int
    per_from: str

    @property
    def fits(self) -> int | None:
        return None if self.budget is None else max(1, self.budget // max(1, self.per))


def budget(est: Estimate, targets: int = 1, env=None, view: MemoryView | None = None,
           mem_limit: int | None = None) -> Budget:
    """The one budget of ``build``'s plan and the server's ``MAX_JOBS``: per compile ``est`` x ``min(threads, targets)``."""
    factor = max(1, min(user_threads(env)[1] or 1, targets))
    per_from = est.source + (f", x{factor} targets compiled at once" if factor > 1 else "")
    if mem_limit is not None:
        return Budget(mem_limit, "--mem-limit", est.bytes * factor, per_from)
    view = view or read_memory()
    if view.available is None:
        unknown = "unknown (" + ("; ".join(view.notes) or "nothing readable") + ")"
        return Budget(None, unknown, est.bytes * factor, per_from)
    return Budget(int(view.available * (1 - MARGIN)),
                  f"{fmt_bytes(view.available)} available less {MARGIN:.0%}: {view.source}",
                  est.bytes * factor, per_from)


def server_max_jobs(targets: int = 1, env=None, view: MemoryView | None = None) -> tuple[int | None, str]:
    """``(MAX_JOBS to export, why)``: compiles of the heaviest family that fit, at most the CPUs; ``None`` when the
    user's works in FlashInfer or memory is unknown (``--threads`` is never chosen: it is on ninja's line)."""
    raw, _value, problem = max_jobs(env)
    if raw is not None and problem is None:
        return None, f"MAX_JOBS={shown(raw, 20)} set by you: kept"
    refused = f"{problem}. Instead: " if problem else ""
    b = budget(heaviest_estimate(), targets, env, view)
    if b.budget is None:
        return None, refused + f"MAX_JOBS not exported: memory unknown ({b.budget_from}), ninja's default applies"
    value = max(1, min(cpus(), b.fits))
    return value, refused + (f"MAX_JOBS={value} exported: {fmt_bytes(b.budget)} for compiles ({b.budget_from}), "
                             f"{fmt_bytes(b.per)} per compile of the heaviest family ({b.per_from}), "
                             f"at most {cpus()} CPUs")
