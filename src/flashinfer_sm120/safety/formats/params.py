"""A FlashInfer generator and its parameters, as a manifest names them (docs/safety.md section 4):
data, never code (P2); the local FlashInfer's ``gen_*_module`` makes what is compiled.
"""

from __future__ import annotations

import math
import re
from typing import Any

from flashinfer_sm120.safety.formats.base import _fail, shown

__all__ = ["PARAM_MAX_DEPTH", "PARAM_MAX_ITEMS", "PARAM_MAX_TEXT", "parse_generator", "parse_params"]

#: Deepest nesting of lists/tuples in one parameter.
PARAM_MAX_DEPTH = 4
#: Most values (leaves and containers) in one entry's parameters.
PARAM_MAX_ITEMS = 256
#: Longest string parameter.
PARAM_MAX_TEXT = 64
_MAX_INT = 1 << 53

_MODULE_RE = re.compile(r"flashinfer(?:\.(?!__)[a-z_][a-z0-9_]{0,63}){0,6}")
_NAME_RE = re.compile(r"_?gen_[a-z0-9_]{1,120}_module")
#: A name: starts with a letter, digit or ``_`` (never ``.``/``..``, which a generator could join into a path).
_TEXT_RE = re.compile(r"(?:[A-Za-z0-9_][A-Za-z0-9_.+-]{0,%d})?" % (PARAM_MAX_TEXT - 1))
_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
_DTYPE_RE = re.compile(r"[a-z][a-z0-9_]{0,31}")


def parse_generator(text: Any, source: str, *, fix: str = "") -> tuple[str, str]:
    """``(module, name)`` of a generator written ``flashinfer.jit.sampling:gen_sampling_module``.

    :raises FormatError: naming ``source`` and the value (cut short)."""
    # threat-model: P2 (a generator is named from a fixed family, never by an arbitrary dotted path)
    if not isinstance(text, str) or text.count(":") != 1:
        raise _fail(source, f"generator {shown(text)} is not 'flashinfer.<module>:gen_<name>_module'", fix)
    module, name = text.split(":")
    if not _MODULE_RE.fullmatch(module):
        raise _fail(source, f"generator module {shown(module)} is not a module of FlashInfer", fix)
    if not _NAME_RE.fullmatch(name) or "customize" in name:
        raise _fail(source, f"generator {shown(name)} is not a FlashInfer gen_*_module function that takes "
                            "parameters only (customize generators take C++ text)", fix)
    return module, name


def parse_params(obj: Any, source: str, *, fix: str = "") -> dict:
    """``{"args": [...], "kwargs": {...}}`` checked value by value (see the module docstring).

    :raises FormatError: naming ``source``, where in the parameters, and the value (cut short)."""
    # threat-model: P2 (parameters are plain values: no text that could be C++ or a path)
    if not isinstance(obj, dict) or set(obj) - {"args", "kwargs"}:
        raise _fail(source, f"params {shown(obj)} is not an object of 'args' and 'kwargs'", fix)
    args, kwargs = obj.get("args", []), obj.get("kwargs", {})
    if not isinstance(args, list):
        raise _fail(source, f"params 'args' {shown(args)} is not a list", fix)
    if not isinstance(kwargs, dict):
        raise _fail(source, f"params 'kwargs' {shown(kwargs)} is not an object", fix)
    budget = [PARAM_MAX_ITEMS]
    out_args = [_value(v, f"{source} params args[{i}]", fix, 0, budget) for i, v in enumerate(args)]
    out_kwargs = {}
    for k, v in kwargs.items():
        if not (isinstance(k, str) and _KEY_RE.fullmatch(k)):
            raise _fail(source, f"params keyword {shown(k)} is not a Python parameter name", fix)
        out_kwargs[k] = _value(v, f"{source} params {k}", fix, 0, budget)
    return {"args": out_args, "kwargs": out_kwargs}


def _value(v: Any, where: str, fix: str, depth: int, budget: list[int]) -> Any:
    budget[0] -= 1
    if budget[0] < 0:
        raise _fail(where, f"more than {PARAM_MAX_ITEMS} parameter values", fix)
    if v is None or isinstance(v, bool):
        return v
    if isinstance(v, int):
        if abs(v) > _MAX_INT:
            raise _fail(where, f"integer {shown(v)} is out of range (at most 2**53)", fix)
        return v
    if isinstance(v, float):
        if not math.isfinite(v):
            raise _fail(where, f"number {shown(v)} is not finite", fix)
        return v
    if isinstance(v, str):
        if not _TEXT_RE.fullmatch(v):
            raise _fail(where, f"string {shown(v)} is not a name of at most {PARAM_MAX_TEXT} letters, digits, "
                               "'_', '.', '+', '-' starting with a letter, digit or '_' (a parameter is a "
                               "value, never source text or a path)", fix)
        return v
    if isinstance(v, (list, dict)) and depth >= PARAM_MAX_DEPTH:
        raise _fail(where, f"parameters nest deeper than {PARAM_MAX_DEPTH}", fix)
    if isinstance(v, list):
        return [_value(x, where, fix, depth + 1, budget) for x in v]
    if isinstance(v, dict) and list(v) == ["dtype"]:
        name = v["dtype"]
        if not (isinstance(name, str) and _DTYPE_RE.fullmatch(name)):
            raise _fail(where, f"dtype {shown(name)} is not a torch dtype name", fix)
        return {"dtype": name}
    if isinstance(v, dict) and list(v) == ["tuple"] and isinstance(v["tuple"], list):
        return {"tuple": [_value(x, where, fix, depth + 1, budget) for x in v["tuple"]]}
    raise _fail(where, f"{shown(v)} is not a parameter value (null, true/false, a number, a name, "
                       "{\"dtype\": ...}, {\"tuple\": [...]} or a list)", fix)
