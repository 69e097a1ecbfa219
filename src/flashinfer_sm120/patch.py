"""Patch FlashInfer so its JIT builds use the chosen toolkit and the right targets.

What is patched (checked against FlashInfer 0.6.7, 0.6.12, 0.6.17, 0.6.18, 0.7.0,
0.7.2.post1 and 0.7.4):

``flashinfer.compilation_context``
    ``CompilationContext._normalize_cuda_arch`` (a staticmethod, called by every
    ``CompilationContext()`` and by ``jit/env.py``) is replaced by
    :func:`flashinfer_sm120.arch.normalize` under the chosen toolkit's version;
    ``CompilationContext.__init__`` is wrapped so ``TARGET_CUDA_ARCHS`` comes from
    NVML or a leniently parsed ``FLASHINFER_CUDA_ARCH_LIST`` (a garbled value logs
    an error instead of breaking ``import flashinfer``).  A new context is built
    for every ninja file (``build_cuda_cflags``), so patching the class is what
    makes each JIT build right.
``flashinfer.jit.cpp_ext``
    ``get_cuda_path`` / ``get_cuda_version`` (``functools.cache``) are wrapped to
    return the chosen ``CUDA_HOME`` and nvcc version, rebound in every loaded
    ``flashinfer.*`` module that imported them by name, and their caches cleared.
``flashinfer.jit.env``
    the JIT workspace dirs (``FLASHINFER_WORKSPACE_DIR``, ``FLASHINFER_JIT_DIR``,
    ``FLASHINFER_GEN_SRC_DIR``), computed at import from the arch set, are
    recomputed.
``flashinfer.jit.core``
    ``current_compilation_context.TARGET_CUDA_ARCHS`` (bound by name in many
    modules) is refilled in place.
``os.environ["CUDA_HOME"]``
    set to the chosen home so child processes (workers, ninja) agree.

Patches are applied through wrapt post-import hooks, so it works whether
FlashInfer is imported before or after this package.  Every step is recorded and
undone as a whole if any step fails, so FlashInfer is never left half-patched.
"""

from __future__ import annotations

import builtins
import logging
import os
import sys
import threading
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import wrapt
from packaging.version import Version

from . import arch as _arch
from .cudahome import CudaHome, linkable_home
from .gpus import GPU, visible_gpus
from .toolkit import Choice, Toolkit, choose, discover, flashinfer_naive_root, torch_cuda_version

logger = logging.getLogger("flashinfer_sm120")

__all__ = ["install", "revert", "status", "resolve", "Resolution", "HOOKED_MODULES"]

#: FlashInfer modules whose import triggers patching, in FlashInfer's import order.
HOOKED_MODULES = (
    "flashinfer.compilation_context",
    "flashinfer.jit.env",
    "flashinfer.jit.cpp_ext",
    "flashinfer.jit.core",
)

#: functools caches that hold toolkit- or arch-derived answers, per module.
_CACHES = {
    "flashinfer.compilation_context": ("_nvcc_supports_sm107", "cutlass_supports_sm107"),
    "flashinfer.jit.cpp_ext": ("get_cuda_path", "get_cuda_version"),
    "flashinfer.jit.env": ("_cuda_architecture_for_device",),
}


@dataclass(frozen=True)
class Resolution:
    """Everything decided before patching.

    Attributes:
        choice: the toolkit choice (see :class:`flashinfer_sm120.toolkit.Choice`).
        home: the ``CUDA_HOME`` handed to FlashInfer (maybe a view).
        gpus: visible GPUs from NVML.
        arch_list: ``FLASHINFER_CUDA_ARCH_LIST`` as read, or ``None``.
        arch_list_error: why it was ignored, or ``None``.
        naive_root: what FlashInfer's own ``get_cuda_path()`` would return.
        explicit_home: ``CUDA_HOME`` (else ``CUDA_PATH``) as the user set it, or ``None``.
    """

    choice: Choice
    home: CudaHome
    gpus: tuple[GPU, ...]
    arch_list: str | None
    arch_list_error: str | None
    naive_root: str | None
    explicit_home: str | None = None

    def to_dict(self) -> dict:
        """JSON-ready form."""
        return {
            "choice": self.choice.to_dict(),
            "cuda_home": self.home.to_dict(),
            "gpus": [
                {"index": g.index, "name": g.name, "uuid": g.uuid,
                 "capability": f"{g.capability[0]}.{g.capability[1]}"}
                for g in self.gpus
            ],
            "arch_list": self.arch_list,
            "arch_list_error": self.arch_list_error,
            "flashinfer_naive_cuda_home": self.naive_root,
            "explicit_cuda_home": self.explicit_home,
        }


