"""What a CUDA toolkit candidate is, what a choice among them is, the home FlashInfer gets, and the GPUs (data only)."""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass

from packaging.version import Version

from flashinfer_sm120.core.facts import arch as _arch
from flashinfer_sm120.safety.formats.base import MAX_WORD, shown


@dataclass(frozen=True)
class VersionDisagreement:
    """A version file beside nvcc that disagrees with ``nvcc --version``: kept for ``doctor``, never used (P1)."""

    file: str
    file_version: str
    nvcc: str
    nvcc_version: str


@dataclass(frozen=True, kw_only=True)
class Toolkit:
    """One candidate: a find step's placeholder, then what :func:`~.probe.inspect` read: ``root`` above ``bin/nvcc``,
    ``sources`` best first, ``nvcc_full`` canonical (safe in a file name), ``problem`` why it is unusable."""

    root: str
    nvcc: str = ""
    sources: tuple[str, ...] = ("given",)
    nvcc_version: Version | None = None
    nvcc_full: str | None = None
    header_version: Version | None = None
    version_from: str | None = None
    include_dirs: tuple[str, ...] = ()
    lib_dir: str | None = None
    problem: str | None = None
    given_as: str | None = None
    disagreement: VersionDisagreement | None = None

    @property
    def label(self) -> str:
        ver = f"CUDA {self.nvcc_version}" if self.nvcc_version else "CUDA ?"
        return f"{ver} at {self.root} ({', '.join(self.sources)})"

    def to_dict(self) -> dict:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out.update(sources=list(self.sources), include_dirs=list(self.include_dirs),
                   disagreement=asdict(self.disagreement) if self.disagreement else None)
        for k in ("nvcc_version", "header_version"):
            out[k] = str(out[k]) if out[k] else None
        return out

    @classmethod
    def from_dict(cls, d: dict) -> Toolkit:
        """The toolkit :meth:`to_dict` gave (a replayed record); raises on a malformed one."""
        dis = d["disagreement"]
        return cls(**dict(d, sources=tuple(d["sources"]), include_dirs=tuple(d["include_dirs"]),
                          disagreement=VersionDisagreement(**dis) if dis else None,
                          **{k: Version(d[k]) if d[k] else None for k in ("nvcc_version", "header_version")}))


class RejectKind(str, enum.Enum):
    """Why a candidate lost: unusable before the pick, not chosen (unusable) after it, usable, or not examined."""

    UNUSABLE = "unusable"
    NOT_CHOSEN = "not chosen"
    USABLE = "usable"
    NOT_EXAMINED = "not examined"


@dataclass(frozen=True)
class Rejection:
    """One candidate not chosen, and why."""

    toolkit: Toolkit
    kind: RejectKind
    why: str

    @property
    def reason(self) -> str:
        return f"not chosen ({self.why})" if self.kind is RejectKind.NOT_CHOSEN else self.why

    @property
    def refused(self) -> bool:
        """Found unusable (before the pick or after it), not merely passed over."""
        return self.kind in (RejectKind.UNUSABLE, RejectKind.NOT_CHOSEN)


@dataclass(frozen=True)
class Choice:
    """The outcome of :func:`~.policy.choose`: the toolkit, targets, capabilities, rejections, why, torch's CUDA."""

    toolkit: Toolkit
    targets: tuple[tuple[int, str], ...]
    capabilities: tuple[tuple[int, int], ...]
    rejected: tuple[Rejection, ...] = ()
    reason: str = ""
    torch_cuda: str | None = None

    @property
    def version(self) -> Version:
        assert self.toolkit.nvcc_version is not None
        return self.toolkit.nvcc_version

    def to_dict(self) -> dict:
        return {
            "toolkit": self.toolkit.to_dict(),
            "targets": [_arch.format_target(t) for t in self.targets],
            "capabilities": [f"{a}.{b}" for a, b in self.capabilities],
            "rejected": [{"toolkit": r.toolkit.to_dict(), "reason": r.reason, "kind": r.kind.value}
                         for r in self.rejected],
            "reason": self.reason,
            "torch_cuda": self.torch_cuda,
        }


@dataclass(frozen=True)
class Setting:
    """A toolkit setting (``CUDA_HOME``, ``CUDA_PATH``, ``FLASHINFER_NVCC``) not used as given: its value as set, why,
    and the fix; ``str()`` is the one sentence every report prints of it (P8)."""

    variable: str
    value: str
    why: str
    fix: str

    def __str__(self) -> str:
        return f"{self.variable}={shown(self.value, MAX_WORD)} was not used as given: {self.why}. Fix: {self.fix}"


@dataclass(frozen=True)
class CudaHome:
    """``CUDA_HOME`` for FlashInfer, the toolkit behind it, what a view adds, and where ``curand.h`` comes
    from (``None``: FlashInfer's sampling module will not compile)."""

    path: str
    toolkit_root: str
    is_view: bool
    added: tuple[str, ...]
    curand_include: str | None

    def to_dict(self) -> dict:
        return dict(asdict(self), added=list(self.added))


@dataclass(frozen=True)
class GPU:
    """One GPU: NVML ``index`` (PCI bus order), ``name``, ``uuid`` (``GPU-...``), ``capability`` ``(12, 0)``."""

    index: int
    name: str
    uuid: str
    capability: tuple[int, int]


@dataclass(frozen=True)
class GPUQuery:
    """The visible GPUs; ``source`` ``"nvml"``, ``"torch.cuda"`` or ``"none"``; ``note``: why not NVML."""

    gpus: tuple[GPU, ...]
    source: str
    note: str | None = None

    def describe(self) -> str:
        """``"torch.cuda (NVML: nvmlInit failed: ...)"``."""
        return self.source + (f" (NVML: {self.note})" if self.note else "")
