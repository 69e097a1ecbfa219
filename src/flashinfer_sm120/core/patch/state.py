"""The patch state machine and its undo log, in one place.

States (:class:`Mode`)::

    idle ──FlashInfer imported──> patched   a toolkit fits: FlashInfer uses it
                              ├─> guard     no toolkit fits: JIT builds raise our message
                              ├─> noop      FlashInfer alone is already right
                              └─> failed    a patch step raised, or the release is
                                            unsupported: every change undone
    any ──revert()──> reverted;  FLASHINFER_SM120_DISABLE ──> disabled
    reverted/failed/disabled ──install()──> idle (resolve again)

Every change made to FlashInfer or the process goes through :class:`UndoLog`, so
``revert()`` and a failed step restore the exact previous bindings.
"""

from __future__ import annotations

import enum
import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, TypedDict

logger = logging.getLogger("flashinfer_sm120")

__all__ = ["Mode", "StepStatus", "StepResult", "UndoLog", "State", "STATE", "StatusDict"]


class StatusDict(TypedDict):
    """What :func:`flashinfer_sm120.status` returns."""

    mode: str  # a Mode value
    error: str | None  # why failed or guard
    summary: str  # the one line logged when FlashInfer was patched
    patched_modules: list[str]
    steps: dict[str, str]  # StepResult.to_json() per step
    resolution: dict | None  # Resolution.to_dict()
    target_cuda_archs: list[str] | None  # FlashInfer's TARGET_CUDA_ARCHS ("sm_120f"), None before it loads
    exported: dict[str, str]  # the variables exported to this process and its children


class Mode(str, enum.Enum):
    """Where patching stands (the value is what :func:`status` reports)."""

    IDLE = "idle"
    PATCHED = "patched"
    GUARD = "guard"
    NOOP = "noop"
    FAILED = "failed"
    REVERTED = "reverted"
    DISABLED = "disabled"

    def __str__(self) -> str:  # "patched", not "Mode.PATCHED"
        return self.value

    @property
    def active(self) -> bool:
        """Whether our wrappers act (else they call FlashInfer's originals)."""
        return self in (Mode.PATCHED, Mode.GUARD, Mode.NOOP)


class StepStatus(str, enum.Enum):
    """What one patch step did (the value starts what :func:`status` reports for it)."""

    APPLIED = "applied"
    NOT_NEEDED = "not needed"
    SKIPPED = "skipped"


@dataclass(frozen=True)
class StepResult:
    """One step's outcome: its :class:`StepStatus` and, unless applied, why."""

    status: StepStatus
    why: str | None = None

    def to_json(self) -> str:
        """``applied``, ``not needed: <why>`` or ``skipped: <why>`` (the ``status()["steps"]`` values)."""
        return self.status.value if self.why is None else f"{self.status.value}: {self.why}"


class UndoLog:
    """Changes in the order made, each with the callable that undoes it."""

    def __init__(self) -> None:
        self._undo: list[tuple[str, Callable[[], None]]] = []

    def add(self, what: str, undo: Callable[[], None]) -> None:
        """Record ``undo`` (no arguments, must not raise) for change ``what``."""
        self._undo.append((what, undo))

    def set_attr(self, obj: Any, name: str, value: Any) -> None:
        """``setattr(obj, name, value)``, recording how to restore the exact previous binding."""
        d = vars(obj)
        had = name in d
        old = d.get(name)
        setattr(obj, name, value)

        def undo() -> None:
            if had:
                setattr(obj, name, old)
            else:
                try:
                    delattr(obj, name)
                except AttributeError:
                    pass

        self.add(f"{getattr(obj, '__name__', obj)}.{name}", undo)

    def rollback(self) -> list[str]:
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
    resolution: Any = None  # a core.patch.resolve.Resolution
    error: str | None = None
    undo: UndoLog = field(default_factory=UndoLog)
    steps: dict[str, StepResult] = field(default_factory=dict)
    patched_modules: dict[str, Any] = field(default_factory=dict)  # by name: to notice a failed import
    hooks_registered: bool = False
    exported: bool = False
    logged: set = field(default_factory=set)
    summary: str = ""
    inputs: dict | None = None  # what the resolution read (laststatus.inputs), taken before it

    def log_once(self, level: int, msg: str) -> None:
        """Log ``msg`` once per process."""
        if msg not in self.logged:
            self.logged.add(msg)
            logger.log(level, msg)

    def reset(self, mode: Mode) -> None:
        """Forget the resolution and the steps; switch to ``mode`` (the undo log must be empty)."""
        self.mode = mode
        self.resolution = None
        self.error = None
        self.steps = {}
        self.patched_modules = {}
        self.exported = False
        self.inputs = None


#: The one state of this process.
STATE = State()
