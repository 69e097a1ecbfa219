"""Compute capability -> nvcc target rules, and ``FLASHINFER_CUDA_ARCH_LIST`` parsing.

A *target* here is what FlashInfer keeps in ``CompilationContext.TARGET_CUDA_ARCHS``:
a ``(major, minor_str)`` pair such as ``(12, "0f")``, which FlashInfer turns into
``-gencode=arch=compute_120f,code=sm_120f``.

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

import re
from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

from flashinfer_sm120.errors import Sm120Error
from flashinfer_sm120.safety.formats import shown, some

__all__ = [
    "ArchListError",
    "ArchNotSupported",
    "ArchSpec",
    "MAX_ARCH_LIST_CHARS",
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
    "parse_arch_list",
    "export_arch_list",
    "parse_arch_list_lenient",
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


class ArchListError(Sm120Error, ValueError):
    """``FLASHINFER_CUDA_ARCH_LIST`` (or ``--arch``) could not be parsed.

    The message names the offending value and shows the accepted form.
    """


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


_ARCH_RE = re.compile(r"^(?:sm_?|compute_?)?(\d+)\.?(\d)([af]?)$", re.IGNORECASE)
_DOTTED_RE = re.compile(r"^(\d+)\.(\d+)([af]?)$", re.IGNORECASE)


@dataclass(frozen=True)
class ArchSpec:
    """One parsed entry of an arch list: capability plus an explicit suffix, if any."""

    major: int
    minor: int
    suffix: str | None  # "a", "f", "" (explicitly plain) or None (let normalize pick)

    def target(self, nvcc_version: Version) -> tuple[int, str]:
        """The ``(major, minor_str)`` target; explicit suffixes are kept as given,
        as FlashInfer does for ``FLASHINFER_CUDA_ARCH_LIST=12.0f``."""
        if self.suffix:
            return (self.major, f"{self.minor}{self.suffix}")
        return normalize(self.major, self.minor, nvcc_version)


def parse_arch_list(value: str, *, source: str = "FLASHINFER_CUDA_ARCH_LIST") -> list[ArchSpec]:
    """Parse an arch list such as ``"12.0"``, ``"9.0a 12.0f"`` or ``"8.9,12.1"``.

    FlashInfer itself accepts only space-separated ``major.minor[suffix]``
    entries (``flashinfer/compilation_context.py``) and crashes its import with a
    bare ``ValueError`` on anything else.  We accept the same form, plus commas or
    semicolons as separators, the ``sm_120``/``120a`` spellings nvcc users type,
    and PyTorch's ``+PTX`` suffix (dropped: FlashInfer builds cubins only).

    Args:
        value: the raw string.
        source: what to call it in error messages (env var or CLI flag).

    Returns:
        The entries in order, duplicates removed.

    Raises:
        ArchListError: an entry is not a compute capability; the message names
            the entry and the whole value, and shows the accepted form.
    """
    specs, errors = _parse(value, source)
    if errors:
        raise ArchListError(errors[0])
    return specs


def export_arch_list(value: str | None, *, source: str = "--arch") -> None:
    """Read ``value`` (``--arch`` of every command) with :func:`parse_arch_list` and export it as
    ``FLASHINFER_CUDA_ARCH_LIST`` (before FlashInfer loads); ``None`` leaves the variable alone.

    Raises:
        ArchListError: as :func:`parse_arch_list`; nothing is exported.
    """
    if value is None:
        return
    specs = parse_arch_list(value, source=source)
    import os

    os.environ["FLASHINFER_CUDA_ARCH_LIST"] = " ".join(f"{s.major}.{s.minor}{s.suffix or ''}" for s in specs)


def parse_arch_list_lenient(value: str, *, source: str = "FLASHINFER_CUDA_ARCH_LIST"
                            ) -> tuple[list[ArchSpec], list[str]]:
    """Like :func:`parse_arch_list`, but keeps the good entries.

    Returns:
        ``(specs, errors)``: the entries that parsed, and one message per entry
        that did not (naming the entry, the whole value, and the accepted form).
        Used at import time, where a typo must not break ``import flashinfer``.
    """
    return _parse(value, source)


#: Longest arch list read (characters); a longer value is refused whole, with a
#: bounded message, before it is split (ten GPU families fit in 64 characters).
MAX_ARCH_LIST_CHARS = 4096


def _major_hint(entries: list[str]) -> str:
    """`` Did you mean '12.0'?`` for a bare major number ('12' reads as 1.2, '9' as nothing)."""
    for e in entries:
        if e.isascii() and e.isdigit() and 3 <= int(e) <= 20:  # '²'.isdigit() is true, int('²') fails
            return f" Did you mean '{int(e)}.0'?"
    return ""


def _parse(value: str, source: str) -> tuple[list[ArchSpec], list[str]]:
    example = (f"Use compute capabilities separated by spaces, e.g. {source}='12.0' "
               f"(RTX 5090 / RTX PRO 6000), '12.1' (DGX Spark) or '9.0a 12.0f'")
    if not isinstance(value, str) or len(value) > MAX_ARCH_LIST_CHARS:
        size = len(value) if isinstance(value, str) else 0
        return [], [f"{source} is {size} characters long, more than {MAX_ARCH_LIST_CHARS} "
                    f"(starts {shown(value, 40)}); {example}, or unset it to target the GPUs present."]
    entries = [e for e in re.split(r"[\s,;]+", value.strip()) if e]
    if not entries:
        return [], [
            f"{source}={shown(value)} names no architecture. {example}, or unset it "
            f"to target the GPUs present."
        ]
    out: list[ArchSpec] = []
    bad: list[str] = []
    unknown: list[str] = []
    for entry in entries:
        # PyTorch's TORCH_CUDA_ARCH_LIST writes '8.6+PTX'; FlashInfer builds cubins
        # only, so the PTX request has nothing to map to and is dropped.
        core = entry[:-4] if entry.upper().endswith("+PTX") else entry
        m = _DOTTED_RE.match(core) or _ARCH_RE.match(core)
        if not m:
            bad.append(entry)
            continue
        major, minor, suffix = int(m.group(1)), int(m.group(2)), m.group(3).lower()
        if major < 3 or major > 20 or minor > 9:
            unknown.append(entry)
            continue
        spec = ArchSpec(major, minor, suffix or None)
        if spec not in out:
            out.append(spec)
    errors: list[str] = []
    # One message per kind of fault, quoting at most a few entries and a cut value:
    # a long list of junk must not print the whole value once per entry.
    if bad:
        errors.append(
            f"{source}={shown(value)}: {'entry' if len(bad) == 1 else 'entries'} {some(bad)} "
            f"{'is' if len(bad) == 1 else 'are'} not a compute capability. Use 'major.minor' with an "
            f"optional a/f suffix. {example}.{_major_hint(bad)}"
        )
    if unknown:
        errors.append(
            f"{source}={shown(value)}: {'entry' if len(unknown) == 1 else 'entries'} {some(unknown)} "
            f"{'is' if len(unknown) == 1 else 'are'} not a known compute capability (major 3..20, "
            f"minor 0..9), e.g. '12.0'.{_major_hint(unknown)}"
        )
    return out, errors
