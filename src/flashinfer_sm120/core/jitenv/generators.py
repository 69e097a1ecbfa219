"""Which FlashInfer generator made a JIT module, with which arguments, and calling it again.

FlashInfer makes every JIT module with a ``gen_*_module`` function of typed parameters (0.7.4
``flashinfer/jit/attention/modules.py`` ``gen_batch_decode_module(dtype_q, ..., head_dim_qk, ...)``,
``flashinfer/jit/sampling.py`` ``gen_sampling_module()``): it renders its templates into
``FLASHINFER_GEN_SRC_DIR`` (``write_if_different``) and returns a ``JitSpec``.  Recording
(:func:`capture`, called as each ``JitSpecNvcc`` is made) notes the outermost such function on the
call stack and the values of its parameters; replay (:func:`call`) looks the function up in the
installed FlashInfer (:func:`lookup`: only ``gen_*_module`` functions that FlashInfer defines) and
calls it with those values, so FlashInfer writes the sources itself and nothing a manifest carries
is compiled (docs/threat-model.md P2).
"""

from __future__ import annotations

import dis
import importlib
import importlib.util
import inspect
import re
import sys
from pathlib import Path
from typing import Any

from flashinfer_sm120.safety import formats
from flashinfer_sm120.safety.formats.params import PARAM_MAX_DEPTH, parse_generator, parse_params
from flashinfer_sm120.errors import FormatError, Sm120Error

__all__ = ["ORIGIN", "NotData", "capture", "encode_value", "lookup", "call", "legacy_generator"]

#: Attribute of a ``JitSpecNvcc`` that holds ``{"generator", "params"}`` or why there is none.
ORIGIN = "_flashinfer_sm120_origin"
_GEN_RE = re.compile(r"_?gen_[a-z0-9_]+_module")
_STORES = {"STORE_FAST", "DELETE_FAST", "STORE_DEREF", "DELETE_DEREF", "STORE_NAME", "DELETE_NAME"}


class NotData(Sm120Error):
    """A generator argument that is not a plain value (a callable, a tensor, an enum)."""


def _is_generator_frame(frame) -> bool:
    module = frame.f_globals.get("__name__") or ""
    name = frame.f_code.co_name
    return ((module == "flashinfer" or module.startswith("flashinfer."))
            and bool(_GEN_RE.fullmatch(name)) and "customize" not in name)


def capture(spec) -> None:
    """Note on ``spec`` the outermost FlashInfer ``gen_*_module`` call on this thread's stack and
    its arguments (or why they cannot be carried).  Never raises."""
    try:
        frame, outermost = sys._getframe(1), None
        while frame is not None:
            if _is_generator_frame(frame):
                outermost = frame
            frame = frame.f_back
        origin: Any = ("no FlashInfer gen_*_module function made it" if outermost is None
                       else _origin(outermost))
    except Exception as exc:  # recording never breaks a build
        origin = f"its generator's arguments could not be read ({type(exc).__name__})"
    try:
        object.__setattr__(spec, ORIGIN, origin)
    except Exception:
        pass


def _origin(frame) -> dict | str:
    code = frame.f_code
    where = f"{frame.f_globals.get('__name__')}:{code.co_name}"
    fn = frame.f_globals.get(code.co_name)
    if fn is None or getattr(inspect.unwrap(fn), "__code__", None) is not code:
        return f"{where} is not reachable by its name in its module"
    n = code.co_argcount + code.co_kwonlyargcount
    positional, kwonly = code.co_varnames[:code.co_argcount], code.co_varnames[code.co_argcount:n]
    varargs = code.co_varnames[n] if code.co_flags & inspect.CO_VARARGS else None
    varkw = code.co_varnames[n + (varargs is not None)] if code.co_flags & inspect.CO_VARKEYWORDS else None
    params = {*positional, *kwonly, *(p for p in (varargs, varkw) if p)}
    changed = sorted({i.argval for i in dis.get_instructions(code) if i.opname in _STORES and i.argval in params})
    if changed:  # the frame holds the new value, not the argument
        return f"{where} assigns to its parameter {changed[0]!r}, so its arguments cannot be read back"
    values = frame.f_locals
    try:
        args = [encode_value(values[p]) for p in positional] + [encode_value(v) for v in values.get(varargs, ())]
        kwargs = {k: encode_value(values[k]) for k in kwonly}
        kwargs.update({k: encode_value(v) for k, v in (values.get(varkw) or {}).items()})
        out = {"generator": where, "params": {"args": args, "kwargs": kwargs}}
        parse_generator(out["generator"], where)
        parse_params(out["params"], where)
    except (NotData, FormatError) as exc:
        return f"{where}: {exc}"
    return out


