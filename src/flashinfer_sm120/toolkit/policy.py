"""Choose one toolkit for the wanted targets, and say why the others lost."""

from __future__ import annotations

from collections.abc import Sequence

from .. import arch as _arch
from ..errors import ToolkitError
from .model import Choice, Toolkit
from .probe import major_minor
from .sources import Candidates

__all__ = ["choose"]


def _why_not(tk: Toolkit, targets: list[tuple[int, str]], torch_cuda: str | None) -> str | None:
    if tk.problem:
        return tk.problem
    if tk.nvcc_version is None:
        return "version unknown"
    if torch_cuda:
        tmaj = major_minor(torch_cuda)
        if tmaj and tmaj.major != tk.nvcc_version.major:
            return (
                f"nvcc {tk.nvcc_version} but torch is built for CUDA {torch_cuda}: the JIT "
                f"module would link a different libcudart major than torch loads; use a "
                f"CUDA {tmaj.major}.x toolkit, e.g. pip install "
                f"'cuda-toolkit[nvcc,cccl,curand]=={torch_cuda}.*'"
            )
    missing = [t for t in targets if not _arch.target_supported(t, tk.nvcc_version)]
    if missing:
        needs = ", ".join(
            f"{_arch.format_target(t)} (nvcc >= {_arch.min_nvcc_for(t)})" if _arch.min_nvcc_for(t)
            else f"{_arch.format_target(t)} (not in flashinfer-sm120's table: upgrade flashinfer-sm120)"
            for t in missing
        )
        return f"nvcc {tk.nvcc_version} cannot build {needs}"
    return None


def _after(toolkits: Sequence[Toolkit], j: int, chosen: Toolkit, wanted, torch_cuda) -> tuple[Toolkit, str]:
    """A candidate after the chosen one: its own verdict if already read, else
    a placeholder (lazy :class:`Candidates` do not read what is not needed)."""
    if isinstance(toolkits, Candidates) and not toolkits.is_read(j):
        return toolkits.peek(j), f"not examined: {chosen.root} comes first and works"
    tk = toolkits[j]
    why = _why_not(tk, wanted, torch_cuda)
    return tk, (f"not chosen ({why})" if why else f"usable, but {chosen.root} comes first")


def choose(
    toolkits: Sequence[Toolkit],
    arch_specs: list[_arch.ArchSpec] | None,
    capabilities: list[tuple[int, int]],
    torch_cuda: str | None,
) -> Choice:
    """Pick the toolkit that builds the best targets for the wanted capabilities.

    Pass 1 asks every capability for FlashInfer's preferred target (e.g. sm_120f
    for 12.0, needing nvcc 12.9); pass 2, only if no toolkit passes 1, accepts
    fallbacks (sm_120a on 12.8).  Within a pass the first acceptable toolkit in
    :func:`discover` order wins, so an explicit, working ``CUDA_HOME`` is kept.
    A toolkit is acceptable when it has no ``problem``, its nvcc major equals
    torch's CUDA major (when torch has CUDA), and it builds every target.

    Args:
        toolkits: from :func:`discover` (inspected lazily: toolkits after the
            chosen one are not read), or any sequence of :class:`Toolkit`.
        arch_specs: parsed ``FLASHINFER_CUDA_ARCH_LIST``, or ``None`` to use
            ``capabilities``; explicit suffixes (``12.0f``) are required as given.
        capabilities: visible GPUs' compute capabilities, e.g. ``[(12, 0)]``.
        torch_cuda: ``torch.version.cuda`` or ``None``.

    Raises:
        ToolkitError: nothing passes; the message lists each candidate and why.
    """
    if arch_specs is not None:
        caps = [(s.major, s.minor) for s in arch_specs]
        fixed = {(s.major, s.minor): (s.major, f"{s.minor}{s.suffix}") for s in arch_specs if s.suffix}
    else:
        caps = list(dict.fromkeys(capabilities))
        fixed = {}
    passes: list[list[tuple[int, str]]] = []
    for depth in (0, -1):
        wanted = [fixed.get(c) or _arch.candidate_targets(*c)[depth] for c in caps]
        if wanted not in passes:
            passes.append(wanted)
    last_reasons: dict[int, str] = {}
    for n, wanted in enumerate(passes):
        reasons: dict[int, str] = {}
        for i in range(len(toolkits)):
            tk = toolkits[i]
            why = _why_not(tk, wanted, torch_cuda)
            if why is None:
                targets = tuple(sorted({_arch.normalize(*c, tk.nvcc_version) if c not in fixed else fixed[c] for c in caps}))
                rejected = tuple(
                    (toolkits[j], reasons[j]) if j < i else _after(toolkits, j, tk, wanted, torch_cuda)
                    for j in range(len(toolkits)) if j != i)
                what = ", ".join(_arch.format_target(t) for t in targets) or "no GPU targets"
                reason = f"first acceptable toolkit in order ({tk.sources[0]}) for {what}"
                if n:
                    reason += "; no toolkit could build the preferred targets " + ", ".join(
                        _arch.format_target(t) for t in passes[0])
                return Choice(tk, targets, tuple(caps), rejected, reason, torch_cuda)
            reasons[i] = why
        last_reasons = reasons
    lines = [f"  - {toolkits[i].label}: {last_reasons.get(i, '?')}" for i in range(len(toolkits))]
    wanted_txt = ", ".join(_arch.format_target(t) for t in passes[0]) or "(no GPU targets)"
    raise ToolkitError(
        f"no CUDA toolkit can build {wanted_txt}"
        + (f" for torch CUDA {torch_cuda}" if torch_cuda else "")
        + ":\n" + ("\n".join(lines) if lines else "  (no toolkit found)")
        + f"\nFix: pip install 'cuda-toolkit[nvcc,cccl,curand]{_pin(torch_cuda)}' (pip nvcc in "
        "site-packages/nvidia/cu13), or set CUDA_HOME to a toolkit that can."
    )


def _pin(torch_cuda: str | None) -> str:
    """Version spec for the fix line: torch's CUDA minor release, else any 13.x."""
    return f"=={torch_cuda}.*" if major_minor(torch_cuda or "") else ">=13.0,<14"