def _arch_specs(value: str | None) -> tuple[list[_arch.ArchSpec] | None, str | None]:
    """Parse ``FLASHINFER_CUDA_ARCH_LIST`` leniently: ``(specs or None, message)``.

    Bad entries are dropped (the message names each one); when no entry is
    usable, ``None`` is returned so the visible GPUs are targeted instead.
    """
    if value is None:
        return None, None
    specs, errors = _arch.parse_arch_list_lenient(value)
    if not errors:
        return specs, None
    if specs:
        kept = " ".join(f"{s.major}.{s.minor}{s.suffix or ''}" for s in specs)
        return specs, " ".join(errors) + f" Ignoring the bad entries; using {kept}."
    return None, " ".join(errors) + " No usable entry: targeting the GPUs present."


def resolve(env: dict[str, str] | None = None, *,
            toolkits: Sequence[Toolkit] | None = None) -> Resolution:
    """Find the GPUs, parse the arch list, choose a toolkit and a linkable home.

    Pure with respect to FlashInfer: nothing is patched.

    Args:
        env: environment to read (default ``os.environ``).
        toolkits: candidates to choose from (``doctor`` passes every one, read);
            default :func:`~flashinfer_sm120.toolkit.discover`, read lazily up to
            the chosen one.

    Raises:
        flashinfer_sm120.toolkit.ToolkitError: no toolkit fits (message lists why).
        flashinfer_sm120.cudahome.CudaHomeError: the view could not be built.
        flashinfer_sm120.gpus.GPUQueryError: NVML failed mid-query.
    """
    env = dict(os.environ if env is None else env)
    arch_list = env.get("FLASHINFER_CUDA_ARCH_LIST")
    specs, arch_err = _arch_specs(arch_list)
    gpus = tuple(visible_gpus())
    candidates = discover(env) if toolkits is None else toolkits
    choice = choose(candidates, specs, [g.capability for g in gpus], torch_cuda_version())
    home = linkable_home(choice.toolkit)
    explicit = env.get("CUDA_HOME") or env.get("CUDA_PATH") or None
    return Resolution(choice, home, gpus, arch_list, arch_err, flashinfer_naive_root(env), explicit)


# --------------------------------------------------------------------------- state


@dataclass
class _State:
    lock: threading.RLock = field(default_factory=threading.RLock)
    mode: str = "idle"  # idle | patched | noop | failed | reverted | disabled
    resolution: Resolution | None = None
    error: str | None = None
    undo: list[Callable[[], None]] = field(default_factory=list)
    done_modules: list[str] = field(default_factory=list)
    hooks_registered: bool = False
    logged: set = field(default_factory=set)
    summary: str = ""


_state = _State()


#: Values of a boolean environment variable that mean "off".
FALSE_VALUES = ("", "0", "false", "no", "off")


def env_flag(name: str) -> bool:
    """Whether boolean env var ``name`` is on: anything but unset, empty, ``0``,
    ``false``, ``no`` or ``off`` (case-insensitive)."""
    return os.environ.get(name, "").strip().lower() not in FALSE_VALUES


def _log_once(level: int, msg: str) -> None:
    if msg not in _state.logged:
        _state.logged.add(msg)
        logger.log(level, msg)


def _version() -> Version:
    assert _state.resolution is not None
    return _state.resolution.choice.version


