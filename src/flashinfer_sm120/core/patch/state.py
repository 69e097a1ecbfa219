"""The patch state of the process (:data:`STATE`: mode, :class:`Resolution`, undo log) and its one summary line.
Modes: idle -> patched | guard | noop | failed at FlashInfer's import; reverted; disabled."""

from __future__ import annotations

import enum
import importlib.metadata
import logging
import sys
import threading
from dataclasses import asdict, dataclass, field
from typing import Any

from flashinfer_sm120.core.facts import arch as _arch
from flashinfer_sm120.core.facts.arch import ArchSpec, parse_arch_list_lenient
from flashinfer_sm120.core.facts.releases import ReleaseInfo
from flashinfer_sm120.core.facts.workspace import tag_for
from flashinfer_sm120.core.jitenv.environ import UndoLog
from flashinfer_sm120.core.toolkit.model import GPU, Choice, CudaHome, GPUQuery, Rejection, RejectKind, Setting, Toolkit

logger = logging.getLogger("flashinfer_sm120")


class Mode(str, enum.Enum):
    """Where patching stands (the value is what :func:`status` reports)."""

    IDLE = "idle"
    PATCHED = "patched"
    GUARD = "guard"
    NOOP = "noop"
    FAILED = "failed"
    REVERTED = "reverted"
    DISABLED = "disabled"

    @property
    def active(self) -> bool:
        """Whether our wrappers act (else they call FlashInfer's originals)."""
        return self in (Mode.PATCHED, Mode.GUARD, Mode.NOOP)


@dataclass
class State:
    """Process-wide patch state (one instance, :data:`STATE`), guarded by ``lock``."""

    lock: threading.RLock = field(default_factory=threading.RLock)
    mode: Mode = Mode.IDLE
    resolution: Any = None  # a Resolution
    error: str | None = None
    undo: UndoLog = field(default_factory=UndoLog)
    steps: dict[str, str] = field(default_factory=dict)  # "applied", "not needed: why" or "skipped: why"
    patched_modules: dict[str, Any] = field(default_factory=dict)  # by name: to notice a failed import
    hooks_registered: bool = False
    exported: bool = False
    logged: set = field(default_factory=set)
    summary: str = ""
    inputs: dict | None = None  # what the resolution read (laststatus.inputs), taken before it
    resolved: bool = False  # a resolution was made in this process: install() after revert() resolves afresh
    recorded_export: dict | None = None  # the export decisions replayed with the resolution (laststatus.replay)
    listing: bool = False  # this command only lists: FlashInfer's workspace in listing_dir() (P4)
    _listing_dir: str | None = None

    def log_once(self, level: int, msg: str) -> None:
        if msg not in self.logged:
            self.logged.add(msg)
            logger.log(level, msg)

    def listing_dir(self) -> str:
        """The private directory a listing's FlashInfer makes its workspace in: made at first use, removed at exit."""
        if self._listing_dir is None:  # held while in use; a killed process's is swept by the next (P3)
            import atexit

            from flashinfer_sm120.safety.fs.atomic import make_private

            private = make_private("flashinfer-sm120-list-")
            atexit.register(private.close)
            self._listing_dir = private.path
        return self._listing_dir

    def reset(self, mode: Mode) -> None:
        """Forget the resolution and the steps; switch to ``mode`` (the undo log must be empty)."""
        self.mode, self.resolution, self.error, self.inputs, self.recorded_export = mode, None, None, None, None
        self.steps, self.patched_modules, self.exported = {}, {}, False


STATE = State()


@dataclass(frozen=True)
class Resolution:
    """Everything decided before patching."""

    choice: Choice | None  # None: no toolkit fits (guard)
    home: Any  # the CUDA_HOME handed to FlashInfer (a core.view.CudaHome), or None
    gpus: tuple[GPU, ...]
    arch_list: str | None  # FLASHINFER_CUDA_ARCH_LIST, cut to ARCH_LIST_SHOWN characters
    arch_list_error: str | None  # why (part of) it was ignored
    naive_root: str | None  # what FlashInfer's own get_cuda_path() would return
    release: ReleaseInfo | None = None
    gpu_query: GPUQuery | None = None
    settings: tuple[Setting, ...] = ()  # the toolkit settings not used as given (decide.refused_settings)
    error: str | None = None  # the ToolkitError message when no toolkit fits
    fix: str | None = None  # its fix line alone
    targets_from: str = "gpus"  # "arch_list": FLASHINFER_CUDA_ARCH_LIST had a usable entry
    own: bool = False  # the chosen nvcc is the one FlashInfer alone runs: nothing to announce
    naive_lacks: tuple[str, ...] = ()  # what FlashInfer's builds need that naive_root lacks (view.meta.lacks)

    @property
    def guard(self) -> bool:
        return self.choice is None

    def to_dict(self) -> dict:  # status()["resolution"], and the record laststatus.replay reads back
        return {
            "choice": self.choice.to_dict() if self.choice else None,
            "cuda_home": self.home.to_dict() if self.home is not None else None,
            "gpus": [
                {"index": g.index, "name": g.name, "uuid": g.uuid,
                 "capability": f"{g.capability[0]}.{g.capability[1]}"}
                for g in self.gpus
            ],
            "gpu_source": self.gpu_query.describe() if self.gpu_query else None,
            "arch_list": self.arch_list,
            "arch_list_error": self.arch_list_error,
            "targets_from": self.targets_from,
            "flashinfer_naive_cuda_home": self.naive_root,
            "release": self.release.to_dict() if self.release else None,
            "settings": [asdict(s) for s in self.settings],
            "error": self.error,
            "fix": self.fix,
            "flashinfer_naive_lacks": list(self.naive_lacks),
        }

    @classmethod
    def from_dict(cls, d: dict, release: ReleaseInfo | None, own: bool) -> Resolution:
        """The resolution :meth:`to_dict` gave; raises on a malformed one (the caller resolves afresh)."""
        c = d["choice"]

        def rejection(r: dict) -> Rejection:
            kind = RejectKind(r["kind"])
            why = r["reason"][len("not chosen ("):-1] if kind is RejectKind.NOT_CHOSEN else r["reason"]
            return Rejection(Toolkit.from_dict(r["toolkit"]), kind, why)

        choice = Choice(Toolkit.from_dict(c["toolkit"]), tuple(_arch_target(t) for t in c["targets"]),
                        tuple(tuple(map(int, cap.split("."))) for cap in c["capabilities"]),
                        tuple(rejection(r) for r in c["rejected"]), c["reason"], c["torch_cuda"])
        gpus = tuple(GPU(g["index"], g["name"], g["uuid"], tuple(map(int, g["capability"].split("."))))
                     for g in d["gpus"])
        source, _, note = d["gpu_source"].partition(" (NVML: ")
        return cls(choice, CudaHome(**dict(d["cuda_home"], added=tuple(d["cuda_home"]["added"]))), gpus,
                   d["arch_list"], d["arch_list_error"], d["flashinfer_naive_cuda_home"], release=release,
                   gpu_query=GPUQuery(gpus, source, note[:-1] or None),
                   targets_from={"arch_list": "arch_list", "gpus": "gpus"}[d["targets_from"]], own=own,
                   settings=tuple(Setting(**s) for s in d["settings"]), naive_lacks=tuple(d["flashinfer_naive_lacks"]))


