"""The summary line of the patch layer, rendered from the typed state (:class:`~.state.StepResult`,
:class:`~flashinfer_sm120.core.toolkit.model.Rejection`, :class:`~.resolve.TargetsFrom`): logged once
when FlashInfer is patched and given by :func:`summary`."""

from __future__ import annotations

from flashinfer_sm120.core.facts import arch as _arch
from flashinfer_sm120.core.toolkit.model import RejectKind
from flashinfer_sm120.core.patch.resolve import Resolution, TargetsFrom
from flashinfer_sm120.core.patch.state import STATE, Mode, StepStatus
from flashinfer_sm120.core.patch.steps import workspace_tag

__all__ = ["render", "summary", "targets_origin", "describe", "targets_from_text"]


def _skipped() -> str:
    skipped = [f"{k} ({v.why})" for k, v in STATE.steps.items() if v.status is StepStatus.SKIPPED]
    return f"; steps skipped: {', '.join(skipped)}" if skipped else ""


def describe(res: Resolution, targets_from: str | None = None) -> str:
    """The summary's body: toolkit, view, targets, GPU source, what FlashInfer alone would use
    (``targets_from``: where the caller's targets came from, e.g. ``from --arch 12.0``)."""
    notes = "".join(f"; {n}" for n in res.cleaned)
    if res.choice is None:
        return (f"FlashInfer {res.release.version}; GPUs from {res.gpu_query.describe()}{notes}; "
                f"{res.error}")
    tk = res.choice.toolkit
    targets = ", ".join(_arch.format_target(t) for t in res.choice.targets) or (
        "none (no GPU visible, no FLASHINFER_CUDA_ARCH_LIST)" if res.arch_list is None
        else f"none (FLASHINFER_CUDA_ARCH_LIST={res.arch_list!r} has no usable entry, no GPU visible)")
    view = f" via view {res.home.path} (adds {', '.join(res.home.added)})" if res.home.is_view else ""
    text = (f"nvcc {tk.nvcc_full} from {tk.root} [{', '.join(tk.sources)}]{view}; "
            f"targets {targets} ({targets_from or targets_from_text(res)}); FlashInfer "
            f"{res.release.version}; JIT workspace .../{workspace_tag()}; "
            f"FlashInfer alone would use CUDA_HOME={res.naive_root}{notes}")
    for r in res.choice.rejected:  # say why the user's own setting lost
        if {"CUDA_HOME", "CUDA_PATH"} & set(r.toolkit.sources) and r.kind is not RejectKind.USABLE:
            given = r.toolkit.given_as or r.toolkit.root
            text += f"; not {given}: {r.reason.removeprefix(given + ': ')}"
    return text


def targets_from_text(res: Resolution) -> str:
    """Where the targets came from, in words: the arch list when it had usable entries, else the GPUs."""
    if res.targets_from is TargetsFrom.ARCH_LIST:
        return f"from FLASHINFER_CUDA_ARCH_LIST={res.arch_list!r}"
    return f"GPUs from {res.gpu_query.describe()}"


def render(mode: Mode, res: Resolution, targets_from: str | None = None) -> str:
    """The one line for ``mode`` (see :func:`summary`)."""
    if mode is Mode.GUARD:
        return (f"guarding FlashInfer: no CUDA toolkit fits, so its first JIT build will "
                f"raise this message: {describe(res, targets_from)}")
    if mode is Mode.NOOP:
        return (f"FlashInfer already resolves correctly ({describe(res, targets_from)}); not patching "
                f"its toolkit or targets, only its JIT workspace and the checks before nvcc{_skipped()}")
    return f"patched FlashInfer: {describe(res, targets_from)}{_skipped()}"


def summary(targets_from: str | None = None) -> str:
    """The summary line of where patching stands; ``targets_from`` names where the targets came
    from when a caller set them (``build --arch`` exports them as ``FLASHINFER_CUDA_ARCH_LIST``)."""
    with STATE.lock:
        if targets_from and STATE.resolution is not None and STATE.mode in (Mode.PATCHED, Mode.NOOP, Mode.GUARD):
            return render(STATE.mode, STATE.resolution, targets_from)
        return STATE.summary


def targets_origin(given: str | None = None) -> str | None:
    """``given`` (the caller set the targets), else where the chosen targets came from in words,
    else ``None`` (no toolkit chosen)."""
    if given:
        return given
    with STATE.lock:
        res = STATE.resolution
        return targets_from_text(res) if res is not None and res.choice is not None else None
