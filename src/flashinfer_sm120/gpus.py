"""GPU compute capabilities from NVML, without creating a CUDA context.

``torch.cuda.get_device_capability`` (what FlashInfer uses) initialises CUDA in
the calling process, which breaks a later ``fork()`` of inference workers.  NVML
(``nvidia-ml-py``, the ``pynvml`` module) reads the same facts from the driver
without touching the CUDA runtime.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from .errors import GPUQueryError

logger = logging.getLogger("flashinfer_sm120")

__all__ = ["GPU", "GPUQueryError", "visible_gpus", "select_visible"]


@dataclass(frozen=True)
class GPU:
    """One GPU as NVML reports it.

    Attributes:
        index: NVML index (PCI bus order).
        name: marketing name, e.g. ``"NVIDIA GeForce RTX 5090"``.
        uuid: ``"GPU-..."`` identifier, as accepted by ``CUDA_VISIBLE_DEVICES``.
        capability: compute capability ``(major, minor)``, e.g. ``(12, 0)``.
    """

    index: int
    name: str
    uuid: str
    capability: tuple[int, int]


def select_visible(gpus: list[GPU], cuda_visible_devices: str | None) -> list[GPU]:
    """Apply ``CUDA_VISIBLE_DEVICES`` semantics to an NVML device list.

    Follows the CUDA C Programming Guide, "CUDA Environment Variables": entries
    are comma-separated indices or ``GPU-``/``MIG-`` UUIDs (prefixes allowed);
    parsing stops at the first invalid entry; an empty value hides every GPU.
    Indices are matched in NVML (PCI bus) order, which equals CUDA's order when
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID``; only the set of capabilities matters here.

    Args:
        gpus: all devices, in NVML order.
        cuda_visible_devices: the variable's value, or ``None`` when unset.

    Returns:
        The visible devices, in the order the variable names them, without repeats.
    """
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
            # Old form MIG-GPU-<parent uuid>/<gi>/<ci> names the parent GPU.  The
            # new form MIG-<instance uuid> does not; NVML would need the MIG
            # handles to map it, so every GPU is kept: a superset of targets
            # builds a little more but never misses the GPU in use.
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


def _nvml_devices() -> list[GPU]:
    import pynvml  # nvidia-ml-py

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:  # no driver on this machine: no GPUs
        logger.debug("NVML unavailable (%s); assuming no GPUs", exc)
        return []
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(h)
            name = pynvml.nvmlDeviceGetName(h)
            uuid = pynvml.nvmlDeviceGetUUID(h)
            out.append(
                GPU(
                    index=i,
                    name=name.decode() if isinstance(name, bytes) else str(name),
                    uuid=uuid.decode() if isinstance(uuid, bytes) else str(uuid),
                    capability=(int(major), int(minor)),
                )
            )
        return out
    except pynvml.NVMLError as exc:
        raise GPUQueryError(f"NVML failed while listing GPUs: {exc}") from exc
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # pragma: no cover - shutdown errors are not actionable
            pass


def visible_gpus() -> list[GPU]:
    """GPUs this process can use, honouring ``CUDA_VISIBLE_DEVICES``.

    Uses NVML only (no CUDA context is created; safe before ``fork()``).

    Returns:
        Visible GPUs; ``[]`` on a machine without an NVIDIA driver.

    Raises:
        GPUQueryError: NVML loaded but failed mid-query (message says why).
    """
    return select_visible(_nvml_devices(), os.environ.get("CUDA_VISIBLE_DEVICES"))
