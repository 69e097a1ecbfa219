"""What is patched in each FlashInfer module, per mode (:data:`STEPS`; per release: ``facts.releases``).  A
required step that cannot be applied (a renamed attribute) fails the whole patch; an optional one is skipped."""

from __future__ import annotations

import collections
import logging
import os
import sys
import types

import wrapt
from packaging.version import Version

from flashinfer_sm120.core.facts import arch as _arch
from flashinfer_sm120.core.facts.workspace import tag_for
from flashinfer_sm120.core.patch.state import STATE, Mode, arch_specs

logger = logging.getLogger("flashinfer_sm120")

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


#: ``apply(module)`` returns ``None`` when applied, or why this release needs nothing; raises on failure.
Step = collections.namedtuple("Step", "name apply modes required", defaults=(True,))


def _version() -> Version:
    return STATE.resolution.choice.version


def current_targets() -> set[tuple[int, str]]:
    """Targets for a new ``CompilationContext``: the arch list re-read as FlashInfer does, else the GPUs."""
    res = STATE.resolution
    if res is None or res.choice is None:
        return set()
    version = res.choice.version
    specs, message = arch_specs(os.environ.get("FLASHINFER_CUDA_ARCH_LIST"))
    if message:
        STATE.log_once(logging.ERROR, f"flashinfer-sm120: {message}")
    if specs is not None:
        wanted = [lambda s=s: s.target(version) for s in specs]
    else:
        wanted = [lambda c=c: _arch.normalize(*c, version) for c in dict.fromkeys(g.capability for g in res.gpus)]
    out: set[tuple[int, str]] = set()
    for target in wanted:
        try:
            out.add(target())
        except _arch.ArchNotSupported as exc:
            STATE.log_once(logging.ERROR, f"flashinfer-sm120: {exc}")
    return out


def _normalize_wrapper(wrapped, instance, args, kwargs):
    if STATE.mode is not Mode.PATCHED:
        return wrapped(*args, **kwargs)
    major, minor = (list(args) + [kwargs.get("major"), kwargs.get("minor")])[:2]
    return _arch.normalize(int(major), int(minor), _version())


def _init_wrapper(wrapped, instance, args, kwargs):
    if STATE.mode is not Mode.PATCHED:
        return wrapped(*args, **kwargs)
    try:
        wrapped(*args, **kwargs)
    except Exception as exc:  # e.g. FlashInfer's own parser on a garbled arch list
        logger.debug("FlashInfer's CompilationContext.__init__ raised %r; using our targets", exc)
    instance.TARGET_CUDA_ARCHS = current_targets()


def _cuda_path_wrapper(wrapped, instance, args, kwargs):
    if STATE.mode is not Mode.PATCHED:
        return wrapped(*args, **kwargs)
    return STATE.resolution.home.path


def _cuda_version_wrapper(wrapped, instance, args, kwargs):
    if STATE.mode is Mode.PATCHED:
        return Version(str(_version()))
    if STATE.mode not in (Mode.GUARD, Mode.NOOP, Mode.FAILED):
        return wrapped(*args, **kwargs)
    from flashinfer.jit import cpp_ext

    from flashinfer_sm120.core.toolkit.probe import flashinfer_cuda_version

    return flashinfer_cuda_version(cpp_ext.get_cuda_path())  # FlashInfer's answer, with a deadline


def _workspace_wrapper(wrapped, instance, args, kwargs):
    path = wrapped(*args, **kwargs)
    if STATE.mode in (Mode.PATCHED, Mode.NOOP) and STATE.resolution is not None \
            and STATE.resolution.choice is not None:
        return path / tag_for(STATE.resolution.choice.toolkit)  # two toolkits never share a JIT dir
    return path


def _nvcc_gate(wrapped, instance, args, kwargs):
    from flashinfer_sm120.core.patch.gate import nvcc_gate  # loaded by the first JIT build, not at import

    return nvcc_gate(wrapped, args, kwargs, current_targets)


def _arch_check(wrapped, instance, args, kwargs):
    from flashinfer_sm120.core.patch.gate import arch_check

    return arch_check(wrapped, args, kwargs)


def _rebind(original, replacement) -> None:
    """Point every ``flashinfer`` module's name for ``original`` (``from .cpp_ext import ...``) at ``replacement``."""
    for mod_name, mod in list(sys.modules.items()):
        if mod is not None and (mod_name == "flashinfer" or mod_name.startswith("flashinfer.")):
            for attr, val in list(vars(mod).items()):
                if val is original:
                    STATE.undo.set_attr(mod, attr, replacement)


def _wrap_function(mod: types.ModuleType, name: str, wrapper) -> None:
    original = getattr(mod, name)  # AttributeError: a required step fails
    if isinstance(original, wrapt.FunctionWrapper) and getattr(original, "_self_wrapper", None) is wrapper:
        return
    wrapped = wrapt.FunctionWrapper(original, wrapper)
    STATE.undo.set_attr(mod, name, wrapped)
    _rebind(original, wrapped)


def _wraps(*pairs):
    """A step that wraps module functions: ``(name, wrapper)`` each."""
    def apply(mod):
        for name, wrapper in pairs:
            _wrap_function(mod, name, wrapper)
    return apply


