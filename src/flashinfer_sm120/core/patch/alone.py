"""What this FlashInfer release would compute by itself with the chosen toolkit (for ``noop``): its own
``CompilationContext.__init__`` runs on a throw-away subclass, in copies whose globals and imports answer every
way 0.5.0 - 0.7.4 reach ``flashinfer.jit.cpp_ext`` with a stand-in for the chosen nvcc.  Nothing global changes."""

from __future__ import annotations

import builtins
import importlib.util
import logging
import types

from packaging.version import Version

_CPP_EXT = "flashinfer.jit.cpp_ext"
_NAMES = ("is_cuda_version_at_least", "get_cuda_version", "get_cuda_path")


def _stub(version: Version, home: str | None) -> types.ModuleType:
    stub = types.ModuleType(_CPP_EXT)
    stub.is_cuda_version_at_least = lambda v: version >= Version(str(v))  # type: ignore[attr-defined]
    stub.get_cuda_version = lambda: version  # type: ignore[attr-defined]
    stub.get_cuda_path = lambda: home  # type: ignore[attr-defined]
    return stub


def _copy(func: types.FunctionType, stub: types.ModuleType) -> types.FunctionType:
    """``func`` with globals and builtins that answer cpp_ext lookups with ``stub``."""
    real_import = builtins.__import__
    package = func.__globals__.get("__package__") or "flashinfer"
    jit = types.ModuleType("flashinfer.jit")
    jit.cpp_ext = stub  # type: ignore[attr-defined]
    top = types.ModuleType("flashinfer")
    top.jit = jit  # type: ignore[attr-defined]

    def fake_import(name, globals=None, locals=None, fromlist=(), level=0):
        try:
            absolute = importlib.util.resolve_name("." * level + name, package) if level else name
        except (ImportError, ValueError):
            absolute = name
        if absolute == _CPP_EXT:
            return stub if fromlist else top
        if absolute == "flashinfer.jit" and fromlist and "cpp_ext" in fromlist:
            return jit
        if absolute == "flashinfer" and fromlist and "jit" in fromlist:
            return top
        return real_import(name, globals, locals, fromlist, level)

    fake_builtins = dict(vars(builtins))
    fake_builtins["__import__"] = fake_import
    glb = dict(func.__globals__)
    glb["__builtins__"] = fake_builtins
    glb["logger"] = logging.Logger(_CPP_EXT, logging.CRITICAL + 1)  # says nothing
    for name in _NAMES:
        if name in glb:
            glb[name] = getattr(stub, name)
    return types.FunctionType(func.__code__, glb, func.__name__, func.__defaults__, func.__closure__)


def _unwrap(obj):
    """The plain function behind a staticmethod and/or a wrapt wrapper."""
    func = getattr(obj, "__func__", obj)
    while not isinstance(func, types.FunctionType) and hasattr(func, "__wrapped__"):
        func = func.__wrapped__
    return func if isinstance(func, types.FunctionType) else None


def flashinfer_would_target(cls: type, version: Version, home: str | None) -> set | None:
    """``TARGET_CUDA_ARCHS`` FlashInfer's ``cls`` computes itself under nvcc ``version`` and ``home``, or ``None``
    when its code raised."""
    stub = _stub(version, home)
    init = _unwrap(vars(cls).get("__init__"))
    if init is None:
        return None
    attrs = {"__init__": _copy(init, stub)}
    norm = _unwrap(vars(cls).get("_normalize_cuda_arch"))
    if norm is not None:
        attrs["_normalize_cuda_arch"] = staticmethod(_copy(norm, stub))
    try:
        return set(type("_Sm120Probe", (cls,), attrs)().TARGET_CUDA_ARCHS)
    except Exception:
        return None
