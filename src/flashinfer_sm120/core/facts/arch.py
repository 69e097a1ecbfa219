"""Targets (``TARGET_CUDA_ARCHS`` pairs such as ``(12, "0f")``): which one FlashInfer wants for a compute
capability, which nvcc builds it, and how an arch list (``FLASHINFER_CUDA_ARCH_LIST``, ``--arch``) is read."""

from __future__ import annotations

import re
from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

from flashinfer_sm120.errors import Sm120Error
from flashinfer_sm120.safety.formats.base import non_ascii_digits, shown, some

# The first nvcc release that accepts each target, verified against the CUDA release notes and the CUDA
# Features Archive: 12.8 adds SM 10.0, 10.1, 12.0; 12.9 adds sm_103, sm_121 and the ``f`` targets; 13.0
# renames sm_101 to sm_110 (Thor) and drops offline compilation below sm_75.
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

#: Targets CUDA 13.0 renamed (sm_101 became sm_110): old key -> new target.
RENAMED: dict[str, tuple[int, str]] = {"101a": (11, "0a"), "101f": (11, "0f")}

#: An explicit arch-list target missing from :data:`MIN_NVCC` is taken as given only by an nvcc this new.
NEWEST_KNOWN_NVCC: Version = max(MIN_NVCC.values())

#: Longest arch list read (characters) and most entries; ten GPU families fit in 64 (P6). FlashInfer names its JIT
#: directory by the targets joined: 180 entries made a name no file system takes (ENAMETOOLONG).
MAX_ARCH_LIST_CHARS = 256
MAX_ARCH_ENTRIES = 16


class ArchNotSupported(Sm120Error):
    """No nvcc target for a compute capability can be built by the given toolkit."""


class ArchListError(Sm120Error, ValueError):
    """An arch list that does not parse; the message names the value and shows the accepted form."""


def major_minor(text: str | None) -> Version | None:
    """``"13.0.88"`` -> ``13.0``; ``None`` when empty or unparsable."""
    try:
        v = Version(str(text)) if text else None
    except InvalidVersion:
        return None
    return Version(f"{v.major}.{v.minor}") if v else None


def format_target(target: tuple[int, str]) -> str:
    return f"sm_{target[0]}{target[1]}"


def nvcc_spelling(target: str) -> str:
    """A target as FlashInfer lists it, as nvcc spells it: ``"12.0f" -> "sm_120f"``."""
    return "sm_" + target.replace(".", "")


def target_key(target: tuple[int, str]) -> str:
    return f"{target[0]}{target[1]}"


def dropped_in(target: tuple[int, str]) -> int | None:
    """The CUDA major whose nvcc no longer builds ``target`` (13 for sm_101a/f and below sm_75), else ``None``."""
    return 13 if target_key(target) in RENAMED or _pre_turing(target) else None


def _pre_turing(target: tuple[int, str]) -> bool:
    return target[0] * 10 + int(target[1][0]) < 75


def min_nvcc_for(target: tuple[int, str]) -> Version | None:
    """Minimum nvcc that compiles ``target``; ``None`` for a target newer than :data:`MIN_NVCC`."""
    if _pre_turing(target):
        return Version("9.0")  # pre-Turing: any toolkit this library can meet
    return MIN_NVCC.get(target_key(target))


def target_supported(target: tuple[int, str], nvcc_version: Version, *, explicit: bool = False) -> bool:
    """Whether ``nvcc_version`` compiles ``target``; one newer than the table only when ``explicit`` (suffixed in
    the arch list) and the nvcc is at least :data:`NEWEST_KNOWN_NVCC`."""
    need, dropped = min_nvcc_for(target), dropped_in(target)
    if need is None:
        return explicit and nvcc_version >= NEWEST_KNOWN_NVCC
    return nvcc_version >= need and (dropped is None or nvcc_version.major < dropped)


def candidate_targets(major: int, minor: int) -> list[tuple[int, str]]:
    """FlashInfer's preferred target, then fallbacks (0.7.4 ``compilation_context.py`` ``_normalize_cuda_arch``:
    SM 12.0 -> ``0f`` else ``0a``; SM 9+ -> ``a``; SM 12.1 its own ``1a``: SM120 code can fault on SM121)."""
    if (major, minor) == (12, 0):
        return [(12, "0f"), (12, "0a")]
    return [(major, f"{minor}a")] if major >= 9 else [(major, str(minor))]


def normalize(major: int, minor: int, nvcc_version: Version) -> tuple[int, str]:
    """Best target for ``(major, minor)`` that ``nvcc_version`` builds; else :class:`ArchNotSupported` with the fix."""
    options = candidate_targets(major, minor)
    for target in options:
        if target_supported(target, nvcc_version):
            return target
    best, need = options[0], min_nvcc_for(options[0])
    if need is None:
        raise ArchNotSupported(
            f"compute capability {major}.{minor} ({format_target(best)}) is not in flashinfer-sm120's table of "
            f"targets; upgrade flashinfer-sm120, or set FLASHINFER_CUDA_ARCH_LIST with an explicit suffix "
            f"(e.g. '{major}.{minor}a') if your nvcc lists it in 'nvcc --list-gpu-arch'.")
    raise ArchNotSupported(
        f"compute capability {major}.{minor} needs {format_target(best)}, which requires nvcc >= {need}; the "
        f"chosen toolkit is CUDA {nvcc_version}. Fix: set CUDA_HOME to a toolkit with nvcc >= {need} of torch's "
        f"CUDA major (run `flashinfer-sm120 doctor` for the install command that fits this torch).")


