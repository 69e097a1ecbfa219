"""Read an arch list (``FLASHINFER_CUDA_ARCH_LIST``, ``--arch``): compute capabilities with an optional
``a``/``f`` suffix, in the spellings people type, strictly or keeping the good entries; each entry's
target is chosen by :func:`flashinfer_sm120.core.facts.arch.normalize` unless its suffix is given."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from packaging.version import Version

from flashinfer_sm120.core.facts.arch import normalize
from flashinfer_sm120.errors import Sm120Error
from flashinfer_sm120.safety.formats.base import shown, some

__all__ = ["ArchListError", "ArchSpec", "MAX_ARCH_LIST_CHARS", "export_arch_list", "named", "assigned",
           "parse_arch_list", "parse_arch_list_lenient"]


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
        """The ``(major, minor_str)`` target; explicit suffixes are kept as given,
        as FlashInfer does for ``FLASHINFER_CUDA_ARCH_LIST=12.0f``."""
        if self.suffix:
            return (self.major, f"{self.minor}{self.suffix}")
        return normalize(self.major, self.minor, nvcc_version)


def parse_arch_list(value: str, *, source: str = "FLASHINFER_CUDA_ARCH_LIST") -> list[ArchSpec]:
    """The entries of an arch list such as ``"12.0"``, ``"9.0a 12.0f"`` or ``"8.9,12.1"``, in order,
    without repeats; ``source`` names it in messages.

    FlashInfer 0.7.4 (``flashinfer/compilation_context.py``) accepts only space-separated
    ``major.minor[suffix]`` entries and crashes its import with a bare ``ValueError`` on anything else;
    this also takes commas or semicolons, the ``sm_120``/``120a`` spellings nvcc users type, and
    PyTorch's ``+PTX`` suffix (dropped: FlashInfer builds cubins only).

    Raises:
        ArchListError: an entry is not a compute capability.
    """
    specs, errors = parse_arch_list_lenient(value, source=source)
    if errors:
        raise ArchListError(errors[0])
    return specs


#: ``(as typed, as exported)`` by :func:`export_arch_list`: messages then name the ``--arch`` the user
#: typed, not the variable it was passed on as.
_option: tuple[str, str] | None = None


def export_arch_list(value: str | None) -> None:
    """Export ``value`` (``--arch`` of every command) as ``FLASHINFER_CUDA_ARCH_LIST`` before FlashInfer
    loads; ``None`` leaves the variable alone.  Raises :class:`ArchListError` and exports nothing when
    it does not parse."""
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
    """``(specs, errors)``: the entries that parsed, and one message per kind of fault.  Used at import
    time, where a typo must not break ``import flashinfer``."""
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
