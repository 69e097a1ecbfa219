"""Decide, before touching FlashInfer (nothing is patched here; run outside the patch lock): the release,
the GPUs, the arch list, the toolkit and its linkable home."""

from __future__ import annotations

import enum
import importlib.metadata
import os
import sys
from dataclasses import dataclass
from typing import Any, Sequence

from flashinfer_sm120.core.facts.arch import ArchSpec, parse_arch_list_lenient
from flashinfer_sm120.errors import ToolkitError
from flashinfer_sm120.core.facts.gpus import GPU, GPUQuery
from flashinfer_sm120.core.facts.releases import ReleaseInfo, release_info
from flashinfer_sm120.core.toolkit.model import Choice, Rejection, RejectKind, Toolkit
from flashinfer_sm120.core.view.meta import CudaHome

__all__ = ["Resolution", "TargetsFrom", "resolve", "arch_specs", "flashinfer_version", "cleaned_homes", "own_nvcc"]


class TargetsFrom(str, enum.Enum):
    """Where the targets come from: ``FLASHINFER_CUDA_ARCH_LIST`` (it had a usable entry) or the GPUs."""

    ARCH_LIST = "arch_list"
    GPUS = "gpus"


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
    targets_from: TargetsFrom = TargetsFrom.GPUS
    own: bool = False  # the chosen nvcc is the one FlashInfer alone runs: nothing to announce

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
            "targets_from": self.targets_from.value,
            "flashinfer_naive_cuda_home": self.naive_root,
            "explicit_cuda_home": self.explicit_home,
            "release": self.release.to_dict() if self.release else None,
            "cleaned": list(self.cleaned),
            "error": self.error,
            "fix": self.fix,
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
                   targets_from=TargetsFrom(d["targets_from"]), own=own)


def _arch_target(text: str) -> tuple[int, str]:
    """``(12, "0f")`` for ``sm_120f`` (:func:`~flashinfer_sm120.core.facts.arch.format_target`'s inverse)."""
    digits = text.removeprefix("sm_").rstrip("abcdefghijklmnopqrstuvwxyz")
    return int(digits[:-1]), text[len("sm_") + len(digits) - 1:]


#: Characters of ``FLASHINFER_CUDA_ARCH_LIST`` kept in :attr:`Resolution.arch_list` (messages; the parse sees all).
ARCH_LIST_SHOWN = 200


def _for_messages(value: str | None) -> str | None:
    if value is None or len(value) <= ARCH_LIST_SHOWN:
        return value
    return f"{value[:ARCH_LIST_SHOWN]}... ({len(value)} characters)"


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
    import importlib

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


def cleaned_homes(env: dict[str, str]) -> tuple[str, ...]:
    """A note naming the fix for each ``CUDA_HOME``/``CUDA_PATH`` that ``sources.clean_home`` had to change
    (``:/usr/local/cuda-13.0``, ``/usr/local/cuda-13.0/bin``)."""
    from flashinfer_sm120.core.toolkit.sources import clean_home

    notes = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        val = env.get(var)
        cleaned = clean_home(val) if val else None
        if cleaned is not None and cleaned.rstrip("/") != val.rstrip("/"):
            notes.append(f"{var}={val!r} is malformed; read it as {cleaned!r}. "
                         f"Fix: export {var}={cleaned}")
    return tuple(notes)


def own_nvcc(naive_root: str | None) -> str | None:
    """The real path of the nvcc FlashInfer alone runs (``$naive_root/bin/nvcc``, wrappers and links followed,
    read, not run), else ``None``."""
    if not naive_root:
        return None
    from flashinfer_sm120.safety.trust import follow_wrappers

    nvcc = os.path.join(naive_root, "bin", "nvcc")
    return os.path.realpath(follow_wrappers(nvcc) or nvcc) if os.path.isfile(nvcc) else None


def resolve(env: dict[str, str] | None = None, *, toolkits: Sequence[Toolkit] | None = None,
            release: ReleaseInfo | None = None, guard: bool = False) -> Resolution:
    """Find the GPUs, parse the arch list, choose a toolkit and a linkable home; nothing is patched.

    Args:
        env: environment to read (default ``os.environ``).
        toolkits: candidates (``doctor`` passes every one); default ``sources.discover``, read lazily.
        release: the FlashInfer release (default: the one loaded or installed).
        guard: return a Resolution with ``choice=None`` and ``error`` set instead of raising when no toolkit fits.

    Raises:
        flashinfer_sm120.errors.ToolkitError: no toolkit fits (unless ``guard``).
        flashinfer_sm120.errors.ViewError: the view could not be built.
    """
    from flashinfer_sm120.core.facts.gpus import query
    from flashinfer_sm120.core.toolkit.policy import choose, other_major_allowed, torch_cuda_version
    from flashinfer_sm120.core.toolkit.sources import discover, flashinfer_naive_root
    from flashinfer_sm120.core.view.build import linkable_home

    env = dict(os.environ if env is None else env)
    if release is None:
        release = release_info(flashinfer_version())
    arch_list = env.get("FLASHINFER_CUDA_ARCH_LIST")
    specs, arch_err = arch_specs(arch_list)
    gq = query()
    gpus = tuple(gq.gpus)
    explicit = env.get("CUDA_HOME") or env.get("CUDA_PATH") or None
    common = dict(gpus=gpus, arch_list=_for_messages(arch_list), arch_list_error=arch_err,
                  naive_root=flashinfer_naive_root(env), explicit_home=explicit, release=release,
                  gpu_query=gq, cleaned=cleaned_homes(env),
                  targets_from=TargetsFrom.GPUS if specs is None else TargetsFrom.ARCH_LIST)
    candidates = discover(env) if toolkits is None else toolkits
    try:
        choice = choose(candidates, specs, [g.capability for g in gpus], torch_cuda_version(),
                        min_nvcc=release.min_nvcc, min_nvcc_why=release.min_nvcc_why,
                        allow_other_major=other_major_allowed(env),
                        own=(own := None if "FLASHINFER_NVCC" in env else own_nvcc(common["naive_root"])))
    except ToolkitError as exc:
        if not guard:
            raise
        return Resolution(None, None, error=str(exc), fix=getattr(exc, "fix", None), **common)
    home = linkable_home(choice.toolkit)
    return Resolution(choice, home, own=own == os.path.realpath(choice.toolkit.nvcc), **common)
