"""The patch state of the process (:data:`STATE`: mode, resolution, undo log) and its one summary line.  Modes: idle ->
patched | guard | noop | failed at FlashInfer's import; reverted; disabled; install() after any but patched resolves again."""

from __future__ import annotations

import enum
import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from flashinfer_sm120.core.facts import arch as _arch
from flashinfer_sm120.core.facts.workspace import tag_for
from flashinfer_sm120.core.patch.resolve import Resolution
from flashinfer_sm120.core.toolkit.model import RejectKind

logger = logging.getLogger("flashinfer_sm120")

__all__ = ["Mode", "StepResult", "UndoLog", "State", "STATE", "render",
           "describe", "targets_from_text", "NO_TARGETS_FIX"]


class Mode(str, enum.Enum):
    """Where patching stands (the value is what :func:`status` reports)."""

    IDLE = "idle"
    PATCHED = "patched"
    GUARD = "guard"
    NOOP = "noop"
    FAILED = "failed"
    REVERTED = "reverted"
    DISABLED = "disabled"

    def __str__(self) -> str:
        return self.value

    @property
    def active(self) -> bool:
        """Whether our wrappers act (else they call FlashInfer's originals)."""
        return self in (Mode.PATCHED, Mode.GUARD, Mode.NOOP)


@dataclass(frozen=True)
class StepResult:
    """One step's outcome: ``applied``, ``not needed`` or ``skipped``, and unless applied, why."""

    status: str
    why: str | None = None

    def to_json(self) -> str:
        return self.status if self.why is None else f"{self.status}: {self.why}"


class UndoLog:
    """Changes in the order made, each with the callable (no arguments, never raising) that undoes it."""

    def __init__(self) -> None:
        self._undo: list[tuple[str, Callable[[], None]]] = []

    def add(self, what: str, undo: Callable[[], None]) -> None:
        self._undo.append((what, undo))

    def set_attr(self, obj: Any, name: str, value: Any) -> None:
        """``setattr(obj, name, value)``, recording how to restore the exact previous binding."""
        had, old = name in vars(obj), vars(obj).get(name)
        setattr(obj, name, value)

        def undo() -> None:
            if had:
                setattr(obj, name, old)
            elif name in vars(obj):
                delattr(obj, name)

        self.add(f"{getattr(obj, '__name__', obj)}.{name}", undo)

    def rollback(self) -> None:
        """Undo everything, newest first (a failed undo is logged)."""
        while self._undo:
            what, undo = self._undo.pop()
            try:
                undo()
            except Exception as exc:  # pragma: no cover - undo of a setattr
                logger.error("flashinfer-sm120: undoing %s failed: %r", what, exc)


@dataclass
class State:
    """Process-wide patch state (one instance, :data:`STATE`), guarded by ``lock``."""

    lock: threading.RLock = field(default_factory=threading.RLock)
    mode: Mode = Mode.IDLE
    resolution: Any = None  # a Resolution
    error: str | None = None
    undo: UndoLog = field(default_factory=UndoLog)
    steps: dict[str, StepResult] = field(default_factory=dict)
    patched_modules: dict[str, Any] = field(default_factory=dict)  # by name: to notice a failed import
    hooks_registered: bool = False
    exported: bool = False
    logged: set = field(default_factory=set)
    summary: str = ""
    inputs: dict | None = None  # what the resolution read (laststatus.inputs), taken before it
    resolved: bool = False  # a resolution was made in this process: install() after revert() resolves afresh
    recorded_export: dict | None = None  # the export decisions replayed with the resolution (laststatus.replay)

    def log_once(self, level: int, msg: str) -> None:
        if msg not in self.logged:
            self.logged.add(msg)
            logger.log(level, msg)

    def reset(self, mode: Mode) -> None:
        """Forget the resolution and the steps; switch to ``mode`` (the undo log must be empty)."""
        self.mode, self.resolution, self.error, self.inputs, self.recorded_export = mode, None, None, None, None
        self.steps, self.patched_modules, self.exported = {}, {}, False


STATE = State()

#: What to do when nothing can be built (P1: the message names the fix).
NO_TARGETS_FIX = "set e.g. FLASHINFER_CUDA_ARCH_LIST=12.0 (RTX 5090 / RTX PRO 6000) or 12.1 (DGX Spark)"


def describe(res: Resolution, targets_from: str | None = None) -> str:
    """The summary's body: toolkit, view, targets and where from (``targets_from``), what FlashInfer alone would use."""
    notes = "".join(f"; {n}" for n in res.cleaned)
    if res.choice is None:
        return f"FlashInfer {res.release.version}; GPUs from {res.gpu_query.describe()}{notes}; {res.error}"
    tk = res.choice.toolkit
    targets = ", ".join(_arch.format_target(t) for t in res.choice.targets) or (
        ("none (no GPU visible, no FLASHINFER_CUDA_ARCH_LIST" if res.arch_list is None
         else f"none (FLASHINFER_CUDA_ARCH_LIST={res.arch_list!r} has no usable entry, no GPU visible")
        + f"; Fix: {NO_TARGETS_FIX})")
    view = f" via view {res.home.path} (adds {', '.join(res.home.added)})" if res.home.is_view else ""
    text = (f"nvcc {tk.nvcc_full} from {tk.root} [{', '.join(tk.sources)}]{view}; "
            f"targets {targets} ({targets_from or targets_from_text(res)}); FlashInfer "
            f"{res.release.version}; JIT workspace .../{tag_for(tk)}; "
            f"FlashInfer alone would use CUDA_HOME={res.naive_root}{notes}")
    for r in res.choice.rejected:  # say why the user's own setting lost
        if {"CUDA_HOME", "CUDA_PATH"} & set(r.toolkit.sources) and r.kind is not RejectKind.USABLE:
            given = r.toolkit.given_as or r.toolkit.root
            text += f"; not {given}: {r.reason.removeprefix(given + ': ')}"
    return text


def targets_from_text(res: Resolution) -> str:
    """Where the targets came from, in words: the arch list when it had usable entries, else the GPUs."""
    if res.targets_from == "arch_list":
        return f"from FLASHINFER_CUDA_ARCH_LIST={res.arch_list!r}"
    return f"GPUs from {res.gpu_query.describe()}"


def render(mode: Mode, res: Resolution, targets_from: str | None = None) -> str:
    """The one line for ``mode``: logged once when FlashInfer is patched, and ``build``'s summary."""
    if mode is Mode.GUARD:
        return f"guarding FlashInfer: no CUDA toolkit fits, so its first JIT build will raise this message: " \
               f"{describe(res, targets_from)}"
    skipped = ", ".join(f"{k} ({v.why})" for k, v in STATE.steps.items() if v.status == "skipped")
    skipped = f"; steps skipped: {skipped}" if skipped else ""
    if mode is Mode.NOOP:
        return (f"FlashInfer already resolves correctly ({describe(res, targets_from)}); not patching "
                f"its toolkit or targets, only its JIT workspace and the checks before nvcc{skipped}")
    return f"patched FlashInfer: {describe(res, targets_from)}{skipped}"