def current_targets() -> set[tuple[int, str]]:
    """Targets for a new ``CompilationContext`` under the chosen toolkit.

    ``FLASHINFER_CUDA_ARCH_LIST`` is re-read on every call (FlashInfer does too);
    explicit suffixes are kept as given; garbled entries are logged once and
    dropped, and with no usable entry the visible GPUs are used instead.
    Capabilities the toolkit cannot build are logged once and left out.
    """
    res = _state.resolution
    if res is None:
        return set()
    version = res.choice.version
    out: set[tuple[int, str]] = set()
    caps: list[tuple[int, int]] = [g.capability for g in res.gpus]
    specs, message = _arch_specs(os.environ.get("FLASHINFER_CUDA_ARCH_LIST"))
    if message:
        _log_once(logging.ERROR, f"flashinfer-sm120: {message}")
    if specs is not None:
        for spec in specs:
            try:
                target = spec.target(version)
            except _arch.ArchNotSupported as exc:
                _log_once(logging.ERROR, f"flashinfer-sm120: {exc}")
                continue
            if not _arch.target_supported(target, version):
                _log_once(logging.WARNING,
                          f"flashinfer-sm120: FLASHINFER_CUDA_ARCH_LIST asks for "
                          f"{_arch.format_target(target)}, which nvcc {version} cannot build")
            out.add(target)
        return out
    for major, minor in caps:
        try:
            out.add(_arch.normalize(major, minor, version))
        except _arch.ArchNotSupported as exc:
            _log_once(logging.ERROR, f"flashinfer-sm120: {exc}")
    return out


# --------------------------------------------------------------------------- wrappers


def _normalize_wrapper(wrapped, instance, args, kwargs):
    if _state.mode != "patched":
        return wrapped(*args, **kwargs)
    return _normalize_under_choice(*args, **kwargs)


def _normalize_under_choice(major: int, minor: int) -> tuple[int, str]:
    """FlashInfer's ``_normalize_cuda_arch(major, minor)`` signature, our table."""
    return _arch.normalize(int(major), int(minor), _version())


def _init_wrapper(wrapped, instance, args, kwargs):
    if _state.mode != "patched":
        return wrapped(*args, **kwargs)
    try:
        wrapped(*args, **kwargs)
    except Exception as exc:  # e.g. FlashInfer's own parser on a garbled arch list
        logger.debug("FlashInfer's CompilationContext.__init__ raised %r; using our targets", exc)
    instance.TARGET_CUDA_ARCHS = current_targets()


def _cuda_path_wrapper(wrapped, instance, args, kwargs):
    if _state.mode != "patched":
        return wrapped(*args, **kwargs)
    return _state.resolution.home.path


def _cuda_version_wrapper(wrapped, instance, args, kwargs):
    if _state.mode != "patched":
        return wrapped(*args, **kwargs)
    return Version(str(_version()))


# --------------------------------------------------------------------------- patch steps


def _set_attr(obj: Any, name: str, value: Any) -> None:
    """setattr, recording how to undo it (restores the exact previous binding)."""
    had = name in vars(obj)
    old = vars(obj).get(name)
    setattr(obj, name, value)

    def undo() -> None:
        if had:
            setattr(obj, name, old)
        else:
            try:
                delattr(obj, name)
            except AttributeError:
                pass

    _state.undo.append(undo)


def _rebind(original: Any, replacement: Any) -> int:
    """Point every loaded ``flashinfer`` module's name for ``original`` at
    ``replacement`` (modules that did ``from .cpp_ext import get_cuda_version``)."""
    n = 0
    for mod_name, mod in list(sys.modules.items()):
        if mod is None or not (mod_name == "flashinfer" or mod_name.startswith("flashinfer.")):
            continue
        for attr, val in list(vars(mod).items()):
            if val is original:
                _set_attr(mod, attr, replacement)
                n += 1
    return n


