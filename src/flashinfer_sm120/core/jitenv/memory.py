"""How much memory this process may use: every bound that applies, the lowest wins.

* cgroup v2: ``memory.max`` less the working set (``memory.current`` less ``inactive_file``, the
  page cache the kernel reclaims first, as the kubelet counts it), at every level from this
  process's cgroup up to the mount root (a parent's limit binds its children too);
* cgroup v1: the same from ``memory.limit_in_bytes``, ``memory.usage_in_bytes``, ``total_inactive_file``;
* ``/proc/meminfo`` ``MemAvailable``;
* unified-memory GPUs (GB10, compute capability 12.1: CPU and GPU share one memory): ``MemTotal``
  less what the GPU side holds per NVML (``nvmlDeviceGetMemoryInfo``, else the GPU processes'
  ``usedGpuMemory``: GB10 drivers answer "Not Supported" to the first).  Not ``MemAvailable`` less
  the GPU's share: the driver's pages may already be out of ``MemAvailable``.

Files are read through :mod:`flashinfer_sm120.safety.formats` (bounded, never blocking: P6).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from typing import Any

from flashinfer_sm120.safety.formats.reads import iter_lines, read_text
from flashinfer_sm120.errors import FormatError

logger = logging.getLogger("flashinfer_sm120")

__all__ = ["Bound", "MemoryView", "read_memory", "fmt_bytes", "MIB", "GIB"]

MIB = 1 << 20
GIB = 1 << 30

#: A cgroup v1 limit at or above this is "no limit" (the kernel shows PAGE_COUNTER_MAX pages).
_V1_UNLIMITED = 1 << 60
_SMALL_FILE = 64 << 10
_DIGITS = re.compile(r"[0-9]{1,20}")  # ASCII only: str.isdigit() accepts '²', which int() refuses
_MEMINFO_LINES = 400


def fmt_bytes(n: int | None) -> str:
    """``1.5 GiB``, ``300 MiB``; ``?`` for ``None``."""
    if n is None:
        return "?"
    if abs(n) >= GIB:
        return f"{n / GIB:.1f} GiB"
    return f"{n / MIB:.0f} MiB"


@dataclasses.dataclass(frozen=True)
class Bound:
    """One limit on what this process may still use: what it is, bytes left, how computed (for ``doctor``)."""

    source: str
    available: int
    detail: str


@dataclasses.dataclass(frozen=True)
class MemoryView:
    """Every bound read; ``available`` is the lowest (``None`` when none could be read); ``notes`` say
    what could not be read, and why."""

    available: int | None
    bounds: tuple[Bound, ...]
    notes: tuple[str, ...] = ()

    @property
    def source(self) -> str:
        low = self.lowest()
        return low.source if low else "unknown"

    def lowest(self) -> Bound | None:
        return min(self.bounds, key=lambda b: b.available) if self.bounds else None

    def describe(self) -> str:
        low = self.lowest()
        if low is None:
            return "unknown (" + ("; ".join(self.notes) or "nothing readable") + ")"
        return f"{fmt_bytes(low.available)} ({low.source}: {low.detail})"

    def to_dict(self) -> dict:
        return {"available": self.available, "source": self.source,
                "bounds": [dataclasses.asdict(b) for b in self.bounds], "notes": list(self.notes)}


def _read_small(path: str) -> str | None:
    try:
        return read_text(path, _SMALL_FILE)
    except FormatError:
        return None


def _int_value(text: str | None) -> int | None:
    """A cgroup number file's integer; ``None`` for ``max`` and anything else."""
    t = (text or "").strip()
    return int(t) if _DIGITS.fullmatch(t) else None


def _stat_value(text: str | None, *keys: str) -> int:
    """The first of ``keys`` in a ``memory.stat`` text, else 0."""
    if not text:
        return 0
    found: dict[str, int] = {}
    for line in text.splitlines()[:200]:
        k, _, v = line.partition(" ")
        if k in keys and _DIGITS.fullmatch(v.strip()):
            found[k] = int(v.strip())
    return next((found[k] for k in keys if k in found), 0)