@dataclass(frozen=True)
class ArchSpec:
    """One arch-list entry: capability and suffix (``None``: :func:`normalize` picks; an explicit one is kept)."""

    major: int
    minor: int
    suffix: str | None

    def target(self, nvcc_version: Version) -> tuple[int, str]:
        if self.suffix:
            return (self.major, f"{self.minor}{self.suffix}")
        return normalize(self.major, self.minor, nvcc_version)


def parse_arch_list(value: str, *, source: str = "FLASHINFER_CUDA_ARCH_LIST") -> list[ArchSpec]:
    """The entries of an arch list, or :class:`ArchListError` for the first fault (FlashInfer 0.7.4 takes
    only space-separated ``major.minor[suffix]`` and crashes its import with a bare ``ValueError``)."""
    specs, errors = parse_arch_list_lenient(value, source=source)
    if errors:
        raise ArchListError(errors[0])
    return specs


_ARCH_RE = re.compile(r"^(?:sm_?|compute_?)?([0-9]+)\.?([0-9])([af]?)$", re.IGNORECASE)
_DOTTED_RE = re.compile(r"^([0-9]+)\.([0-9]+)([af]?)$", re.IGNORECASE)
_EXAMPLE = ("Accepted forms, e.g. '12.0' (RTX 5090 / RTX PRO 6000), '12.1' (DGX Spark), a list such as "
            "'12.0,12.1' or '12.0 12.1', and '12.0f', '9.0a' or 'sm_120'")


def _hint(value: str, entries: list[str]) -> str:
    """`` Did you mean '12.0'?`` for '12,0' or a bare major ('12' reads as 1.2); '²'.isdigit() but int() fails."""
    if re.fullmatch(r"\s*[0-9]+,[0-9]\s*", value):
        return f" Did you mean '{value.strip().replace(',', '.')}'?"
    major = next((int(e) for e in entries if e.isascii() and e.isdigit() and 3 <= int(e) <= 20), None)
    return f" Did you mean '{major}.0'?" if major else ""


def parse_arch_list_lenient(value: str, *, source: str = "FLASHINFER_CUDA_ARCH_LIST"
                            ) -> tuple[list[ArchSpec], list[str]]:
    """``(specs, errors)``: the entries that parsed, and one bounded message per kind of fault (a typo must
    not break ``import flashinfer``; P6, P8)."""
    if not isinstance(value, str) or len(value) > MAX_ARCH_LIST_CHARS:
        size = len(value) if isinstance(value, str) else 0
        return [], [f"{source} is {size} characters long, more than {MAX_ARCH_LIST_CHARS} "
                    f"(starts {shown(value, 40)}); {_EXAMPLE}, or unset it to target the GPUs present."]
    odd = non_ascii_digits(value, source)
    if odd:
        return [], [f"{odd}. {_EXAMPLE}."]
    entries = [e for e in re.split(r"[\s,;]+", value.strip()) if e]
    if len(entries) > MAX_ARCH_ENTRIES:
        return [], [f"{source} has {len(entries)} entries, more than {MAX_ARCH_ENTRIES} (starts {shown(value, 40)}); "
                    f"give the GPUs you build for, e.g. '12.0 12.1', or unset it to target the GPUs present."]
    if not entries:
        return [], [f"{source}={shown(value)} names no architecture. {_EXAMPLE}, or unset it to target the "
                    f"GPUs present."]
    out: list[ArchSpec] = []
    bad: list[str] = []
    unknown: list[str] = []
    unsuffixed: list[str] = []  # nvcc's arch-specific 'a' targets begin at 9.0, family 'f' targets at 10.0
    for entry in entries:
        # PyTorch's '8.6+PTX': FlashInfer builds cubins only, so the PTX request is dropped
        core = entry[:-4] if entry.upper().endswith("+PTX") else entry
        m = _DOTTED_RE.match(core) or _ARCH_RE.match(core)
        if not m:
            bad.append(entry)
        elif not (3 <= int(m.group(1)) <= 20 and int(m.group(2)) <= 9):
            unknown.append(entry)
        elif int(m.group(1)) < {"a": 9, "f": 10}.get(m.group(3).lower(), 0):
            unsuffixed.append(entry)
        elif (spec := ArchSpec(int(m.group(1)), int(m.group(2)), m.group(3).lower() or None)) not in out:
            out.append(spec)
    plain = re.sub(r"[af](?=(\+PTX)?$)", "", unsuffixed[0], flags=re.I) if unsuffixed else ""
    typed = f"{source}={shown(value)}" + (f" (read as {len(entries)} entries, {some(entries)})"
                                          if len(entries) > 1 else "")
    errors = []
    for found, what in ((bad, f"not a compute capability. {_EXAMPLE}."),
                        (unknown, "not a known compute capability (major 3..20, minor 0..9), e.g. '12.0'."),
                        (unsuffixed, "a target no nvcc has: 'a' targets begin at 9.0 and 'f' targets at 10.0; "
                                     f"give the capability without the suffix, e.g. {shown(plain, 40)}.")):
        if found:
            errors.append(f"{typed}: {'entry' if len(found) == 1 else 'entries'} {some(found)} "
                          f"{'is' if len(found) == 1 else 'are'} {what}{_hint(value, found)}")
    return out, errors
