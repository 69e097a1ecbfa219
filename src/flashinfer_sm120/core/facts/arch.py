"""Compute capability -> nvcc target rules: which target FlashInfer wants, and which nvcc builds it.

A *target* here is what FlashInfer keeps in ``CompilationContext.TARGET_CUDA_ARCHS``:
a ``(major, minor_str)`` pair such as ``(12, "0f")``, which FlashInfer turns into
``-gencode=arch=compute_120f,code=sm_120f``.  Arch lists (``FLASHINFER_CUDA_ARCH_LIST``,
``--arch``) are read in :mod:`.archlist`.

Minimum nvcc per target (the release that first accepted the target):

=========  ====  =====================================================================
target     nvcc  source
=========  ====  =====================================================================
sm_75       10.0 CUDA 10.0 release notes (Turing)
sm_80       11.0 CUDA 11.0 release notes (Ampere)
sm_86       11.1 CUDA 11.1 release notes
sm_87       11.4 CUDA 11.4 release notes (Orin)
sm_89       11.8 CUDA 11.8 release notes (Ada)
sm_90       11.8 CUDA 11.8 release notes (Hopper)
sm_90a      12.0 CUDA 12.0 release notes (Hopper arch-specific ``a`` features)
sm_100a     12.8 CUDA 12.8 release notes (Blackwell datacenter)
sm_101a     12.8 CUDA 12.8 release notes; renamed sm_110 in CUDA 13.0
sm_120a     12.8 CUDA 12.8 release notes (Blackwell consumer/workstation)
sm_100f     12.9 CUDA 12.9 release notes (family-specific ``f`` suffix)
sm_101f     12.9 CUDA 12.9 release notes; renamed sm_110f in CUDA 13.0
sm_103a/f   12.9 CUDA 12.9 release notes
sm_120f     12.9 CUDA 12.9 release notes
sm_121a/f   12.9 CUDA 12.9 release notes (DGX Spark)
sm_110a/f   13.0 CUDA 13.0 release notes (Thor, formerly sm_101)
=========  ====  =====================================================================

Release notes: https://docs.nvidia.com/cuda/cuda-toolkit-release-notes/ and, per
release, the CUDA Features Archive
(https://docs.nvidia.com/cuda/cuda-features-archive/index.html): 12.8 "adds
compiler support for SM 10.0, 10.1 and 12.0"; 12.9 "adds compiler target
support for SM architecture 10.3 (sm_103, sm_103f, sm_103a) and 12.1 (sm_121)"
and "introduces ... family-specific architectures"; 13.0 renames sm_101 to
sm_110.

CUDA 13.0 also removed offline compilation for targets below sm_75 (CUDA 13.0
release notes, "Deprecated and Dropped Features"): :data:`DROPPED_IN`.

The suffix FlashInfer wants for each capability mirrors
``flashinfer/compilation_context.py`` of FlashInfer 0.7.4
(``CompilationContext._normalize_cuda_arch``): SM 9.x -> ``a``; SM 12.0 -> ``0f``
(``0a`` on a 12.8 toolkit); SM 12.x, x >= 1 -> ``xa`` so SM121 gets its own cubin
(FlashInfer 0.6.12 change: SM120 code on SM121 can raise
``cudaErrorIllegalInstruction``); SM >= 10 -> ``a``; older -> no suffix.
"""

from __future__ import annotations

from packaging.version import InvalidVersion, Version

from flashinfer_sm120.errors import Sm120Error

__all__ = [
    "ArchNotSupported",
    "MIN_NVCC",
    "MAX_NVCC_MAJOR",
    "NEWEST_KNOWN_NVCC",
    "RENAMED",
    "dropped_in",
    "target_key",
    "candidate_targets",
    "format_target",
    "major_minor",
    "min_nvcc_for",
    "normalize",
    "target_supported",
]

#: Minimum nvcc release (``major.minor``) able to compile each target, keyed by
#: the string nvcc uses after ``sm_`` (see the module docstring for sources).
MIN_NVCC: dict[str, Version] = {
    "75": Version("10.0"),
    "80": Version("11.0"),
    "86": Version("11.1"),
    "87": Version("11.4"),
    "89": Version("11.8"),
    "90": Version("11.8"),
    "90a": Version("12.0"),
    "100a": Version("12.8"),
    "101a": Version("12.8"),
    "101f": Version("12.9"),
    "120a": Version("12.8"),
    "100f": Version("12.9"),
    "103a": Version("12.9"),
    "103f": Version("12.9"),
    "120f": Version("12.9"),
    "121a": Version("12.9"),
    "121f": Version("12.9"),
    "110a": Version("13.0"),
    "110f": Version("13.0"),
}

#: Targets that later nvcc releases dropped: the last nvcc major that accepts them.
#: sm_101 was renamed sm_110 in CUDA 13.0; targets below sm_75 were removed in 13.0.
MAX_NVCC_MAJOR: dict[str, int] = {"101a": 12, "101f": 12}