def _own_cgroups(proc_root: str) -> list[tuple[str, str]]:
    """``(version, path)`` of this process's cgroups (v2, and v1's memory controller), from ``/proc/self/cgroup``."""
    out = []
    try:
        lines = list(iter_lines(os.path.join(proc_root, "self", "cgroup"), max_line=4096, max_lines=256))
    except FormatError:
        return out
    for _, raw in lines:
        parts = raw.decode("utf-8", "replace").split(":", 2)
        if len(parts) != 3:
            continue
        hid, controllers, path = parts
        if hid == "0" and controllers == "":
            out.append(("2", path))
        elif "memory" in controllers.split(","):
            out.append(("1", path))
    return out


def _mounts(proc_root: str) -> list[tuple[str, str, str]]:
    """``(version, mount root, mount point)`` of cgroup mounts holding memory, from ``/proc/self/mountinfo``
    (proc(5): ``id parent dev root point opts ... - fstype src super``)."""
    out = []
    try:
        lines = list(iter_lines(os.path.join(proc_root, "self", "mountinfo"), max_line=8192,
                                        max_lines=20000))
    except FormatError:
        return out
    for _, raw in lines:
        fields = raw.decode("utf-8", "replace").split(" ")
        if "-" not in fields:
            continue
        sep = fields.index("-")
        if sep < 5 or len(fields) < sep + 3:
            continue
        root, point = _unescape(fields[3]), _unescape(fields[4])
        fstype, super_opts = fields[sep + 1], fields[sep + 3] if len(fields) > sep + 3 else ""
        if fstype == "cgroup2":
            out.append(("2", root, point))
        elif fstype == "cgroup" and "memory" in super_opts.split(","):
            out.append(("1", root, point))
    return out


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal (``\\040``)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _cgroup_dirs(proc_root: str) -> list[tuple[str, list[str]]]:
    """``(version, [directory, its parents up to the mount point])`` per hierarchy accounting our memory."""
    out = []
    mounts = _mounts(proc_root)
    for version, path in _own_cgroups(proc_root):
        for v, root, point in mounts:
            if v != version:
                continue
            rel = path
            if root != "/" and (path == root or path.startswith(root.rstrip("/") + "/")):
                rel = path[len(root.rstrip("/")):]
            elif root != "/":
                rel = "/"  # a cgroup namespace: our cgroup is the mount's root
            rel = rel.strip("/")
            if any(p in ("", ".", "..") for p in rel.split("/")) and rel:
                continue
            leaf = os.path.join(point, rel) if rel else point
            chain, cur = [], leaf
            while True:
                chain.append(cur)
                if cur == point or len(chain) > 64:
                    break
                cur = os.path.dirname(cur)
            out.append((version, chain))
            break
    return out


#: Per cgroup version: the limit file, the usage file, the reclaimable-cache keys of ``memory.stat``.
_FILES = {"2": ("memory.max", "memory.current", ("inactive_file",)),
          "1": ("memory.limit_in_bytes", "memory.usage_in_bytes", ("total_inactive_file", "inactive_file"))}


def _cgroup_bounds(proc_root: str, notes: list[str]) -> list[Bound]:
    bounds = []
    for version, chain in _cgroup_dirs(proc_root):
        limit_file, used_file, cache_keys = _FILES[version]
        best: Bound | None = None
        for d in chain:
            limit = _int_value(_read_small(os.path.join(d, limit_file)))
            if limit is None or (version == "1" and limit >= _V1_UNLIMITED):
                continue
            used = _int_value(_read_small(os.path.join(d, used_file)))
            cache = _stat_value(_read_small(os.path.join(d, "memory.stat")), *cache_keys)
            working = max(0, (used or 0) - min(cache, used or 0))
            b = Bound(f"cgroup v{version} {d}", max(0, limit - working),
                      f"{limit_file} {fmt_bytes(limit)}, {used_file} {fmt_bytes(used)} "
                      f"of which {fmt_bytes(cache)} reclaimable cache")
            if best is None or b.available < best.available:
                best = b
        if best is not None:
            bounds.append(best)
        elif chain:
            has = os.path.exists(os.path.join(chain[0], limit_file))
            notes.append(f"cgroup v{version} {chain[0]}: " + ("no memory limit" if has else "no memory controller"))
    return bounds


