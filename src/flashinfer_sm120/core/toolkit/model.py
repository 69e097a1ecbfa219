"""What a CUDA toolkit candidate is, and what a choice among them is (data only)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from packaging.version import Version

from flashinfer_sm120.core.facts import arch as _arch
from flashinfer_sm120.errors import ToolkitError
from flashinfer_sm120.safety.formats import parse_version

__all__ = ["Toolkit", "Choice", "RejectKind", "Rejection", "ToolkitError", "VersionDisagreement"]


@dataclass(frozen=True)
class VersionDisagreement:
    """A toolkit whose version file and ``nvcc --version`` disagree; the binary's answer is the one
    used (threat-model: P1: the binary, not a file beside it).

    Attributes:
        file: the file that gave ``file_version`` (``version.json``, a wheel's ``dist-info``...).
        file_version: what the file says, e.g. ``"13.0.88"``.
        nvcc: the binary that was asked.
        nvcc_version: what ``nvcc --version`` printed, e.g. ``"12.8.93"``.
    """

    file: str
    file_version: str
    nvcc: str
    nvcc_version: str

    def to_dict(self) -> dict:
        """JSON-ready form."""
        return {"file": self.file, "file_version": self.file_version, "nvcc": self.nvcc,
                "nvcc_version": self.nvcc_version}


@dataclass(frozen=True, kw_only=True)
class Toolkit:
    """One candidate CUDA toolkit (built by keywords only).

    Attributes:
        root: toolkit prefix (``<root>/bin/nvcc``), symlinks resolved.
        nvcc: real path of the nvcc binary.
        sources: where it was found, best first, e.g. ``("CUDA_HOME", "PATH")``.
        nvcc_version: ``major.minor`` of nvcc, or ``None`` when unreadable.
        nvcc_full: full version, e.g. ``"13.0.88"``: always the canonical form of
            a parsed :class:`~packaging.version.Version` (``" 13.0.88\n"`` read
            from a file becomes ``"13.0.88"``; anything that is not a version is
            refused when the Toolkit is built), so it can stand in a directory
            name or a ninja file.
        header_version: ``major.minor`` from ``CUDART_VERSION`` in
            ``cuda_runtime_api.h``, or ``None``.
        version_from: which file (or ``"nvcc --version"``) gave ``nvcc_version``.
        include_dirs: directories holding ``cuda_runtime_api.h``.
        lib_dir: directory holding ``libcudart.so*``, or ``None``.
        problem: why the toolkit is unusable in any case (missing nvcc, untrusted,
            unreadable version, nvcc/header mismatch), or ``None``.
        given_as: the path as the user or environment gave it (e.g. ``$CUDA_HOME``).
        disagreement: set when a version file said another version than the binary (whose
            answer ``nvcc_version``/``nvcc_full`` hold), for ``doctor``.
    """

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

    def __post_init__(self) -> None:
        if self.nvcc_full is not None:  # parsed once, only formatted from the Version after that
            object.__setattr__(self, "nvcc_full", str(parse_version(self.nvcc_full, f"nvcc at {self.root}")))

    @property
    def label(self) -> str:
        """Short human description: ``CUDA 13.0 at /path (pip)``."""
        ver = f"CUDA {self.nvcc_version}" if self.nvcc_version else "CUDA ?"
        return f"{ver} at {self.root} ({', '.join(self.sources)})"

    def to_dict(self) -> dict:
        """JSON-ready form (versions as strings)."""
        return {
            "root": self.root,
            "nvcc": self.nvcc,
            "sources": list(self.sources),
            "nvcc_version": str(self.nvcc_version) if self.nvcc_version else None,
            "nvcc_full": self.nvcc_full,
            "header_version": str(self.header_version) if self.header_version else None,
            "version_from": self.version_from,
            "include_dirs": list(self.include_dirs),
            "lib_dir": self.lib_dir,
            "problem": self.problem,
            "given_as": self.given_as,
            "disagreement": self.disagreement.to_dict() if self.disagreement else None,
        }


class RejectKind(str, enum.Enum):
    """Why a candidate lost: unusable (examined before the pick), not chosen (unusable, after it),
    usable (another came first or is preferred), or not examined (the pick came first)."""

    UNUSABLE = "unusable"
    NOT_CHOSEN = "not chosen"
    USABLE = "usable"
    NOT_EXAMINED = "not examined"


@dataclass(frozen=True)
class Rejection:
    """One candidate not chosen: its :class:`RejectKind` and the reason in words."""

    toolkit: Toolkit
    kind: RejectKind
    why: str

    @property
    def reason(self) -> str:
        """The reason as reported (``not chosen (<why>)`` after the pick)."""
        return f"not chosen ({self.why})" if self.kind is RejectKind.NOT_CHOSEN else self.why


@dataclass(frozen=True)
class Choice:
    """The outcome of :func:`choose`.

    Attributes:
        toolkit: the chosen toolkit.
        targets: ``(major, minor_str)`` targets it will build, sorted.
        capabilities: the compute capabilities those targets serve.
        rejected: a :class:`Rejection` for every candidate not chosen.
        reason: one sentence on why this toolkit won.
        torch_cuda: ``torch.version.cuda`` (``None`` for a CPU build of torch).
    """

    toolkit: Toolkit
    targets: tuple[tuple[int, str], ...]
    capabilities: tuple[tuple[int, int], ...]
    rejected: tuple[Rejection, ...] = field(default_factory=tuple)
    reason: str = ""
    torch_cuda: str | None = None

    @property
    def version(self) -> Version:
        """nvcc ``major.minor`` of the chosen toolkit."""
        assert self.toolkit.nvcc_version is not None
        return self.toolkit.nvcc_version

    def to_dict(self) -> dict:
        """JSON-ready form."""
        return {
            "toolkit": self.toolkit.to_dict(),
            "targets": [_arch.format_target(t) for t in self.targets],
            "capabilities": [f"{a}.{b}" for a, b in self.capabilities],
            "rejected": [{"toolkit": r.toolkit.to_dict(), "reason": r.reason, "kind": r.kind.value}
                         for r in self.rejected],
            "reason": self.reason,
            "torch_cuda": self.torch_cuda,
        }