def _probe_original_normalizer(func: Callable, version: Version) -> Callable:
    """A copy of FlashInfer's own ``_normalize_cuda_arch`` that sees ``version``.

    FlashInfer's normaliser does ``from flashinfer.jit.cpp_ext import
    is_cuda_version_at_least`` at call time.  The copy gets builtins whose
    ``__import__`` answers that one import with a stand-in bound to ``version``,
    so we can ask what this FlashInfer release would pick without importing
    ``cpp_ext`` or running nvcc, and without touching global state.
    """
    stub = types.ModuleType("flashinfer.jit.cpp_ext")
    stub.is_cuda_version_at_least = lambda v: version >= Version(str(v))  # type: ignore[attr-defined]
    stub.get_cuda_version = lambda: version  # type: ignore[attr-defined]
    real_import = builtins.__import__

    def fake_import(name, globals=None, locals=None, fromlist=(), level=0):
        if name.endswith("cpp_ext") and ("is_cuda_version_at_least" in (fromlist or ())
                                         or "get_cuda_version" in (fromlist or ())):
            return stub
        return real_import(name, globals, locals, fromlist, level)

    fake_builtins = dict(vars(builtins))
    fake_builtins["__import__"] = fake_import
    glb = dict(func.__globals__)
    glb["__builtins__"] = fake_builtins
    return types.FunctionType(func.__code__, glb, func.__name__, func.__defaults__, func.__closure__)


def _flashinfer_would_target(cls: type, res: Resolution) -> set | None:
    """Targets this FlashInfer release computes itself with the chosen toolkit."""
    raw = vars(cls).get("_normalize_cuda_arch")
    func = getattr(raw, "__func__", raw)
    if not isinstance(func, types.FunctionType):
        return None
    probe = _probe_original_normalizer(func, res.choice.version)
    out = set()
    try:
        if res.arch_list is not None:
            for spec in _arch.parse_arch_list(res.arch_list):
                out.add((spec.major, f"{spec.minor}{spec.suffix}") if spec.suffix
                        else probe(spec.major, spec.minor))
        else:
            for g in res.gpus:
                out.add(probe(*g.capability))
    except Exception:
        return None
    return out


def _already_correct(cls: type, res: Resolution) -> bool:
    if res.arch_list_error or res.naive_root is None:
        return False
    if os.path.realpath(res.naive_root) != os.path.realpath(res.home.path):
        return False
    return _flashinfer_would_target(cls, res) == set(res.choice.targets)


def _patch_compilation_context(mod: types.ModuleType) -> None:
    cls = mod.CompilationContext
    raw = vars(cls)["_normalize_cuda_arch"]
    func = getattr(raw, "__func__", raw)
    _set_attr(cls, "_normalize_cuda_arch", staticmethod(wrapt.FunctionWrapper(func, _normalize_wrapper)))
    _set_attr(cls, "__init__", wrapt.FunctionWrapper(vars(cls)["__init__"], _init_wrapper))


def _patch_cpp_ext(mod: types.ModuleType) -> None:
    for name, wrapper in (("get_cuda_path", _cuda_path_wrapper), ("get_cuda_version", _cuda_version_wrapper)):
        original = getattr(mod, name)
        if isinstance(original, wrapt.FunctionWrapper):
            continue
        replacement = wrapt.FunctionWrapper(original, wrapper)
        _rebind(original, replacement)


def _patch_env_var(home: str) -> None:
    """Export the toolkit to the process (CUDA_HOME, PATH, torch, Triton): environ.py."""
    from . import environ

    targets = _state.resolution.choice.targets if _state.resolution else ()
    _state.undo.append(environ.export(home, os.path.join(home, "bin", "nvcc"), targets))


_STEPS: dict[str, Callable[[types.ModuleType], None]] = {
    "flashinfer.compilation_context": _patch_compilation_context,
    "flashinfer.jit.cpp_ext": _patch_cpp_ext,
}


def _clear_caches() -> None:
    for mod_name, names in _CACHES.items():
        mod = sys.modules.get(mod_name)
        for name in names:
            clear = getattr(getattr(mod, name, None), "cache_clear", None)
            if clear is not None:
                clear()


