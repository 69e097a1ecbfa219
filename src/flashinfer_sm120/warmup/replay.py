"""Turn a recorded manifest back into FlashInfer specs on this machine (no GPU needed)."""

from __future__ import annotations

from flashinfer_sm120.errors import FormatError
from flashinfer_sm120.warmup.regenerate import CannotRegenerate, make_spec, read
from flashinfer_sm120.warmup.session import BuildError

__all__ = ["load", "arch_for", "regenerate"]


def load(path: str) -> tuple[list[dict], list[str]]:
    """Entries of the manifest at ``path`` (duplicates from many workers dropped) and problems.

    :raises BuildError: the file cannot be read or holds no entry."""
    try:
        entries, problems = read(path)
    except OSError as exc:
        raise BuildError(f"cannot read manifest {path}: {exc.strerror or exc}; record one with "
                         f"FLASHINFER_SM120_RECORD={path} on the machine that runs the model") from None
    except FormatError as exc:  # not a regular file (/dev/zero, a FIFO), too many lines
        raise BuildError(str(exc)) from None
    if not entries:
        raise BuildError(f"manifest {path} holds no module entries"
                         + (f" ({problems[0]}" + (f"; and {len(problems) - 1} more" if len(problems) > 1 else "")
                            + ")" if problems else "")
                         + f"; record one with FLASHINFER_SM120_RECORD={path}")
    return entries, problems


def arch_for(entries: list[dict], arch: str | None) -> str | None:
    """``--arch`` if given, else the targets the manifest was recorded with.

    :raises BuildError: entries were recorded for different target sets and no ``--arch``."""
    if arch is not None:
        return arch
    sets = sorted({tuple(e.get("targets") or ()) for e in entries if e.get("targets")})
    if not sets:
        return None
    if len(sets) > 1:
        raise BuildError("the manifest was recorded for different targets ("
                         + "; ".join(" ".join(s) for s in sets) + "); pass --arch to pick one, "
                         f"e.g. --arch '{' '.join(sets[0])}'")
    return " ".join(sets[0])


def regenerate(entries: list[dict], flashinfer_version: str) -> tuple[list[tuple[str, object]], list[tuple[str, str]]]:
    """Specs for the entries this FlashInfer can regenerate, and ``(name, why)`` for the others."""
    specs, skipped = [], []
    for entry in entries:
        name = str(entry.get("name"))
        try:
            specs.append((name, make_spec(entry, flashinfer_version)))
        except CannotRegenerate as exc:
            skipped.append((name, str(exc)))
        except Exception as exc:  # a malformed entry is reported, not fatal
            skipped.append((name, f"malformed entry ({exc!r})"))
    return specs, skipped