def _arch_target(text: str) -> tuple[int, str]:
    """``(12, "0f")`` for ``sm_120f`` (:func:`~flashinfer_sm120.core.facts.arch.format_target`'s inverse)."""
    digits = text.removeprefix("sm_").rstrip("abcdefghijklmnopqrstuvwxyz")
    return int(digits[:-1]), text[len("sm_") + len(digits) - 1:]


def arch_specs(value: str | None) -> tuple[list[ArchSpec] | None, str | None]:
    """Parse ``FLASHINFER_CUDA_ARCH_LIST`` leniently: ``(specs, message)``; bad entries are dropped (the
    message names each), and with no usable entry ``specs`` is ``None``: the visible GPUs are targeted."""
    if value is None:
        return None, None
    specs, errors = parse_arch_list_lenient(value)
    if not errors:
        return specs, None
    if specs:
        kept = " ".join(f"{s.major}.{s.minor}{s.suffix or ''}" for s in specs)
        return specs, " ".join(errors) + f" Ignoring the bad entries; using {kept}."
    return None, " ".join(errors) + " No usable entry: targeting the GPUs present."


def flashinfer_version() -> str | None:
    """The FlashInfer release in this process (``flashinfer/version.py``, 0.4.0 - 0.7.4), else the installed
    distribution's version, else ``None``."""

    try:
        ver = importlib.import_module("flashinfer.version").__version__ if "flashinfer" in sys.modules else None
    except Exception:
        ver = None
    if isinstance(ver, str) and not ver.startswith("0.0.0"):
        return ver
    try:
        return importlib.metadata.version("flashinfer-python")
    except Exception:
        return None


#: What to do when nothing can be built (P1: the message names the fix).
NO_TARGETS_FIX = "set e.g. FLASHINFER_CUDA_ARCH_LIST=12.0 (RTX 5090 / RTX PRO 6000) or 12.1 (DGX Spark)"


def describe(res: Resolution, targets_from: str | None = None) -> str:
    """The summary's body: toolkit, view, targets and where from (``targets_from``), what FlashInfer alone would use."""
    notes = "".join(f"; {n}" for n in res.settings)
    if res.choice is None:
        return f"FlashInfer {res.release.version}; GPUs from {res.gpu_query.describe()}{notes}; {res.error}"
    tk = res.choice.toolkit
    targets = ", ".join(_arch.format_target(t) for t in res.choice.targets) or (
        ("none (no GPU visible, no FLASHINFER_CUDA_ARCH_LIST" if res.arch_list is None
         else f"none (FLASHINFER_CUDA_ARCH_LIST={res.arch_list!r} has no usable entry, no GPU visible")
        + f"; Fix: {NO_TARGETS_FIX})")
    view = f" via view {res.home.path} (adds {', '.join(res.home.added)})" if res.home.is_view else ""
    # FlashInfer alone reads CUDA_HOME or CUDA_PATH as set: a refused one names that value already (P8)
    named = any(s.value == res.naive_root for s in res.settings if s.variable in ("CUDA_HOME", "CUDA_PATH"))
    alone = "" if named else f"; FlashInfer alone would use CUDA_HOME={res.naive_root}"
    return (f"nvcc {tk.nvcc_full} from {tk.root} [{', '.join(tk.sources)}]{view}; "
            f"targets {targets} ({targets_from or targets_from_text(res)}); FlashInfer "
            f"{res.release.version}; JIT workspace .../{tag_for(tk)}{alone}{notes}")


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
    skipped = ", ".join(f"{k} ({v[len('skipped: '):]})" for k, v in STATE.steps.items() if v.startswith("skipped: "))
    skipped = f"; steps skipped: {skipped}" if skipped else ""
    if mode is Mode.NOOP:
        return (f"FlashInfer already resolves correctly ({describe(res, targets_from)}); not patching "
                f"its toolkit or targets, only its JIT workspace and the checks before nvcc{skipped}")
    return f"patched FlashInfer: {describe(res, targets_from)}{skipped}"
