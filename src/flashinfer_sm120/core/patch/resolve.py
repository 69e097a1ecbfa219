"""What is decided before FlashInfer is touched (:class:`Resolution`: the release, the GPUs, the arch list, the
toolkit and its linkable home), made by :mod:`.decide` or replayed from the record (:mod:`.laststatus`)."""

from __future__ import annotations

import importlib.metadata
import sys
from dataclasses import dataclass
from typing import Any

from flashinfer_sm120.core.facts.arch import ArchSpec, parse_arch_list_lenient
from flashinfer_sm120.core.facts.releases import ReleaseInfo
from flashinfer_sm120.core.toolkit.model import GPU, Choice, CudaHome, GPUQuery, Rejection, RejectKind, Toolkit

__all__ = ["Resolution", "arch_specs", "flashinfer_version"]


@dataclass(frozen=True)
class Resolution:
    """Everything decided before patching."""

    choice: Choice | None  # None: no toolkit fits (guard)
    home: Any  # the CUDA_HOME handed to FlashInfer (a core.view.CudaHome), or None
    gpus: tuple[GPU, ...]
    arch_list: str | None  # FLASHINFER_CUDA_ARCH_LIST, cut to ARCH_LIST_SHOWN characters
    arch_list_error: str | None  # why (part of) it was ignored
    naive_root: str | None  # what FlashInfer's own get_cuda_path() would return
    explicit_home: str | None = None  # CUDA_HOME (else CUDA_PATH) as the user set it
    release: ReleaseInfo | None = None
    gpu_query: GPUQuery | None = None
    cleaned: tuple[str, ...] = ()  # a note per malformed CUDA_HOME/CUDA_PATH that was cleaned
    error: str | None = None  # the ToolkitError message when no toolkit fits
    fix: str | None = None  # its fix line alone
    targets_from: str = "gpus"  # "arch_list": FLASHINFER_CUDA_ARCH_LIST had a usable entry
    own: bool = False  # the chosen nvcc is the one FlashInfer alone runs: nothing to announce
    naive_lacks: tuple[str, ...] = ()  # what FlashInfer's builds need that naive_root lacks (view.meta.lacks)

    @property
    def guard(self) -> bool:
        return self.choice is None

    def to_dict(self) -> dict:  # status()["resolution"], and the record laststatus.replay reads back
        return {
            "choice": self.choice.to_dict() if self.choice else None,
            "cuda_home": self.home.to_dict() if self.home is not None else None,
            "gpus": [
                {"index": g.index, "name": g.name, "uuid": g.uuid,
                 "capability": f"{g.capability[0]}.{g.capability[1]}"}
                for g in self.gpus
            ],
            "gpu_source": self.gpu_query.describe() if self.gpu_query else None,
            "arch_list": self.arch_list,
            "arch_list_error": self.arch_list_error,
            "targets_from": self.targets_from,
            "flashinfer_naive_cuda_home": self.naive_root,
            "explicit_cuda_home": self.explicit_home,
            "release": self.release.to_dict() if self.release else None,
            "cleaned": list(self.cleaned),
            "error": self.error,
            "fix": self.fix,
            "flashinfer_naive_lacks": list(self.naive_lacks),
        }

    @classmethod
    def from_dict(cls, d: dict, release: ReleaseInfo | None, own: bool) -> Resolution:
        """The resolution :meth:`to_dict` gave; raises on a malformed one (the caller resolves afresh)."""
        c = d["choice"]

        def rejection(r: dict) -> Rejection:
            kind = RejectKind(r["kind"])
            why = r["reason"][len("not chosen ("):-1] if kind is RejectKind.NOT_CHOSEN else r["reason"]
            return Rejection(Toolkit.from_dict(r["toolkit"]), kind, why)

        choice = Choice(Toolkit.from_dict(c["toolkit"]), tuple(_arch_target(t) for t in c["targets"]),
                        tuple(tuple(map(int, cap.split("."))) for cap in c["capabilities"]),
                        tuple(rejection(r) for r in c["rejected"]), c["reason"], c["torch_cuda"])
        gpus = tuple(GPU(g["index"], g["name"], g["uuid"], tuple(map(int, g["capability"].split("."))))
                     for g in d["gpus"])
        source, _, note = d["gpu_source"].partition(" (NVML: ")
        return cls(choice, CudaHome(**dict(d["cuda_home"], added=tuple(d["cuda_home"]["added"]))), gpus,
                   d["arch_list"], d["arch_list_error"], d["flashinfer_naive_cuda_home"],
                   explicit_home=d["explicit_cuda_home"], release=release,
                   gpu_query=GPUQuery(gpus, source, note[:-1] or None), cleaned=tuple(d["cleaned"]),
                   targets_from={"arch_list": "arch_list", "gpus": "gpus"}[d["targets_from"]], own=own,
                   naive_lacks=tuple(d["flashinfer_naive_lacks"]))


def _arch_target(text: str) -> tuple[int, str]:
    """``(12, "0f")`` for ``sm_120f`` (:func:`~flashinfer_sm120.core.facts.arch.format_target`'s inverse)."""
    digits = text.removeprefix("sm_").rstrip("abcdefghijklmnopqrstuvwxyz")
    return int(digits[:-1]), text[len("sm_") + len(digits) - 1:]


def arch_specs(value: str | None) -> tuple[list[ArchSpec] | None, str | None]:
    """Parse ``FLASHINFER_CUDA_ARCH_LIST`` leniently: ``(specs, message)``; bad entries are dropped (the
    message names each), and with no usable entry ``specs`` is ``None``: the visible GPUs are targeted."""
    if value is None:
        return None, None
    specs, errors = parse_arch_list_lenient(value)
    if not errors:
        return specs, None
    if specs:
        kept = " ".join(f"{s.major}.{s.minor}{s.suffix or ''}" for s in specs)
        return specs, " ".join(errors) + f" Ignoring the bad entries; using {kept}."
    return None, " ".join(errors) + " No usable entry: targeting the GPUs present."


def flashinfer_version() -> str | None:
    """The FlashInfer release in this process (``flashinfer/version.py``, 0.4.0 - 0.7.4), else the installed
    distribution's version, else ``None``."""

    try:
        ver = importlib.import_module("flashinfer.version").__version__ if "flashinfer" in sys.modules else None
    except Exception:
        ver = None
    if isinstance(ver, str) and not ver.startswith("0.0.0"):
        return ver
    try:
        return importlib.metadata.version("flashinfer-python")
    except Exception:
        return None
