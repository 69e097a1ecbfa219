"""Choose one toolkit and say why the others lost (docs/toolkit.md "The choice"): FlashInfer's own when acceptable
(P1), else the first acceptable in order, else one :class:`ToolkitError` with one fix."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from packaging.version import Version

from flashinfer_sm120.core.facts import arch as _arch
from flashinfer_sm120.core.facts import archopt
from flashinfer_sm120.core.toolkit import fixes as _fixes
from flashinfer_sm120.core.toolkit.fixes import ALLOW_OTHER_MAJOR_ENV
from flashinfer_sm120.core.toolkit.model import Choice, RejectKind, Rejection, Toolkit
from flashinfer_sm120.core.toolkit.sources import Candidates
from flashinfer_sm120.errors import ToolkitError
from flashinfer_sm120.safety.formats.reads import env_flag

#: The variables that name a toolkit: one that is refused leaves the choice as if it were unset (P1, P8).
EXPLICIT_SOURCES = ("FLASHINFER_NVCC", "CUDA_HOME", "CUDA_PATH")
_PREFERRED_MAJOR_FOR_CPU_TORCH = 13
_SEARCHED = ("CUDA_HOME, CUDA_PATH, pip (site-packages/nvidia/cu13), PATH, /usr/local/cuda, /usr/local/cuda-*, "
             "$CONDA_PREFIX")


def other_major_allowed(env: Mapping[str, str] | None = None) -> bool:
    return env_flag(ALLOW_OTHER_MAJOR_ENV, env)


def torch_cuda_version() -> str | None:
    try:
        import torch
    except Exception:
        return None
    return getattr(torch.version, "cuda", None)


def _names(targets) -> str:
    return ", ".join(_arch.format_target(t) for t in targets)


def choose(toolkits: Sequence[Toolkit], arch_specs: list[_arch.ArchSpec] | None,
           capabilities: list[tuple[int, int]], torch_cuda: str | None, *, min_nvcc: Version | None = None,
           min_nvcc_why: str | None = None, allow_other_major: bool | None = None,
           own: str | None = None, own_unset: str | None = None) -> Choice:
    """The toolkit building the best targets of ``arch_specs`` (else the GPUs'); ``own``: FlashInfer's own nvcc;
    ``own_unset``: the one it runs without :data:`EXPLICIT_SOURCES`, kept when each candidate they name is refused."""
    if allow_other_major is None:
        allow_other_major = other_major_allowed()
    if arch_specs is not None:
        caps = [(s.major, s.minor) for s in arch_specs]
        fixed = {(s.major, s.minor): (s.major, f"{s.minor}{s.suffix}") for s in arch_specs if s.suffix}
    else:
        caps, fixed = list(dict.fromkeys(capabilities)), {}
    explicit = set(fixed.values())
    target_sets: list[list[tuple[int, str]]] = []
    for depth in (0, -1):  # preferred, then fallback
        wanted = [fixed.get(c) or _arch.candidate_targets(*c)[depth] for c in caps]
        if wanted not in target_sets:
            target_sets.append(wanted)
    tmm = _arch.major_minor(torch_cuda)
    majors = [None] if tmm is None else [tmm.major] + ([None] if allow_other_major else [])

    def why_first(tk: Toolkit) -> str | None:
        return _why_not(tk, target_sets[0], explicit, torch_cuda, majors[0], min_nvcc, min_nvcc_why)

    refused: dict[int, str | None] = {}
    for attempt, nvcc in enumerate((own, own_unset)):
        if nvcc is None:
            continue
        if attempt:  # only when every setting naming a toolkit is refused: the choice made without them
            for i in (i for i in range(len(toolkits)) if _source(toolkits, i) in EXPLICIT_SOURCES):
                refused[i] = why_first(toolkits[i])
                if refused[i] is None:
                    break
            if not refused or not all(refused.values()):
                break
        kept = _own(toolkits, nvcc)
        tk = toolkits[kept] if kept is not None else None
        if tk and why_first(tk) is None and (tmm is not None
                                             or tk.nvcc_version.major >= _PREFERRED_MAJOR_FOR_CPU_TORCH):
            unset = ", ".join(sorted({toolkits[i].sources[0] for i in refused}))
            return _choice(toolkits, kept, {**refused, kept: None}, None, caps, fixed, target_sets[0],
                           target_sets[0], torch_cuda, own=f" without {unset}" if unset else "")
    first_reasons: dict[int, str] = {}
    for major in majors:
        for wanted in target_sets:
            def why(tk: Toolkit, wanted=wanted, major=major) -> str | None:
                return _why_not(tk, wanted, explicit, torch_cuda, major, min_nvcc, min_nvcc_why)

            verdict: dict[int, str | None] = {}
            pick = held = None
            for i in range(len(toolkits)):
                tk = toolkits[i]
                verdict[i] = why(tk)
                if verdict[i] is not None:
                    continue
                if (tmm is None and tk.nvcc_version.major < _PREFERRED_MAJOR_FOR_CPU_TORCH
                        and tk.sources[0] not in EXPLICIT_SOURCES):
                    held = i if held is None else held  # CPU torch: look on for a CUDA 13+ toolkit
                    continue
                pick = i
                break
            pick = held if pick is None else pick
            if pick is not None:
                return _choice(toolkits, pick, verdict, why, caps, fixed, wanted, target_sets[0], torch_cuda)
            first_reasons = first_reasons or {i: r for i, r in verdict.items() if r}
    raise _refusal(toolkits, first_reasons, arch_specs, capabilities, target_sets, explicit, torch_cuda,
                   min_nvcc, min_nvcc_why, allow_other_major)


def _source(toolkits: Sequence[Toolkit], i: int) -> str:
    """Where candidate ``i`` was found first, read without inspecting it."""
    return ((toolkits.unread(i) if isinstance(toolkits, Candidates) else None) or toolkits[i]).sources[0]


def _own(toolkits: Sequence[Toolkit], own: str) -> int | None:
    for i in range(len(toolkits)):
        tk = (toolkits.unread(i) if isinstance(toolkits, Candidates) else None) or toolkits[i]
        if not tk.problem and os.path.realpath(os.path.join(tk.root, "bin", "nvcc")) == own:
            return i
    return None


def _why_not(tk: Toolkit, targets, explicit, torch_cuda, major, min_nvcc, min_nvcc_why) -> str | None:
    if tk.problem:
        return tk.problem
    v = tk.nvcc_version
    if v is None:
        return "version unknown"
    why: list[str] = []
    if major is not None and v.major != major:
        why.append(f"CUDA {v.major}, but torch is built for CUDA {torch_cuda} (another libcudart major; "
                   f"{ALLOW_OTHER_MAJOR_ENV}=1 accepts it anyway)")
    if min_nvcc is not None and v < min_nvcc:
        why.append(f"nvcc {v} is older than {min_nvcc}, needed because {min_nvcc_why or 'of this FlashInfer release'}")
    missing = [t for t in targets if not _arch.target_supported(t, v, explicit=t in explicit)]
    if missing:
        why.append(f"nvcc {v} cannot build " + ", ".join(_fixes.target_reason(t, v) for t in missing))
    return "; ".join(why) or None


def _rejection(toolkits, j, pick, verdict, why) -> Rejection:
    chosen = toolkits[pick].root
    if j not in verdict:
        unread = toolkits.unread(j) if isinstance(toolkits, Candidates) else None
        if why is None:  # FlashInfer's own toolkit was kept
            return Rejection(unread or toolkits[j], RejectKind.NOT_EXAMINED,
                             f"not examined: FlashInfer's own toolkit {chosen} works")
        if unread is not None:
            return Rejection(unread, RejectKind.NOT_EXAMINED, f"not examined: {chosen} comes first and works")
        verdict[j] = why(toolkits[j])
    if verdict[j] is not None:
        return Rejection(toolkits[j], RejectKind.NOT_CHOSEN if j > pick else RejectKind.UNUSABLE, verdict[j])
    if j < pick:
        return Rejection(toolkits[j], RejectKind.USABLE, f"usable, but with a CPU-only torch a CUDA "
                         f"{_PREFERRED_MAJOR_FOR_CPU_TORCH}+ toolkit ({chosen}) is preferred")
    return Rejection(toolkits[j], RejectKind.USABLE, f"usable, but {chosen} comes first")


def _choice(toolkits, pick, verdict, why, caps, fixed, wanted, preferred, torch_cuda, own=None) -> Choice:
    tk = toolkits[pick]
    v = tk.nvcc_version
    targets = tuple(sorted({fixed[c] if c in fixed else _arch.normalize(*c, v) for c in caps}))
    rejected = tuple(_rejection(toolkits, j, pick, verdict, why) for j in range(len(toolkits)) if j != pick)
    reason = (f"FlashInfer's own toolkit{own} ({tk.sources[0]}), kept: it builds {_names(targets) or 'no GPU targets'}"
              if own is not None else
              f"first acceptable toolkit in order ({tk.sources[0]}) for {_names(targets) or 'no GPU targets'}")
    if wanted != preferred:
        reason += f"; no toolkit could build the preferred targets {_names(preferred)}"
    tmm = _arch.major_minor(torch_cuda)
    if tmm is not None and v.major != tmm.major:
        reason += (f"; CUDA {v.major} accepted although torch is built for CUDA {torch_cuda}, because "
                   f"{ALLOW_OTHER_MAJOR_ENV} is set: {_fixes.torch_major_why(torch_cuda)}")
    unknown = [t for t in targets if _arch.min_nvcc_for(t) is None]
    if unknown:
        reason += f"; {_names(unknown)} not in flashinfer-sm120's table, used as given in {archopt.named()}"
    return Choice(tk, targets, tuple(caps), rejected, reason, torch_cuda)


def _refusal(toolkits, reasons, arch_specs, capabilities, target_sets, explicit, torch_cuda,
             min_nvcc, min_nvcc_why, allow_other_major) -> ToolkitError:
    preferred, fallback = target_sets[0], target_sets[-1]
    gpus = ", ".join(f"{a}.{b}" for a, b in dict.fromkeys(capabilities))
    if arch_specs is not None:
        listed = " ".join(f"{s.major}.{s.minor}{s.suffix or ''}" for s in arch_specs)
        where = f" ({archopt.named(listed)}" + (f"; GPUs: compute capability {gpus})" if gpus else ")")
    else:
        where = f" for the GPUs (compute capability {gpus})" if gpus else ""
    torch_txt = f"torch built for CUDA {torch_cuda}" if torch_cuda else "a CPU-only torch"
    head = f"no CUDA toolkit can build {_names(preferred) or '(no GPU targets)'}{where} with {torch_txt}."
    needs: list[str] = []
    for t, fb in zip(preferred, fallback):
        need, name = _arch.min_nvcc_for(t), _arch.format_target(t)
        if need is None:
            needs.append(f"{name}: not in flashinfer-sm120's table of targets")
        elif t in explicit or t == fb:
            needs.append(f"{name}: nvcc >= {need}")
        else:
            needs.append(f"{name}: nvcc >= {need} (or {_arch.format_target(fb)}: nvcc >= {_arch.min_nvcc_for(fb)})")
        gone = _arch.dropped_in(t)
        if gone is not None:
            needs[-1] += f", and a CUDA {gone - 1}.x nvcc (CUDA {gone}.0 dropped it)"
    if min_nvcc is not None:
        needs.append(f"nvcc >= {min_nvcc} because {min_nvcc_why or 'of this FlashInfer release'}")
    tmm = _arch.major_minor(torch_cuda)
    if tmm is not None:
        needs.append(f"a CUDA {tmm.major}.x nvcc, torch's CUDA major: {_fixes.torch_major_why(torch_cuda)}"
                     + (f"; any major accepted ({ALLOW_OTHER_MAJOR_ENV} is set)" if allow_other_major else ""))
    found = [toolkits[i] for i in range(len(toolkits))]
    lines = [f"  - {tk.label}: {reasons.get(i, '?')}" for i, tk in enumerate(found)]
    lines = lines or [f"  (none: searched {_SEARCHED})"]
    fix = _fixes.choose_fix(preferred, torch_cuda, found, min_nvcc=min_nvcc, explicit=explicit)
    message = "\n".join([head, "Needed: " + "; ".join(needs) + ".", "Found:", *lines, f"Fix: {fix}"])
    return ToolkitError(message, fix=fix)
