"""GPU compute capabilities: NVML first (no CUDA context, so a later ``fork()`` still works), else
``torch.cuda`` as FlashInfer 0.7.4's ``CompilationContext.__init__`` reads them, once torch is imported.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from flashinfer_sm120.errors import GPUQueryError

__all__ = ["GPU", "visible_gpus", "select_visible", "query", "GPUQuery"]


@dataclass(frozen=True)
class GPU:
    """One GPU: NVML ``index`` (PCI bus order), ``name``, ``uuid`` (``GPU-...``), ``capability`` ``(12, 0)``."""

    index: int
    name: str
    uuid: str
    capability: tuple[int, int]


def select_visible(gpus: list[GPU], cuda_visible_devices: str | None) -> list[GPU]:
    """The GPUs ``CUDA_VISIBLE_DEVICES`` leaves visible, in its order, without repeats (CUDA C Programming
    Guide, "CUDA Environment Variables": indices or UUID prefixes, up to the first invalid entry)."""
    if cuda_visible_devices is None:
        return list(gpus)
    chosen: list[GPU] = []
    for raw in cuda_visible_devices.split(","):
        entry = raw.strip()
        match: GPU | None = None
        if entry.isdigit() or (entry.startswith("-") and entry[1:].isdigit()):
            idx = int(entry)
            if 0 <= idx < len(gpus):
                match = gpus[idx]
        elif entry.upper().startswith("GPU-"):
            hits = [g for g in gpus if g.uuid.upper().startswith(entry.upper())]
            if len(hits) == 1:
                match = hits[0]
        elif entry.upper().startswith("MIG-"):
            # Old form MIG-GPU-<parent uuid>/<gi>/<ci> names the parent GPU.  The new form
            # MIG-<instance uuid> does not, so every GPU is kept: a superset of targets builds a
            # little more but never misses the GPU in use.
            parent = entry[4:].split("/")[0].upper()
            hits = [g for g in gpus if g.uuid.upper().startswith(parent)] if parent.startswith("GPU-") else []
            for g in hits if len(hits) == 1 else gpus:
                if g not in chosen:
                    chosen.append(g)
            continue
        if match is None:
            break  # CUDA ignores this entry and every one after it
        if match not in chosen:
            chosen.append(match)
    return chosen


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _nvml_devices() -> list[GPU]:
    try:
        import pynvml  # nvidia-ml-py
    except Exception as exc:  # not installed, or broken
        raise GPUQueryError(f"pynvml not importable: {exc!r}") from exc
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # no driver / no libnvidia-ml.so.1 in this container
        raise GPUQueryError(f"nvmlInit failed: {exc}") from exc
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(h)
            out.append(GPU(i, _text(pynvml.nvmlDeviceGetName(h)), _text(pynvml.nvmlDeviceGetUUID(h)),
                           (int(major), int(minor))))
        return out
    except pynvml.NVMLError as exc:
        raise GPUQueryError(f"NVML failed while listing GPUs: {exc}") from exc
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # pragma: no cover - shutdown errors are not actionable
            pass


@dataclass(frozen=True)
class GPUQuery:
    """The visible GPUs; ``source`` ``"nvml"``, ``"torch.cuda"`` or ``"none"``; ``note``: why not NVML."""

    gpus: tuple[GPU, ...]
    source: str
    note: str | None = None

    def describe(self) -> str:
        """One line for logs and ``doctor``, e.g. ``"torch.cuda (NVML: nvmlInit failed: ...)"``."""
        return self.source + (f" (NVML: {self.note})" if self.note else "")


def _torch_devices() -> list[GPU] | None:
    """Capabilities as FlashInfer reads them, or ``None`` before torch is imported (that costs seconds)."""
    cuda = getattr(sys.modules.get("torch"), "cuda", None)
    if cuda is None:
        return None
    return [GPU(i, f"cuda:{i} (from torch.cuda)", "", tuple(int(x) for x in cuda.get_device_capability(i)))
            for i in range(int(cuda.device_count()))]


def query(*, torch_fallback: bool = True) -> GPUQuery:
    """Visible GPUs, NVML first, else ``torch.cuda`` when ``torch_fallback``.  Never raises: a failure
    gives an empty list and a ``note``."""
    try:
        return GPUQuery(tuple(select_visible(_nvml_devices(), os.environ.get("CUDA_VISIBLE_DEVICES"))), "nvml")
    except GPUQueryError as exc:
        note = str(exc)
    except Exception as exc:  # a broken pynvml must not break the import of FlashInfer
        note = f"NVML raised {exc!r}"
    devices = None
    if torch_fallback:
        try:
            devices = _torch_devices()
        except Exception as exc:
            note += f"; torch.cuda failed too: {exc!r}"
    if devices is None:
        return GPUQuery((), "none", note)
    return GPUQuery(tuple(devices), "torch.cuda", note)


def visible_gpus() -> list[GPU]:
    return list(query().gpus)