def encode_value(value: Any, depth: int = 0) -> Any:
    """A generator argument as plain JSON (see :mod:`flashinfer_sm120.safety.formats.params`).

    :raises NotData: a value of another type (enums too: their text form is not their value)."""
    if depth > PARAM_MAX_DEPTH:
        raise NotData("an argument nests too deep")
    if value is None or type(value) in (bool, int, float, str):
        return value
    if type(value).__name__ == "dtype" and type(value).__module__ == "torch":
        return {"dtype": str(value).split(".", 1)[-1]}
    if type(value) is tuple:
        return {"tuple": [encode_value(v, depth + 1) for v in value]}
    if type(value) is list:
        return [encode_value(v, depth + 1) for v in value]
    raise NotData(f"an argument is a {type(value).__name__}, not a plain value")


def _decode(value: Any) -> Any:
    if isinstance(value, list):
        return [_decode(v) for v in value]
    if isinstance(value, dict) and "tuple" in value:
        return tuple(_decode(v) for v in value["tuple"])
    if isinstance(value, dict):
        import torch

        dtype = getattr(torch, value["dtype"], None)
        if not isinstance(dtype, torch.dtype):
            raise FormatError(f"{formats.shown(value['dtype'])} is not a dtype of this torch")
        return dtype
    return value


def lookup(generator: str):
    """The function ``generator`` (``flashinfer.x.y:gen_z_module``) names, from the installed
    FlashInfer only: its module must be a file of the installed ``flashinfer`` package and the
    function a Python function FlashInfer defines under that very name.

    :raises FormatError: it names anything else (the message says what)."""
    # threat-model: P2 (no dotted path from a file is ever resolved outside FlashInfer's gen_*_module family)
    module, name = parse_generator(generator, "manifest 'generator'")
    import flashinfer

    root = Path(flashinfer.__file__).resolve().parent
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        found = None
    origin = Path(found.origin).resolve() if found is not None and found.origin else None
    if origin is None or root not in origin.parents:
        raise FormatError(f"the installed FlashInfer has no module {module}")
    fn = getattr(importlib.import_module(module), name, None)
    inner = inspect.unwrap(fn) if callable(fn) else None
    if not (inspect.isfunction(inner) and inner.__name__ == name
            and (inner.__module__ == "flashinfer" or str(inner.__module__).startswith("flashinfer."))):
        raise FormatError(f"the installed FlashInfer's {module} defines no function {name}")
    return fn


def call(generator: str, params: dict):
    """Call ``generator`` with ``params`` (as :func:`flashinfer_sm120.safety.formats.params.parse_params` returns
    them): FlashInfer renders its sources and returns the spec.

    :raises FormatError: the generator is not FlashInfer's, or a dtype this torch lacks.
    :raises Exception: whatever FlashInfer's generator raises for these values."""
    fn = lookup(generator)
    args = [_decode(v) for v in params.get("args", [])]
    kwargs = {k: _decode(v) for k, v in params.get("kwargs", {}).items()}
    return fn(*args, **kwargs)


def legacy_generator(name: str) -> str | None:
    """For an entry recorded before generators were recorded: ``flashinfer.jit.<name>:gen_<name>_module``
    where the installed FlashInfer has it and it takes no required argument (``sampling``, ``norm``,
    ``rope``, ``page`` on 0.7.4); else ``None``."""
    if not re.fullmatch(r"[a-z][a-z0-9_]{0,60}", name):
        return None
    generator = f"flashinfer.jit.{name}:gen_{name}_module"
    try:
        fn = lookup(generator)
        required = [p for p in inspect.signature(fn).parameters.values()
                    if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    except (FormatError, ImportError, ValueError, TypeError):
        return None
    return None if required else generator