def _refresh_derived() -> None:
    """Recompute what FlashInfer derived at import from the (now current) class
    and toolkit: caches, ``current_compilation_context.TARGET_CUDA_ARCHS`` (in
    place) and the JIT workspace dirs.  Used after patching and after reverting."""
    _clear_caches()
    cc_mod = sys.modules.get("flashinfer.compilation_context")
    core = sys.modules.get("flashinfer.jit.core")
    env = sys.modules.get("flashinfer.jit.env")
    if cc_mod is not None and core is not None and hasattr(core, "current_compilation_context"):
        try:
            fresh = cc_mod.CompilationContext().TARGET_CUDA_ARCHS
        except Exception as exc:
            logger.warning("flashinfer-sm120: CompilationContext() failed: %s", exc)
            fresh = set()
        ctx = core.current_compilation_context
        if not isinstance(ctx.TARGET_CUDA_ARCHS, set):
            ctx.TARGET_CUDA_ARCHS = set()
        ctx.TARGET_CUDA_ARCHS.clear()
        ctx.TARGET_CUDA_ARCHS.update(fresh)
    if env is not None and hasattr(env, "_get_workspace_dir_name"):
        ws = env._get_workspace_dir_name()
        if ws != getattr(env, "FLASHINFER_WORKSPACE_DIR", None):
            env.FLASHINFER_WORKSPACE_DIR = ws
            env.FLASHINFER_JIT_DIR = ws / "cached_ops"
            env.FLASHINFER_GEN_SRC_DIR = ws / "generated"
        try:
            os.makedirs(ws, exist_ok=True)  # as flashinfer/jit/core.py does at import
        except OSError:
            pass


def _rollback() -> None:
    while _state.undo:
        undo = _state.undo.pop()
        try:
            undo()
        except Exception as exc:  # pragma: no cover - undo of a setattr
            logger.error("flashinfer-sm120: undo step failed: %r", exc)
    _state.done_modules.clear()
    try:
        _refresh_derived()
    except Exception as exc:  # pragma: no cover
        logger.error("flashinfer-sm120: refreshing FlashInfer after revert failed: %r", exc)


def _describe(res: Resolution) -> str:
    tk = res.choice.toolkit
    targets = ", ".join(_arch.format_target(t) for t in res.choice.targets) or (
        "none (no GPU visible, no FLASHINFER_CUDA_ARCH_LIST)" if res.arch_list is None
        else f"none (FLASHINFER_CUDA_ARCH_LIST={res.arch_list!r} has no usable entry, no GPU visible)")
    view = f" via view {res.home.path} (adds {', '.join(res.home.added)})" if res.home.is_view else ""
    text = (f"nvcc {tk.nvcc_full} from {tk.root} [{', '.join(tk.sources)}]{view}; "
            f"targets {targets}; FlashInfer alone would use CUDA_HOME={res.naive_root}")
    for rejected, why in res.choice.rejected:  # say why the user's own setting lost
        if {"CUDA_HOME", "CUDA_PATH"} & set(rejected.sources) and not why.startswith(("not needed", "usable")):
            text += f"; not {rejected.given_as or rejected.root}: {why}"
    return text


def _on_import(module: types.ModuleType) -> None:
    """Post-import hook body: never raises into the importer."""
    try:
        with _state.lock:
            _apply_locked()
    except Exception as exc:  # pragma: no cover - _apply_locked already guards
        logger.error("flashinfer-sm120: internal error, FlashInfer left unpatched: %r", exc)


