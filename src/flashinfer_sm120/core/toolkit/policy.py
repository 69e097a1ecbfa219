"""Choose one toolkit for the wanted targets, and say why the others lost.

The choice policy
=================

A toolkit is *acceptable* for a set of targets when it has no ``problem``
(found, trusted, version readable, nvcc and headers agree), its nvcc is at
least the FlashInfer release's own minimum (``min_nvcc``: 12.8 on 0.6.18+,
which passes ``--compress-mode=size``), it builds every target
(:func:`flashinfer_sm120.core.facts.arch.target_supported`; arch-list targets with an
explicit suffix are taken as given), and its CUDA major is allowed (below).

Passes run in order; the first pass with an acceptable toolkit wins, and within
a pass the first acceptable toolkit in :data:`~flashinfer_sm120.core.toolkit.SOURCES`
order (``CUDA_HOME``, ``CUDA_PATH``, pip, ``PATH``, ``/usr/local/cuda``,
``/usr/local/cuda-*``, conda), so an explicit, working ``CUDA_HOME`` is kept.

=================  ===  ==================================  =====================
torch build        #    targets                             nvcc CUDA major
=================  ===  ==================================  =====================
CUDA X.y           1    preferred (sm_120f for SM 12.0)     X only
                   2    fallback (sm_120a for SM 12.0)      X only
                   3    preferred, only with opt-in [1]_    any
                   4    fallback, only with opt-in [1]_     any
CPU-only (None)    1    preferred                           any, 13+ first [2]_
                   2    fallback                            any, 13+ first [2]_
=================  ===  ==================================  =====================

.. [1] ``FLASHINFER_SM120_ALLOW_OTHER_CUDA_MAJOR=1``.  Default: never.  FlashInfer
   links every JIT module with ``-lcudart`` of the toolkit's major
   (``flashinfer/jit/cpp_ext.py``), while torch has already loaded its own
   ``libcudart.so.X``: two CUDA runtimes of different majors in one process, and
   a driver new enough for the newer one.  It may work (CUDA 13 cubins on a
   cu12 torch with a 580+ driver); it is the user's call, never ours.
.. [2] With a CPU-only torch no libcudart is loaded, so any major builds; an
   explicit ``CUDA_HOME``/``CUDA_PATH`` is kept, otherwise a CUDA 13+ toolkit
   (the pip one this package depends on) is preferred to a 12.x one later in
   the order, and 12.x is used only when no 13+ toolkit is acceptable.

When no pass finds a toolkit, :class:`ToolkitError` carries ONE message: the
targets and GPUs, what is needed (per target, the release minimum, the CUDA
major), each candidate found and why it was rejected, and the one fix line
(:mod:`.fixes`), also in ``ToolkitError.fix``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from packaging.version import Version

from flashinfer_sm120.core.facts import arch as _arch
from flashinfer_sm120.core.facts import archlist
from flashinfer_sm120.errors import ToolkitError
from flashinfer_sm120.safety.envflag import env_flag
from flashinfer_sm120.core.toolkit import fixes as _fixes
from flashinfer_sm120.core.toolkit.model import Choice, RejectKind, Rejection, Toolkit
from flashinfer_sm120.core.toolkit.sources import Candidates

__all__ = ["choose", "unbuildable", "other_major_allowed", "ALLOW_OTHER_MAJOR_ENV"]

ALLOW_OTHER_MAJOR_ENV = _fixes.ALLOW_OTHER_MAJOR_ENV

_EXPLICIT_SOURCES = ("FLASHINFER_NVCC", "CUDA_HOME", "CUDA_PATH")
_PREFERRED_MAJOR_FOR_CPU_TORCH = 13


def other_major_allowed(env: Mapping[str, str] | None = None) -> bool:
    """Whether ``FLASHINFER_SM120_ALLOW_OTHER_CUDA_MAJOR`` is on in ``env``
    (default ``os.environ``): anything but unset, empty, ``0``, ``false``,
    ``no`` or ``off`` (case-insensitive)."""
    return env_flag(ALLOW_OTHER_MAJOR_ENV, env)


def _why_not(tk: Toolkit, targets: Sequence[tuple[int, str]], explicit: set, torch_cuda: str | None,
             major: int | None, min_nvcc: Version | None, min_nvcc_why: str | None) -> str | None:
    """Every reason ``tk`` is not acceptable, joined; ``None`` when it is."""
    if tk.problem:
        return tk.problem
    if tk.nvcc_version is None:
        return "version unknown"
    v = tk.nvcc_version
    why: list[str] = []
    if major is not None and v.major != major and torch_cuda:
        why.append(_fixes.major_mismatch_reason(v, torch_cuda))
    if min_nvcc is not None and v < min_nvcc:
        why.append(_fixes.min_nvcc_reason(v, min_nvcc, min_nvcc_why))
    missing = [t for t in targets if not _arch.target_supported(t, v, explicit=t in explicit)]
    if missing:
        why.append(f"nvcc {v} cannot build " + ", ".join(_target_need(t, v) for t in missing))
    return "; ".join(why) or None


def _target_need(t: tuple[int, str], v: Version) -> str:
    name = _arch.format_target(t)
    gone = _arch.dropped_in(t)
    if gone is not None and v.major >= gone:
        return f"{name} (dropped in CUDA {gone}.0)"
    need = _arch.min_nvcc_for(t)
    if need is None:
        return f"{name} (not in flashinfer-sm120's table: upgrade flashinfer-sm120)"
    return f"{name} (nvcc >= {need})"


def _after(toolkits: Sequence[Toolkit], j: int, chosen: Toolkit, why) -> Rejection:
    """A candidate after the chosen one: its own verdict if already read, else
    a placeholder (lazy :class:`Candidates` do not read what is not needed)."""
    if isinstance(toolkits, Candidates) and not toolkits.is_read(j):
        return Rejection(toolkits.peek(j), RejectKind.NOT_EXAMINED,
                         f"not examined: {chosen.root} comes first and works")
    tk = toolkits[j]
    reason = why(tk)
    if reason:
        return Rejection(tk, RejectKind.NOT_CHOSEN, reason)
    return Rejection(tk, RejectKind.USABLE, f"usable, but {chosen.root} comes first")


def choose(
    toolkits: Sequence[Toolkit],
    arch_specs: list[archlist.ArchSpec] | None,
    capabilities: list[tuple[int, int]],
    torch_cuda: str | None,
    *,
    min_nvcc: Version | None = None,
    min_nvcc_why: str | None = None,
    allow_other_major: bool | None = None,
) -> Choice:
    """Pick the toolkit that builds the best targets for the wanted capabilities.

    The policy (passes, CUDA major rule, order) is the table in this module's
    docstring.

    Args:
        toolkits: from :func:`discover` (inspected lazily: toolkits after the
            chosen one are not read), or any sequence of :class:`Toolkit`.
        arch_specs: parsed ``FLASHINFER_CUDA_ARCH_LIST``, or ``None`` to use
            ``capabilities``; explicit suffixes (``12.0f``) are required as given.
        capabilities: visible GPUs' compute capabilities, e.g. ``[(12, 0)]``.
        torch_cuda: ``torch.version.cuda`` (e.g. ``"13.0"``) or ``None``.
        min_nvcc: the FlashInfer release's minimum nvcc ``major.minor`` for its
            own build flags (``releases.release_info(v).min_nvcc``), or ``None``.
        min_nvcc_why: what needs ``min_nvcc``, named in messages, e.g.
            ``"FlashInfer 0.6.18+ passes --compress-mode=size (flashinfer/jit/cpp_ext.py)"``.
        allow_other_major: accept an nvcc of another CUDA major than torch's when
            none of torch's fits; default: the environment variable
            ``FLASHINFER_SM120_ALLOW_OTHER_CUDA_MAJOR`` in ``os.environ`` (a
            caller resolving another env passes ``other_major_allowed(env)``).

    Returns:
        :class:`Choice`: toolkit, targets, why it won, why each other lost.

    Raises:
        ToolkitError: nothing passes; ONE message naming the targets and GPUs,
            what is needed, each candidate and why it was rejected, and the fix
            line (also ``.fix``).
    """
    if allow_other_major is None:
        allow_other_major = other_major_allowed()
    if arch_specs is not None:
        caps = [(s.major, s.minor) for s in arch_specs]
        fixed = {(s.major, s.minor): (s.major, f"{s.minor}{s.suffix}") for s in arch_specs if s.suffix}
    else:
        caps = list(dict.fromkeys(capabilities))
        fixed = {}
    explicit = set(fixed.values())
    target_sets: list[list[tuple[int, str]]] = []
    for depth in (0, -1):
        wanted = [fixed.get(c) or _arch.candidate_targets(*c)[depth] for c in caps]
        if wanted not in target_sets:
            target_sets.append(wanted)
    tmm = _arch.major_minor(torch_cuda)
    if tmm is None:
        passes = [(w, None) for w in target_sets]
    else:
        passes = [(w, tmm.major) for w in target_sets]
        if allow_other_major:
            passes += [(w, None) for w in target_sets]
    first_reasons: dict[int, str] = {}
    for n, (wanted, major) in enumerate(passes):
        def why(tk, wanted=wanted, major=major):
            return _why_not(tk, wanted, explicit, torch_cuda, major, min_nvcc, min_nvcc_why)
        verdict: dict[int, str | None] = {}
        pick = held = None
        for i in range(len(toolkits)):
            tk = toolkits[i]
            verdict[i] = why(tk)
            if verdict[i] is not None:
                continue
            if (tmm is None and tk.nvcc_version.major < _PREFERRED_MAJOR_FOR_CPU_TORCH
                    and tk.sources[0] not in _EXPLICIT_SOURCES):
                held = i if held is None else held  # CPU torch: look on for a CUDA 13+ toolkit
                continue
            pick = i
            break
        if pick is None:
            pick = held
        if pick is not None:
            return _choice(toolkits, pick, verdict, why, caps, fixed, wanted, target_sets[0],
                           torch_cuda, major)
        if n == 0:
            first_reasons = {i: r for i, r in verdict.items() if r}
    raise _refusal(toolkits, first_reasons, arch_specs, capabilities, target_sets, explicit, torch_cuda,
                   min_nvcc, min_nvcc_why, allow_other_major)


def _choice(toolkits, pick, verdict, why, caps, fixed, wanted, preferred, torch_cuda, major) -> Choice:
    tk = toolkits[pick]
    v = tk.nvcc_version
    targets = tuple(sorted({fixed[c] if c in fixed else _arch.normalize(*c, v) for c in caps}))
    rejected = []
    for j in range(len(toolkits)):
        if j == pick:
            continue
        if j in verdict:
            r = verdict[j]
            if r is None:
                rejected.append(Rejection(toolkits[j], RejectKind.USABLE, (
                    f"usable, but with a CPU-only torch a CUDA {_PREFERRED_MAJOR_FOR_CPU_TORCH}+ toolkit "
                    f"({tk.root}) is preferred" if j < pick else f"usable, but {tk.root} comes first")))
            else:
                rejected.append(Rejection(toolkits[j], RejectKind.NOT_CHOSEN if j > pick else RejectKind.UNUSABLE, r))
        else:
            rejected.append(_after(toolkits, j, tk, why))
    what = ", ".join(_arch.format_target(t) for t in targets) or "no GPU targets"
    reason = f"first acceptable toolkit in order ({tk.sources[0]}) for {what}"
    if wanted != preferred:
        reason += "; no toolkit could build the preferred targets " + ", ".join(
            _arch.format_target(t) for t in preferred)
    tmm = _arch.major_minor(torch_cuda)
    if tmm is not None and major is None and v.major != tmm.major:
        reason += (f"; CUDA {v.major} accepted although torch is built for CUDA {torch_cuda}, because "
                   f"{ALLOW_OTHER_MAJOR_ENV} is set: {_fixes.torch_major_why(torch_cuda)}")
    unknown = [t for t in targets if _arch.min_nvcc_for(t) is None]
    if unknown:
        reason += ("; " + ", ".join(_arch.format_target(t) for t in unknown)
                   + " not in flashinfer-sm120's table, used as given in FLASHINFER_CUDA_ARCH_LIST")
    return Choice(tk, targets, tuple(caps), tuple(rejected), reason, torch_cuda)


def _refusal(toolkits, reasons, arch_specs, capabilities, target_sets, explicit, torch_cuda,
             min_nvcc, min_nvcc_why, allow_other_major) -> ToolkitError:
    """The one error when no pass finds a toolkit (see the module docstring)."""
    preferred = target_sets[0]
    names = ", ".join(_arch.format_target(t) for t in preferred) or "(no GPU targets)"
    gpus = ", ".join(f"{a}.{b}" for a, b in dict.fromkeys(capabilities))
    if arch_specs is not None:
        listed = " ".join(f"{s.major}.{s.minor}{s.suffix or ''}" for s in arch_specs)
        where = f" (FLASHINFER_CUDA_ARCH_LIST='{listed}'" + (f"; GPUs: compute capability {gpus})" if gpus else ")")
    else:
        where = f" for the GPUs (compute capability {gpus})" if gpus else ""
    torch_txt = f"torch built for CUDA {torch_cuda}" if torch_cuda else "a CPU-only torch"
    head = f"no CUDA toolkit can build {names}{where} with {torch_txt}."
    needs: list[str] = []
    for t in preferred:
        need = _arch.min_nvcc_for(t)
        if need is None:
            needs.append(f"{_arch.format_target(t)}: not in flashinfer-sm120's table of targets")
        elif t in explicit or len(target_sets) == 1 or t in target_sets[-1]:
            needs.append(f"{_arch.format_target(t)}: nvcc >= {need}")
        else:
            fb = target_sets[-1][preferred.index(t)]
            needs.append(f"{_arch.format_target(t)}: nvcc >= {need} (or {_arch.format_target(fb)}: "
                         f"nvcc >= {_arch.min_nvcc_for(fb)})")
        gone = _arch.dropped_in(t)
        if gone is not None:
            needs[-1] += f", and a CUDA {gone - 1}.x nvcc (CUDA {gone}.0 dropped it)"
    if min_nvcc is not None:
        needs.append(f"nvcc >= {min_nvcc} because {min_nvcc_why or 'of this FlashInfer release'}")
    tmm = _arch.major_minor(torch_cuda)
    if tmm is not None:
        needs.append(f"a CUDA {tmm.major}.x nvcc, torch's CUDA major: {_fixes.torch_major_why(torch_cuda)}"
                     + ("" if not allow_other_major else f"; any major accepted ({ALLOW_OTHER_MAJOR_ENV} is set)"))
    found = [toolkits[i] for i in range(len(toolkits))]
    lines = [f"  - {tk.label}: {reasons.get(i, '?')}" for i, tk in enumerate(found)]
    if not lines:
        lines = ["  (none: searched CUDA_HOME, CUDA_PATH, pip (site-packages/nvidia/cu13), PATH, "
                 "/usr/local/cuda, /usr/local/cuda-*, $CONDA_PREFIX)"]
    fix = _fixes.choose_fix(preferred, torch_cuda, found, min_nvcc=min_nvcc, explicit=explicit)
    message = "\n".join([head, "Needed: " + "; ".join(needs) + ".", "Found:", *lines, f"Fix: {fix}"])
    return ToolkitError(message, fix=fix)


def unbuildable(targets: Iterable[tuple[int, str]], nvcc_version: Version) -> list[str]:
    """One message per target that nvcc ``nvcc_version`` cannot build.

    For explicit ``FLASHINFER_CUDA_ARCH_LIST`` targets, checked before nvcc runs
    (e.g. ``12.0f`` with only nvcc 12.8).  Targets with an explicit suffix that
    are missing from the table are taken as given by an nvcc of at least
    :data:`flashinfer_sm120.core.facts.arch.NEWEST_KNOWN_NVCC` (the escape hatch for GPUs
    newer than this release).

    Args:
        targets: ``(major, minor_str)`` targets, e.g. ``[(12, "0f")]``.
        nvcc_version: the chosen nvcc's ``major.minor``.

    Returns:
        Messages naming the target, the nvcc release, the minimum needed and the
        fix (:func:`.fixes.unbuildable_message`); empty when all are buildable.
    """
    out = []
    for t in dict.fromkeys(targets):
        msg = _fixes.unbuildable_message(t, nvcc_version)
        if msg:
            out.append(msg)
    return out
