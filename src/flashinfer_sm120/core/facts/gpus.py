"""GPU compute capabilities: NVML first, else what FlashInfer itself reads.

``torch.cuda.get_device_capability`` (what FlashInfer uses) initialises CUDA in
the calling process, which breaks a later ``fork()`` of inference workers.  NVML
(``nvidia-ml-py``, the ``pynvml`` module) reads the same facts from the driver
without touching the CUDA runtime, so it is asked first.

Where NVML is unavailable (a container without ``libnvidia-ml.so.1``, no
``pynvml``) or fails, the capabilities come from ``torch.cuda`` exactly as
FlashInfer reads them in ``CompilationContext.__init__``
(``flashinfer/compilation_context.py``: ``torch.cuda.device_count()`` and
``torch.cuda.get_device_capability(i)``), but only when torch is already
imported: FlashInfer imports it and builds a ``CompilationContext`` at import,
so this costs nothing FlashInfer would not do a moment later.  The source used
is recorded (:data:`last_source`) and shown by ``doctor``.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass

from flashinfer_sm120.errors import GPUQueryError

logger = logging.getLogger("flashinfer_sm120")

__all__ = ["GPU", "GPUQueryError", "visible_gpus", "select_visible", "query", "GPUQuery", "last_source"]


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


class NVMLUnavailable(Exception):
    """NVML cannot be loaded or initialised (internal: triggers the torch fallback)."""


def _nvml_devices() -> list[GPU]:
    try:
        import pynvml  # nvidia-ml-py
    except Exception as exc:  # not installed, or broken
        raise NVMLUnavailable(f"pynvml not importable: {exc!r}") from exc
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # no driver / no libnvidia-ml.so.1 in this container
        raise NVMLUnavailable(f"nvmlInit failed: {exc}") from exc
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


@dataclass(frozen=True)
class GPUQuery:
    """The visible GPUs and where they were read.

    Attributes:
        gpus: visible GPUs.
        source: ``"nvml"``, ``"torch.cuda"`` (NVML unavailable or failed) or ``"none"``.
        note: why NVML was not used, or ``None``.
    """

    gpus: tuple[GPU, ...]
    source: str
    note: str | None = None

    def describe(self) -> str:
        """One line for logs and ``doctor``, e.g. ``"torch.cuda (NVML: nvmlInit failed: ...)"``."""
        return self.source + (f" (NVML: {self.note})" if self.note else "")


#: How the last :func:`query` read the GPUs (``None`` before the first call).
last_source: GPUQuery | None = None


def _torch_devices() -> list[GPU] | None:
    """Capabilities as FlashInfer reads them (``CompilationContext.__init__``), or
    ``None`` when torch is not imported yet (importing it here would cost seconds)."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is None:
        return None
    out = []
    for i in range(int(cuda.device_count())):
        major, minor = cuda.get_device_capability(i)
        out.append(GPU(index=i, name=f"cuda:{i} (from torch.cuda)", uuid="", capability=(int(major), int(minor))))
    return out


def query(*, torch_fallback: bool = True) -> GPUQuery:
    """Visible GPUs, NVML first, else ``torch.cuda`` as FlashInfer reads them.

    ``CUDA_VISIBLE_DEVICES`` is applied to NVML's list (torch applies it itself).

    Args:
        torch_fallback: ask ``torch.cuda`` (already imported only) when NVML is
            unavailable or fails.

    Returns:
        A :class:`GPUQuery`; also kept in :data:`last_source`.

    Raises:
        Nothing: every failure ends in an empty list with ``note`` saying why.
    """
    global last_source
    note = None
    try:
        result = GPUQuery(tuple(select_visible(_nvml_devices(), os.environ.get("CUDA_VISIBLE_DEVICES"))), "nvml")
    except (NVMLUnavailable, GPUQueryError) as exc:
        note = str(exc)
        result = None
    except Exception as exc:  # a broken pynvml must not break the import of FlashInfer
        note = f"NVML raised {exc!r}"
        result = None
    if result is None:
        devices = None
        if torch_fallback:
            try:
                devices = _torch_devices()
            except Exception as exc:
                note += f"; torch.cuda failed too: {exc!r}"
        if devices is None:
            result = GPUQuery((), "none", note)
        else:
            result = GPUQuery(tuple(devices), "torch.cuda", note)
    last_source = result
    return result


def visible_gpus() -> list[GPU]:
    """GPUs this process can use, honouring ``CUDA_VISIBLE_DEVICES``.

    NVML first (no CUDA context is created; safe before ``fork()``); where NVML
    is unavailable or fails, ``torch.cuda`` if torch is already imported (see
    :func:`query`).

    Returns:
        Visible GPUs; ``[]`` when neither source sees one.
    """
    return list(query().gpus)
