"""GPU compute capabilities: NVML first (no CUDA context, so a later ``fork()`` still works), else
``torch.cuda`` as FlashInfer 0.7.4's ``CompilationContext.__init__`` reads them, once torch is imported."""

from __future__ import annotations

import contextlib
import os
import sys

from flashinfer_sm120.core.toolkit.model import GPU, GPUQuery


def select_visible(gpus: list[GPU], cuda_visible_devices: str | None) -> list[GPU]:
    """The GPUs ``CUDA_VISIBLE_DEVICES`` leaves visible, in its order, without repeats (CUDA C Programming
    Guide, "CUDA Environment Variables": indices or UUID prefixes, up to the first invalid entry)."""
    if cuda_visible_devices is None:
        return list(gpus)
    chosen: list[GPU] = []
    for entry in (e.strip() for e in cuda_visible_devices.split(",")):
        up = entry.upper()
        if entry.isdigit() or (entry.startswith("-") and entry[1:].isdigit()):
            hits = [gpus[int(entry)]] if 0 <= int(entry) < len(gpus) else []
        elif up.startswith("GPU-"):
            hits = [g for g in gpus if g.uuid.upper().startswith(up)]
        elif up.startswith("MIG-"):
            # MIG-GPU-<parent uuid>/<gi>/<ci> names its GPU; MIG-<instance uuid> does not, so all are kept
            parent = up[4:].split("/")[0]
            hits = [g for g in gpus if g.uuid.upper().startswith(parent)] if parent.startswith("GPU-") else []
            hits = hits if len(hits) == 1 else list(gpus)
        else:
            hits = []
        if len(hits) != 1 and not up.startswith("MIG-"):
            break  # CUDA ignores this entry and every one after it
        chosen += [g for g in hits if g not in chosen]
    return chosen


def _nvml_devices() -> list[GPU]:
    """NVML's GPUs, or ``RuntimeError`` naming the step that failed (the note of :func:`query`)."""
    try:
        import pynvml  # nvidia-ml-py
    except Exception as exc:
        raise RuntimeError(f"pynvml not importable: {exc!r}") from exc
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # no driver / no libnvidia-ml.so.1 in this container
        raise RuntimeError(f"nvmlInit failed: {exc}") from exc
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name, uuid = (x.decode() if isinstance(x, bytes) else str(x)
                          for x in (pynvml.nvmlDeviceGetName(h), pynvml.nvmlDeviceGetUUID(h)))
            out.append(GPU(i, name, uuid, tuple(map(int, pynvml.nvmlDeviceGetCudaComputeCapability(h)))))
        return out
    except pynvml.NVMLError as exc:
        raise RuntimeError(f"NVML failed while listing GPUs: {exc}") from exc
    finally:
        with contextlib.suppress(Exception):  # shutdown errors are not actionable
            pynvml.nvmlShutdown()


def query(*, torch_fallback: bool = True) -> GPUQuery:
    """Visible GPUs, NVML first, else ``torch.cuda`` once torch is imported (importing it costs seconds);
    never raises: a failure gives an empty list and a ``note``."""
    try:
        return GPUQuery(tuple(select_visible(_nvml_devices(), os.environ.get("CUDA_VISIBLE_DEVICES"))), "nvml")
    except RuntimeError as exc:
        note = str(exc)
    except Exception as exc:  # a broken pynvml must not break the import of FlashInfer
        note = f"NVML raised {exc!r}"
    cuda = getattr(sys.modules.get("torch"), "cuda", None) if torch_fallback else None
    if cuda is None:
        return GPUQuery((), "none", note)
    try:
        return GPUQuery(tuple(GPU(i, f"cuda:{i} (from torch.cuda)", "", tuple(map(int, cuda.get_device_capability(i))))
                              for i in range(int(cuda.device_count()))), "torch.cuda", note)
    except Exception as exc:
        return GPUQuery((), "none", f"{note}; torch.cuda failed too: {exc!r}")
