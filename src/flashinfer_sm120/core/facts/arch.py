"""Target rules: which target FlashInfer wants for a compute capability, which nvcc builds it, and
how an arch list (``FLASHINFER_CUDA_ARCH_LIST``, ``--arch``) is read.

A *target* is what FlashInfer keeps in ``CompilationContext.TARGET_CUDA_ARCHS``: a ``(major, minor_str)``
pair such as ``(12, "0f")``, built as ``-gencode=arch=compute_120f,code=sm_120f``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

from flashinfer_sm120.errors import Sm120Error
from flashinfer_sm120.safety.formats.base import shown, some

__all__ = ["ArchNotSupported", "MIN_NVCC", "NEWEST_KNOWN_NVCC", "RENAMED", "dropped_in", "nvcc_spelling", "target_key",
           "candidate_targets", "format_target", "major_minor", "min_nvcc_for", "normalize", "target_supported",
           "ArchListError", "ArchSpec", "MAX_ARCH_LIST_CHARS", "export_arch_list", "named", "assigned",
           "parse_arch_list", "parse_arch_list_lenient"]

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
    """``"13.0.88"`` -> ``13.0``; ``None`` when empty or unparsable."""
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
    """Whether nvcc ``nvcc_version`` compiles ``target``; one newer than the table only when ``explicit``
    (suffixed in the arch list) and the nvcc is at least :data:`NEWEST_KNOWN_NVCC`."""
    need = min_nvcc_for(target)
    if need is None:
        return explicit and nvcc_version >= NEWEST_KNOWN_NVCC
    dropped = dropped_in(target)
    return nvcc_version >= need and (dropped is None or nvcc_version.major < dropped)


def candidate_targets(major: int, minor: int) -> list[tuple[int, str]]:
    """FlashInfer's preferred target for a capability, then fallbacks (0.7.4 ``compilation_context.py``
    ``_normalize_cuda_arch``: SM 12.0 -> ``0f``, else ``0a``; SM 9+ -> ``a``; SM 12.1 gets its own
    ``1a``, since SM120 code on SM121 can raise ``cudaErrorIllegalInstruction``)."""
    if major == 12 and minor == 0:
        return [(12, "0f"), (12, "0a")]
    if major >= 9:
        return [(major, f"{minor}a")]
    return [(major, str(minor))]


def normalize(major: int, minor: int, nvcc_version: Version) -> tuple[int, str]:
    """Best target for ``(major, minor)`` that ``nvcc_version`` builds; else :class:`ArchNotSupported` with the fix."""
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


class ArchListError(Sm120Error, ValueError):
    """``FLASHINFER_CUDA_ARCH_LIST`` (or ``--arch``) could not be parsed; the message names the value
    and shows the accepted form."""


_ARCH_RE = re.compile(r"^(?:sm_?|compute_?)?(\d+)\.?(\d)([af]?)$", re.IGNORECASE)
_DOTTED_RE = re.compile(r"^(\d+)\.(\d+)([af]?)$", re.IGNORECASE)


@dataclass(frozen=True)
class ArchSpec:
    """One parsed entry of an arch list: capability plus an explicit suffix, if any."""

    major: int
    minor: int
    suffix: str | None  # "a", "f", "" (explicitly plain) or None (let normalize pick)

    def target(self, nvcc_version: Version) -> tuple[int, str]:
        """The target; an explicit suffix is kept, as FlashInfer does."""
        if self.suffix:
            return (self.major, f"{self.minor}{self.suffix}")
        return normalize(self.major, self.minor, nvcc_version)


def parse_arch_list(value: str, *, source: str = "FLASHINFER_CUDA_ARCH_LIST") -> list[ArchSpec]:
    """The entries of an arch list (``"12.0"``, ``"9.0a 12.0f"``, ``"8.9,12.1"``, ``sm_120``, ``8.6+PTX``),
    in order, without repeats; :class:`ArchListError` for a bad entry.  FlashInfer 0.7.4 takes only
    space-separated ``major.minor[suffix]`` and crashes its import with a bare ``ValueError`` otherwise."""
    specs, errors = parse_arch_list_lenient(value, source=source)
    if errors:
        raise ArchListError(errors[0])
    return specs


#: ``(as typed, as exported)`` by :func:`export_arch_list`: messages then name the ``--arch`` the user
#: typed, not the variable it was passed on as.
_option: tuple[str, str] | None = None


def export_arch_list(value: str | None) -> None:
    """Export ``--arch`` as ``FLASHINFER_CUDA_ARCH_LIST`` before FlashInfer loads (``None``: leave it);
    :class:`ArchListError` and nothing exported when it does not parse."""
    global _option
    if value is None:
        return
    specs = parse_arch_list(value, source="--arch")
    listed = " ".join(f"{s.major}.{s.minor}{s.suffix or ''}" for s in specs)
    os.environ["FLASHINFER_CUDA_ARCH_LIST"], _option = listed, (value, listed)


def named(listed: str | None = None) -> str:
    """How a message names the arch list (``listed``: its entries as read): ``--arch '99', read as 9.9``
    while the variable holds what this command's ``--arch`` exported, else
    ``FLASHINFER_CUDA_ARCH_LIST='9.9'``; without ``listed``, the bare name (``--arch``)."""
    if _option is not None and os.environ.get("FLASHINFER_CUDA_ARCH_LIST") == _option[1]:
        typed = shown(_option[0], 80)
        if listed is None:
            return "--arch"
        return f"--arch {typed}" + (f", read as {listed}" if _option[0].strip() != listed else "")
    return "FLASHINFER_CUDA_ARCH_LIST" if listed is None else f"FLASHINFER_CUDA_ARCH_LIST='{listed}'"


def assigned(entries: str) -> str:
    """How a fix writes an arch list: ``--arch 9.9a`` for a command given ``--arch``, else
    ``FLASHINFER_CUDA_ARCH_LIST='9.9a'``."""
    return f"--arch {entries}" if named() == "--arch" else f"FLASHINFER_CUDA_ARCH_LIST='{entries}'"


#: Longest arch list read (characters); a longer value is refused whole, with a
#: bounded message, before it is split (ten GPU families fit in 64 characters).
MAX_ARCH_LIST_CHARS = 4096


def _major_hint(entries: list[str]) -> str:
    """`` Did you mean '12.0'?`` for a bare major number ('12' reads as 1.2, '9' as nothing)."""
    for e in entries:
        if e.isascii() and e.isdigit() and 3 <= int(e) <= 20:  # '²'.isdigit() is true, int('²') fails
            return f" Did you mean '{int(e)}.0'?"
    return ""


def parse_arch_list_lenient(value: str, *, source: str = "FLASHINFER_CUDA_ARCH_LIST"
                            ) -> tuple[list[ArchSpec], list[str]]:
    """``(specs, errors)``: the entries that parsed, and one message per kind of fault (a typo must not
    break ``import flashinfer``)."""
    example = ("Accepted forms, e.g. '12.0' (RTX 5090 / RTX PRO 6000), '12.1' (DGX Spark), a list such as "
               "'12.0,12.1' or '12.0 12.1', and '12.0f', '9.0a' or 'sm_120'")
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
    typed = f"{source}={shown(value)}" + (f" (read as {len(entries)} entries, {some(entries)})"
                                          if len(entries) > 1 else "")
    meant = f" Did you mean '{value.strip().replace(',', '.')}'?" if re.fullmatch(r"\s*\d+,\d\s*", value) else ""
    if bad:
        errors.append(
            f"{typed}: {'entry' if len(bad) == 1 else 'entries'} {some(bad)} "
            f"{'is' if len(bad) == 1 else 'are'} not a compute capability. {example}.{meant or _major_hint(bad)}"
        )
    if unknown:
        errors.append(
            f"{typed}: {'entry' if len(unknown) == 1 else 'entries'} {some(unknown)} "
            f"{'is' if len(unknown) == 1 else 'are'} not a known compute capability (major 3..20, "
            f"minor 0..9), e.g. '12.0'.{meant or _major_hint(unknown)}"
        )
    return out, errors