def _meminfo(proc_root: str) -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        for _, raw in iter_lines(os.path.join(proc_root, "meminfo"), max_line=256,
                                         max_lines=_MEMINFO_LINES):
            k, _, rest = raw.decode("ascii", "replace").partition(":")
            words = rest.split()
            if words and _DIGITS.fullmatch(words[0]):
                out[k.strip()] = int(words[0]) * (1024 if words[1:2] == ["kB"] else 1)
    except FormatError:
        pass
    return out


def _gpu_held(nvml: Any) -> tuple[int | None, str] | None:
    """What the GPU side of a unified-memory GPU holds, per NVML: ``(bytes, how)``,
    ``(None, why)`` when it cannot tell, ``None`` without NVML or a unified-memory GPU."""
    if nvml is None:
        try:
            import pynvml as nvml  # nvidia-ml-py
        except Exception as exc:
            return None, f"pynvml not importable ({type(exc).__name__})"
    try:
        nvml.nvmlInit()
    except Exception:
        return None
    try:
        held, unified, how = 0, [], []
        for i in range(int(nvml.nvmlDeviceGetCount())):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            name = nvml.nvmlDeviceGetName(h)
            name = name.decode() if isinstance(name, bytes) else str(name)
            cap = tuple(nvml.nvmlDeviceGetCudaComputeCapability(h))
            try:
                info = nvml.nvmlDeviceGetMemoryInfo(h)
            except Exception:
                info = None
            if not (cap == (12, 1) or "GB10" in name.upper()):
                continue
            unified.append(name)
            if info is not None and getattr(info, "total", 0):
                held += int(info.used)
                how.append(f"{name}: {fmt_bytes(int(info.used))} used (nvmlDeviceGetMemoryInfo)")
                continue
            procs = []
            for getter in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
                try:
                    procs += list(getattr(nvml, getter)(h))
                except Exception:
                    pass
            used = [getattr(p, "usedGpuMemory", None) for p in procs]
            known = [int(u) for u in used if isinstance(u, int) and u >= 0]
            if len(known) != len(used):
                return None, f"{name}: NVML reports no memory use for some GPU processes"
            held += sum(known)
            how.append(f"{name}: {fmt_bytes(sum(known))} held by {len(known)} GPU process(es)")
        if not unified:
            return None
        return held, "; ".join(how)
    except Exception as exc:
        return None, f"NVML failed ({exc})"[:200]
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass


def read_memory(*, proc_root: str = "/proc", gpu: bool = True, nvml: Any = None) -> MemoryView:
    """Memory this process may still use.  Never raises.  ``proc_root`` and ``nvml`` (a module used
    instead of ``pynvml``) are for tests; ``gpu=False`` skips unified-memory GPUs."""
    notes: list[str] = []
    bounds: list[Bound] = []
    try:
        bounds += _cgroup_bounds(proc_root, notes)
    except Exception as exc:  # a strange cgroup tree must not stop a build
        notes.append(f"cgroups unreadable: {exc!r}"[:200])
    info = _meminfo(proc_root)
    if "MemAvailable" in info:
        bounds.append(Bound("MemAvailable", info["MemAvailable"],
                            f"/proc/meminfo MemAvailable of MemTotal {fmt_bytes(info.get('MemTotal'))}"))
    else:
        notes.append("no MemAvailable in /proc/meminfo")
    if gpu and "MemTotal" in info:
        gpu_side = _gpu_held(nvml)  # None: no NVML, or no unified-memory GPU: nothing to subtract
        held, how = gpu_side or (0, "")
        if gpu_side is not None and held is None:
            notes.append(f"unified-memory GPU: cannot tell what the GPU side holds ({how})")
        elif gpu_side is not None:
            bounds.append(Bound("unified-memory GPU", max(0, info["MemTotal"] - held),
                                f"MemTotal {fmt_bytes(info['MemTotal'])} less {how}"))
    low = min((b.available for b in bounds), default=None)
    return MemoryView(low, tuple(bounds), tuple(notes))
