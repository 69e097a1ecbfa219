"""Compute capability -> nvcc target rules: which target FlashInfer wants, and which nvcc builds it.

A *target* is what FlashInfer keeps in ``CompilationContext.TARGET_CUDA_ARCHS``: a ``(major, minor_str)``
pair such as ``(12, "0f")``, built as ``-gencode=arch=compute_120f,code=sm_120f``.  Arch lists are read
in :mod:`.archlist`.
"""

from __future__ import annotations

from packaging.version import InvalidVersion, Version

from flashinfer_sm120.errors import Sm120Error

__all__ = ["ArchNotSupported", "MIN_NVCC", "NEWEST_KNOWN_NVCC", "RENAMED", "dropped_in", "nvcc_spelling", "target_key",
           "candidate_targets", "format_target", "major_minor", "min_nvcc_for", "normalize", "target_supported"]

# The first nvcc release that accepts each target.  Verified against the CUDA toolkit release notes
# and the CUDA Features Archive (https://docs.nvidia.com/cuda/cuda-features-archive/): 12.8 "adds
# compiler support for SM 10.0, 10.1 and 12.0"; 12.9 adds sm_103 and sm_121 and the family-specific
# ``f`` targets; 13.0 renames sm_101 to sm_110 (Thor) and drops offline compilation below sm_75.
_FIRST_NVCC = {
    "10.0": "75",  # Turing
    "11.0": "80",  # Ampere
    "11.1": "86",
    "11.4": "87",  # Orin
    "11.8": "89 90",  # Ada, Hopper
    "12.0": "90a",
    "12.8": "100a 101a 120a",
    "12.9": "100f 101f 103a 103f 120f 121a 121f",  # 121: DGX Spark
    "13.0": "110a 110f",
}

#: Minimum nvcc ``major.minor`` per target, keyed by the string nvcc puts after ``sm_``.
MIN_NVCC: dict[str, Version] = {t: Version(v) for v, ts in _FIRST_NVCC.items() for t in ts.split()}

#: Targets CUDA 13.0 renamed (sm_101 became sm_110): old key -> new target.  nvcc 13 builds neither
#: these nor any target below sm_75 (:func:`dropped_in`).
RENAMED: dict[str, tuple[int, str]] = {"101a": (11, "0a"), "101f": (11, "0f")}

#: The newest nvcc that brought a target in :data:`MIN_NVCC`: an explicit arch-list target missing from
#: it (a GPU newer than this release of flashinfer-sm120) is taken as given only by an nvcc this new.
NEWEST_KNOWN_NVCC: Version = max(MIN_NVCC.values())


class ArchNotSupported(Sm120Error):
    """No nvcc target for a compute capability can be built by the given toolkit."""


def major_minor(text: str | None) -> Version | None:
    """``major.minor`` of a version string (``"13.0.88"`` -> ``13.0``); ``None`` when empty or unparsable."""
    if not text:
        return None
    try:
        v = Version(str(text))
    except InvalidVersion:
        return None
    return Version(f"{v.major}.{v.minor}")


def format_target(target: tuple[int, str]) -> str:
    """``(12, "0f") -> "sm_120f"``."""
    return f"sm_{target[0]}{target[1]}"


def nvcc_spelling(target: str) -> str:
    """A target as FlashInfer lists it, as nvcc and every message spell it: ``"12.0f" -> "sm_120f"``."""
    return "sm_" + target.replace(".", "")


def target_key(target: tuple[int, str]) -> str:
    """The string nvcc puts after ``sm_``: ``(12, "0f") -> "120f"``."""
    return f"{target[0]}{target[1]}"


def _sm_number(target: tuple[int, str]) -> int:
    """``(12, "0f") -> 120``."""
    return int(target[0]) * 10 + int(str(target[1])[0])


def dropped_in(target: tuple[int, str]) -> int | None:
    """The CUDA major whose nvcc no longer builds ``target`` (13 for sm_101a/f and below sm_75), else ``None``."""
    return 13 if target_key(target) in RENAMED or _sm_number(target) < 75 else None


def min_nvcc_for(target: tuple[int, str]) -> Version | None:
    """Minimum nvcc that compiles ``target``; ``None`` for a target newer than :data:`MIN_NVCC`."""
    if _sm_number(target) < 75:
        return Version("9.0")  # pre-Turing: any toolkit this library can meet
    return MIN_NVCC.get(target_key(target))


def target_supported(target: tuple[int, str], nvcc_version: Version, *, explicit: bool = False) -> bool:
    """Whether nvcc ``nvcc_version`` compiles ``target``.

    A target newer than the table is refused (the caller explains, rather than letting nvcc fail
    later) unless ``explicit`` (given with its suffix in ``FLASHINFER_CUDA_ARCH_LIST``: the escape
    hatch until flashinfer-sm120 is upgraded) and the nvcc is at least :data:`NEWEST_KNOWN_NVCC`."""
    need = min_nvcc_for(target)
    if need is None:
        return explicit and nvcc_version >= NEWEST_KNOWN_NVCC
    dropped = dropped_in(target)
    return nvcc_version >= need and (dropped is None or nvcc_version.major < dropped)


def candidate_targets(major: int, minor: int) -> list[tuple[int, str]]:
    """FlashInfer's preferred target for a capability first, then fallbacks.

    Mirrors ``CompilationContext._normalize_cuda_arch`` of FlashInfer 0.7.4
    (``flashinfer/compilation_context.py``): SM 9.x and >= 10 -> ``a``; SM 12.0 -> ``0f`` (``0a`` on
    nvcc 12.8); SM 12.x, x >= 1 -> ``xa`` (FlashInfer >= 0.6.12: SM120 code on SM121 can raise
    ``cudaErrorIllegalInstruction``); older -> no suffix."""
    if major == 12 and minor == 0:
        return [(12, "0f"), (12, "0a")]
    if major >= 9:
        return [(major, f"{minor}a")]
    return [(major, str(minor))]


def normalize(major: int, minor: int, nvcc_version: Version) -> tuple[int, str]:
    """Best target for capability ``(major, minor)`` that ``nvcc_version`` builds, e.g. ``(12, "0f")``.

    Raises:
        ArchNotSupported: none is buildable; the message names the capability, the toolkit, the
            version needed and the fix.
    """
    options = candidate_targets(major, minor)
    for target in options:
        if target_supported(target, nvcc_version):
            return target
    best = options[0]
    need = min_nvcc_for(best)
    if need is None:
        raise ArchNotSupported(
            f"compute capability {major}.{minor} ({format_target(best)}) is not in "
            f"flashinfer-sm120's table of targets; upgrade flashinfer-sm120, or set "
            f"FLASHINFER_CUDA_ARCH_LIST with an explicit suffix (e.g. '{major}.{minor}a') "
            f"if your nvcc lists it in 'nvcc --list-gpu-arch'."
        )
    raise ArchNotSupported(
        f"compute capability {major}.{minor} needs {format_target(best)}, which "
        f"requires nvcc >= {need}; the chosen toolkit is CUDA {nvcc_version}. Fix: set "
        f"CUDA_HOME to a toolkit with nvcc >= {need} of torch's CUDA major (run "
        f"`flashinfer-sm120 doctor` for the install command that fits this torch)."
    )
