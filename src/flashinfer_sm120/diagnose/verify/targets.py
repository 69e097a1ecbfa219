"""Which compiled code runs on which GPU, as data.

SASS ``sm_XYa`` runs only on X.Y; ``sm_XYf`` and ``sm_XY`` on X.Z with Z >= Y (``exact`` when Z == Y,
else ``compatible``).  PTX (``jit``): ``compute_XYa`` only X.Y, ``compute_XYf`` the same major from X.Y
on, ``compute_XY`` every later GPU.  Sources: FlashInfer 0.7.4 ``jit/_cuda_architecture.py``
(``cuda_binary_target_compatibility_score``), the CUDA C++ Programming Guide, CUDA 12.9 release notes.
SM 12.1 running SM 12.0 code is legal, but FlashInfer builds ``sm_121a`` since 0.6.12 because such
code gave wrong results there (FlashInfer issue 3294): :func:`caution`.
"""

from __future__ import annotations

import re

__all__ = ["RANK", "parse_target", "capability_of", "runs", "best", "caution"]

_TARGET_RE = re.compile(r"^(sm|compute)_([0-9]{1,2})([0-9])([af]?)$")

#: Verdicts from best to worst (``None``: cannot run).
RANK = ("exact", "compatible", "jit")


def parse_target(target: str) -> tuple[str, int, int, str] | None:
    """``"sm_120f"`` -> ``("SASS", 12, 0, "f")``; ``"compute_90a"`` -> ``("PTX", 9, 0, "a")``; else ``None``."""
    m = _TARGET_RE.match(target)
    if not m:
        return None
    return ("SASS" if m.group(1) == "sm" else "PTX", int(m.group(2)), int(m.group(3)), m.group(4))


def capability_of(target: str) -> tuple[int, int] | None:
    """The compute capability a target is named for: ``"sm_120f"`` -> ``(12, 0)``."""
    p = parse_target(target)
    return (p[1], p[2]) if p else None


def runs(target: str, capability: tuple[int, int]) -> str | None:
    """How code for ``target`` runs on a GPU of ``capability``: ``exact``, ``compatible``,
    ``jit`` (PTX compiled by the driver) or ``None`` (it cannot run there)."""
    p = parse_target(target)
    if p is None:
        return None
    kind, major, minor, suffix = p
    gmaj, gmin = capability
    if kind == "SASS":
        if suffix == "a":
            return "exact" if (major, minor) == (gmaj, gmin) else None
        if major != gmaj or minor > gmin:
            return None
        return "exact" if minor == gmin else "compatible"
    if suffix == "a":
        return "jit" if (major, minor) == (gmaj, gmin) else None
    if suffix == "f":
        return "jit" if major == gmaj and minor <= gmin else None
    return "jit" if (major, minor) <= (gmaj, gmin) else None


def best(targets: list[str] | tuple[str, ...], capability: tuple[int, int]) -> tuple[str | None, str | None]:
    """``(verdict, target)`` of the best code among ``targets`` for ``capability``."""
    found = [(RANK.index(v), t) for t in targets if (v := runs(t, capability)) is not None]
    if not found:
        return None, None
    rank, target = min(found)
    return RANK[rank], target


def caution(verdict: str | None, target: str | None, capability: tuple[int, int]) -> str | None:
    """A warning for legal but risky code: SM 12.x code built for an earlier minor."""
    if verdict == "compatible" and target and capability[0] == 12:
        return (f"runs {target} code on compute capability {capability[0]}.{capability[1]} by binary "
                f"compatibility; FlashInfer builds sm_{capability[0]}{capability[1]}a for it because such code "
                f"has given wrong results there (FlashInfer issue 3294)")
    return None