def _apply_locked() -> None:
    if _state.mode in ("failed", "reverted", "noop", "disabled"):
        return
    if _state.resolution is None:
        try:
            _state.resolution = resolve()
        except Exception as exc:
            _state.mode = "failed"
            _state.error = str(exc)
            logger.warning("flashinfer-sm120: not patching FlashInfer: %s", exc)
            return
        res = _state.resolution
        if res.arch_list_error:
            _log_once(logging.ERROR, f"flashinfer-sm120: {res.arch_list_error}")
    res = _state.resolution
    pending = [m for m in HOOKED_MODULES if m in sys.modules and m not in _state.done_modules]
    if not pending:
        return
    cc_mod = sys.modules.get("flashinfer.compilation_context")
    if _state.mode == "idle" and cc_mod is not None and _already_correct(cc_mod.CompilationContext, res):
        _state.mode = "noop"
        _state.summary = f"FlashInfer already resolves correctly ({_describe(res)}); not patching"
        logger.info("flashinfer-sm120: %s", _state.summary)
        return
    first = _state.mode == "idle"
    try:
        _state.mode = "patched"
        for name in pending:
            step = _STEPS.get(name)
            if step is not None:
                step(sys.modules[name])
            _state.done_modules.append(name)
        _refresh_derived()
        if first:  # after the FlashInfer steps succeeded (interface of environ.export)
            _patch_env_var(res.home.path)
    except Exception as exc:
        _state.mode = "failed"
        _state.error = f"patching {pending} failed: {exc!r}"
        _rollback()
        logger.error("flashinfer-sm120: %s; every change was undone and FlashInfer is "
                     "unpatched. Please report this with 'flashinfer-sm120 doctor --json'.",
                     _state.error)
        return
    if first:
        _state.summary = f"patched FlashInfer: {_describe(res)}"
        # Changing the toolkit FlashInfer would have used is worth one visible line.
        changed = res.naive_root != res.home.path
        quiet = env_flag("FLASHINFER_SM120_QUIET")
        level = logging.WARNING if changed and not quiet else logging.INFO
        logger.log(level, "flashinfer-sm120: %s", _state.summary)


# --------------------------------------------------------------------------- public API


def install() -> dict:
    """Register the post-import hooks and patch whatever FlashInfer is loaded.

    Idempotent and thread-safe.  After a failure (say, no usable toolkit), an
    explicit call resolves again, so installing a toolkit and calling
    ``install()`` is enough; import hooks never retry on their own.  Never raises: failures are logged and reported
    by :func:`status`.  Set ``FLASHINFER_SM120_DISABLE=1`` to make it do nothing.

    Returns:
        :func:`status` after the call.
    """
    with _state.lock:
        if env_flag("FLASHINFER_SM120_DISABLE"):
            if _state.mode == "idle":
                _state.mode = "disabled"
            return status()
        if _state.mode in ("reverted", "disabled", "failed"):  # an explicit call retries
            _state.mode = "idle"
            _state.resolution = None
            _state.error = None
        if not _state.hooks_registered:
            for name in HOOKED_MODULES:
                wrapt.register_post_import_hook(_on_import, name)
            _state.hooks_registered = True
        if any(m in sys.modules for m in HOOKED_MODULES):
            _apply_locked()
        return status()


def revert() -> dict:
    """Undo every patch, restore ``CUDA_HOME``, and recompute FlashInfer's derived
    state with its own logic.  Later imports stay unpatched until :func:`install`.

    Returns:
        :func:`status` after the call.
    """
    with _state.lock:
        if _state.mode == "patched":
            _rollback()
        try:  # an export made before patching (autoload of vllm/sglang, worker_setup) goes too
            from . import environ

            environ.reset()
        except Exception as exc:  # pragma: no cover
            logger.error("flashinfer-sm120: undoing the toolkit export failed: %r", exc)
        _state.mode = "reverted"
        _state.resolution = None
        _state.summary = "reverted: FlashInfer runs with its own toolkit and arch logic"
        return status()


def status() -> dict:
    """Where patching stands.

    Returns:
        ``{"mode": str, "error": str|None, "summary": str, "patched_modules": [...],
        "resolution": dict|None, "target_cuda_archs": [...]|None}`` where mode is
        one of ``idle`` (FlashInfer not imported yet), ``patched``, ``noop``
        (FlashInfer already right), ``failed``, ``reverted``, ``disabled``.
    """
    core = sys.modules.get("flashinfer.jit.core")
    ctx = getattr(core, "current_compilation_context", None)
    archs = sorted(ctx.TARGET_CUDA_ARCHS) if ctx is not None else None
    return {
        "mode": _state.mode,
        "error": _state.error,
        "summary": _state.summary,
        "patched_modules": list(_state.done_modules),
        "resolution": _state.resolution.to_dict() if _state.resolution else None,
        "target_cuda_archs": [_arch.format_target(t) for t in archs] if archs is not None else None,
    }