#: Targets CUDA renamed, old key -> new target (CUDA 13.0: sm_101 became sm_110).
RENAMED: dict[str, tuple[int, str]] = {"101a": (11, "0a"), "101f": (11, "0f")}

#: The newest nvcc release this table knows of a new target for.  An explicit
#: arch-list target missing from the table (a GPU newer than this release of
#: flashinfer-sm120) is taken as given only by an nvcc at least this new.
NEWEST_KNOWN_NVCC: Version = max(MIN_NVCC.values())


class ArchNotSupported(Sm120Error):
    """No nvcc target for a compute capability can be built by the given toolkit."""


def major_minor(text: str | None) -> Version | None:
    """``major.minor`` of a version string (``"13.0.88"`` -> ``Version("13.0")``).

    Returns:
        ``None`` for ``None``, an empty string or anything PEP 440 cannot parse.
    """
    if not text:
        return None
    try:
        v = Version(str(text))
    except InvalidVersion:
        return None
    return Version(f"{v.major}.{v.minor}")


def format_target(target: tuple[int, str]) -> str:
    """Return ``sm_<major><minor>``, e.g. ``(12, "0f") -> "sm_120f"``."""
    return f"sm_{target[0]}{target[1]}"


def target_key(target: tuple[int, str]) -> str:
    """The string nvcc puts after ``sm_``: ``(12, "0f") -> "120f"``."""
    return f"{target[0]}{target[1]}"


_key = target_key


def dropped_in(target: tuple[int, str]) -> int | None:
    """The CUDA major whose nvcc no longer builds ``target`` (13 for sm_101a and
    for targets below sm_75), or ``None`` when no release dropped it."""
    key = target_key(target)
    if key in MAX_NVCC_MAJOR:
        return MAX_NVCC_MAJOR[key] + 1
    if _sm_number(target) < 75:
        return 13
    return None


def min_nvcc_for(target: tuple[int, str]) -> Version | None:
    """Minimum nvcc ``major.minor`` that compiles ``target``.

    Args:
        target: ``(major, minor_str)`` such as ``(12, "1a")``.

    Returns:
        The :class:`packaging.version.Version` from :data:`MIN_NVCC`, or ``None``
        when the target is not in the table (unknown future or pre-Turing target).
    """
    key = _key(target)
    if key in MIN_NVCC:
        return MIN_NVCC[key]
    if _sm_number(target) < 75:
        return Version("9.0")  # pre-Turing: any toolkit this library can meet
    return None


def target_supported(target: tuple[int, str], nvcc_version: Version, *, explicit: bool = False) -> bool:
    """Whether nvcc ``nvcc_version`` can compile ``target``.

    Targets missing from :data:`MIN_NVCC` (newer than this table) are refused,
    so the caller explains rather than letting nvcc fail later, unless
    ``explicit`` (given with its suffix in ``FLASHINFER_CUDA_ARCH_LIST``: the
    user's escape hatch until flashinfer-sm120 is upgraded) and the nvcc is at
    least :data:`NEWEST_KNOWN_NVCC`.  Targets below sm_75 fail on nvcc 13+
    (:func:`dropped_in`).
    """
    key = _key(target)
    need = min_nvcc_for(target)
    if need is None:
        return explicit and nvcc_version >= NEWEST_KNOWN_NVCC
    if nvcc_version < need:
        return False
    if key in MAX_NVCC_MAJOR and nvcc_version.major > MAX_NVCC_MAJOR[key]:
        return False
    if _sm_number(target) < 75 and nvcc_version.major >= 13:
        return False
    return True


def _sm_number(target: tuple[int, str]) -> int:
    """``(12, "0f") -> 120``: the numeric part nvcc puts after ``sm_``."""
    return int(target[0]) * 10 + int(str(target[1])[0])


def candidate_targets(major: int, minor: int) -> list[tuple[int, str]]:
    """FlashInfer's preferred target for a capability first, then fallbacks.

    Mirrors ``CompilationContext._normalize_cuda_arch`` in FlashInfer 0.7.4
    (``flashinfer/compilation_context.py``), with SM121 kept on ``121a`` as in
    FlashInfer >= 0.6.12, and SM 11.0 (Thor) on ``110a``.

    Args:
        major: compute capability major, e.g. ``12``.
        minor: compute capability minor, e.g. ``0``.

    Returns:
        A non-empty list of ``(major, minor_str)`` targets, best first.
    """
    if major == 9:
        return [(major, f"{minor}a")]
    if major == 12 and minor == 0:
        return [(12, "0f"), (12, "0a")]
    if major >= 10:
        return [(major, f"{minor}a")]
    return [(major, str(minor))]


def normalize(major: int, minor: int, nvcc_version: Version) -> tuple[int, str]:
    """Best target for capability ``(major, minor)`` that ``nvcc_version`` builds.

    Returns:
        ``(major, minor_str)``, e.g. ``(12, "0f")`` on nvcc >= 12.9 and
        ``(12, "0a")`` on 12.8.

    Raises:
        ArchNotSupported: no candidate target is buildable; the message names the
            capability, the toolkit version, the version needed and the fix.
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