def _guard(wrapper):
    """A step that wraps the module's JIT entry points named in the release's ``guard_points``."""
    def apply(mod):
        release = STATE.resolution.release
        names = [attr for m, attr in release.guard_points if m == mod.__name__]
        if not names:
            return f"FlashInfer {release.version} lists no guard point in {mod.__name__}"
        for name in names:
            _wrap_function(mod, name, wrapper)
        return None
    return apply


def _step_normalize(mod):
    if not STATE.resolution.release.has_normalizer:
        return f"FlashInfer {STATE.resolution.release.version} has no _normalize_cuda_arch (era inline-a)"
    cls = mod.CompilationContext
    raw = vars(cls)["_normalize_cuda_arch"]
    func = getattr(raw, "__func__", raw)
    STATE.undo.set_attr(cls, "_normalize_cuda_arch", staticmethod(wrapt.FunctionWrapper(func, _normalize_wrapper)))
    return None


def _step_init(mod):
    cls = mod.CompilationContext
    STATE.undo.set_attr(cls, "__init__", wrapt.FunctionWrapper(vars(cls)["__init__"], _init_wrapper))


def bound_cuda_version(mod) -> None:
    """FlashInfer's ``get_cuda_version`` with a deadline (P6), the one wrapper kept in a ``failed`` process."""
    _wrap_function(mod, "get_cuda_version", _cuda_version_wrapper)


def _step_current_context(mod):
    ctx = mod.current_compilation_context  # AttributeError: renamed -> the patch fails
    if not hasattr(ctx, "TARGET_CUDA_ARCHS"):
        raise AttributeError("current_compilation_context has no TARGET_CUDA_ARCHS")


_P = frozenset({Mode.PATCHED})
_PN = frozenset({Mode.PATCHED, Mode.NOOP})
_ALL = frozenset({Mode.PATCHED, Mode.GUARD, Mode.NOOP})

#: Steps per hooked module, in order.
STEPS: dict[str, list[Step]] = {
    "flashinfer.compilation_context": [
        Step("normalize", _step_normalize, _P),  # _normalize_cuda_arch: our table (releases 0.5.0+)
        Step("init", _step_init, _P)],  # __init__ sets TARGET_CUDA_ARCHS from our targets
    "flashinfer.jit.env": [  # a per-toolkit last component of the JIT workspace
        Step("workspace", _wraps(("_get_workspace_dir_name", _workspace_wrapper)), _PN, required=False)],
    "flashinfer.jit.cpp_ext": [
        Step("toolkit", _wraps(("get_cuda_path", _cuda_path_wrapper), ("get_cuda_version", _cuda_version_wrapper)),
             _ALL),
        Step("nvcc_gate", _guard(_nvcc_gate), _ALL)],  # refuse what nvcc cannot build (guard: every build)
    "flashinfer.jit.core": [
        Step("current_context", _step_current_context, _P),  # current_compilation_context refilled in place
        Step("arch_check", _guard(_arch_check), _ALL)],  # check_cuda_arch raises our message, not "sm75"
}


def refresh_derived() -> None:
    """Recompute what FlashInfer derived at import (caches, ``TARGET_CUDA_ARCHS``, the JIT workspace dirs)."""
    for mod_name, names in _CACHES.items():
        for name in names:
            clear = getattr(getattr(sys.modules.get(mod_name), name, None), "cache_clear", None)
            if clear is not None:
                clear()
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
        if not isinstance(getattr(ctx, "TARGET_CUDA_ARCHS", None), set):
            ctx.TARGET_CUDA_ARCHS = set()
        ctx.TARGET_CUDA_ARCHS.clear()
        ctx.TARGET_CUDA_ARCHS.update(fresh)
    if env is not None and hasattr(env, "_get_workspace_dir_name"):
        ws = env._get_workspace_dir_name()
        # P2, P4: made before jit/core.py's os.makedirs would (umask 000: 0777); a listing's, or one we may not make
        # (another uid's tree: sudo -E), private: FlashInfer's import makes it and its log
        private = STATE.listing or not _make_workspace(str(ws))
        made = type(ws)(STATE.listing_dir()) if private else ws
        if (made, ws / "cached_ops") != (getattr(env, "FLASHINFER_WORKSPACE_DIR", None),
                                         getattr(env, "FLASHINFER_JIT_DIR", None)):
            env.FLASHINFER_WORKSPACE_DIR = made
            env.FLASHINFER_JIT_DIR = ws / "cached_ops"
            env.FLASHINFER_GEN_SRC_DIR = ws / "generated"


def _make_workspace(ws: str) -> bool:
    """Create a JIT workspace, no level writable by others whatever the umask; ``False``: not, as it would be in
    another uid's tree or below a level that fails the trust rule (P2, P4)."""
    from flashinfer_sm120.safety.fs.places import make_private_dirs
    from flashinfer_sm120.safety.ownership import trust_reason

    if trust_reason(ws) is not None:  # its deepest existing level another uid's (sudo -E) fails it too
        return False
    try:
        make_private_dirs(ws, 0o755)
    except OSError:  # FlashInfer's own makedirs fails the same way, and its import says why
        pass
    return True
