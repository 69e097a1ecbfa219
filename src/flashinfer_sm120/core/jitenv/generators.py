"""Which FlashInfer generator made a JIT module, and with which arguments.

FlashInfer makes every JIT module with a ``gen_*_module`` function of typed parameters (0.7.4
``flashinfer/jit/attention/modules.py`` ``gen_batch_decode_module(dtype_q, ..., head_dim_qk, ...)``,
``flashinfer/jit/sampling.py`` ``gen_sampling_module()``): it renders its templates into
``FLASHINFER_GEN_SRC_DIR`` (``write_if_different``) and returns a ``JitSpec``.  Recording
(:func:`capture`, called as each ``JitSpecNvcc`` is made) notes the outermost such function on the
call stack and the values of its parameters; replay (:mod:`flashinfer_sm120.warmup.replay`) calls
it again, so FlashInfer writes the sources itself (docs/threat-model.md P2).
"""

from __future__ import annotations

import dis
import inspect
import re
import sys
from typing import Any

from flashinfer_sm120.safety.formats.params import PARAM_MAX_DEPTH, parse_generator, parse_params
from flashinfer_sm120.errors import FormatError, Sm120Error

__all__ = ["ORIGIN", "NotData", "capture", "encode_value"]

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
