"""Parameters from outside, by grammar (commands only): a manifest's generators and arguments (data, never code: P2),
compiler flags as FlashInfer's option forms, command-line numbers and a ninja log's header (P6, P8)."""

from __future__ import annotations

import argparse
import math
import re
from typing import Any

from flashinfer_sm120.safety.formats.base import _fail, non_ascii_digits, shown

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
    """``(module, name)`` of a generator written ``flashinfer.jit.sampling:gen_sampling_module`` (P2)."""
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
    """``{"args": [...], "kwargs": {...}}`` checked value by value: plain values, never text or paths (P2)."""
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


# threat-model: P2 (compiler options as listed forms: ``-ccbin=/x/cc``, ``-Xcompiler=-fplugin=/x.so``, ``-B``,
# ``-specs=``, ``-MF`` run, load or write something; the forms are those FlashInfer 0.7.4 uses, ``flashinfer/jit/*.py``)
_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_ARCH = r"[0-9]{2,3}[af]?"
_BOOL = r"(?:true|false)"

#: Every accepted word of a flag, as one regular expression each (matched whole).
OPTION_FORMS: tuple[str, ...] = (
    rf"-D{_NAME}(?:=[A-Za-z0-9_.,+/@%{{}}~-]*)?",     # a define; its value: no '=' or ':' tricks
    rf"-U{_NAME}",
    r"-O[0-3s]?", r"-g", r"-G", r"-lineinfo", r"-v", r"-shared", r"-default-device",
    r"--?std=(?:c|gnu)\+\+[0-9a-z]{2}",
    r"--?use_fast_math", rf"--?(?:fmad|ftz|prec-sqrt|prec-div|rdc|relocatable-device-code)={_BOOL}",
    rf"-rdc={_BOOL}", r"--expt-relaxed-constexpr", r"--expt-extended-lambda", r"--extended-lambda",
    rf"-static-global-template-stub={_BOOL}", rf"--device-entity-has-hidden-visibility={_BOOL}",
    r"--?threads=[0-9]{1,4}", r"--?maxrregcount=[0-9]{1,4}", r"--?compress-mode=[a-z]{1,16}",
    r"-Xfatbin=-compress-all", r"-Xptxas=(?:-v|--register-usage-level=[0-9]{1,2}|-O[0-3])",
    rf"-gencode=arch=compute_{_ARCH},code=(?:sm|compute)_{_ARCH}",
    rf"--?(?:gpu-architecture|arch)=(?:sm|compute)_{_ARCH}",
    r"-Wno-deprecated-gpu-targets",
    r"-W(?:no-)?[a-z][a-z0-9+-]+(?:=[a-z0-9-]+)?",   # warnings; never -Wl -Wa -Wp (one letter) nor a comma
    r"-f(?:no-)?[A-Za-z][A-Za-z0-9-]*",              # features; no '=' so never -fplugin=, -fprofile-*=
    r"-m[a-z0-9][a-z0-9-]*(?:=[a-z0-9-]+)?",         # -march=native, -mavx2
    r"-l[A-Za-z0-9_+.-]+",                           # a library by name, found on trusted -L dirs
)
_FORMS = tuple(re.compile(p) for p in OPTION_FORMS)

#: Options whose value is a directory (attached, ``-I/x``, or the next word, ``-isystem /x``).
PATH_OPTIONS: tuple[str, ...] = ("-isystem", "-I", "-L")
#: Options that hand the host compiler a comma-separated list (attached with ``=`` or the next word);
#: each item must itself be an accepted word.
_HOST = ("-Xcompiler", "--compiler-options")
_PATH_RE = re.compile(r"(?:/|@(?:FLASHINFER|GEN|JIT)@/)[A-Za-z0-9_./+@%=,~-]{0,4095}")


def _word_ok(word: str) -> bool:
    return any(f.fullmatch(word) for f in _FORMS)


def parse_compile_flag(text: str, source: str, *, fix: str = "") -> tuple[str, list[str]]:
    """``(flag, [directories it names])`` of words of the ``word`` grammar (:func:`.grammar.parse_command_words`) when
    each is an :data:`OPTION_FORMS` word, a ``-I`` of a path, or ``-Xcompiler``."""
    words, dirs, i = text.split(), [], 0
    while i < len(words):
        w, nxt = words[i], words[i + 1] if i + 1 < len(words) else None
        opt = next((o for o in PATH_OPTIONS if w.startswith(o)), None)
        host = next((h for h in _HOST if w == h or w.startswith(h + "=")), None)
        if opt is not None and not _word_ok(w):  # -I, -isystem, -L: a directory, attached or next
            value, i = (w[len(opt):], i + 1) if w != opt else (nxt, i + 2)
            if value is None or not _PATH_RE.fullmatch(value) or "/../" in value + "/":
                raise _fail(source, f"{opt} in flag {shown(text, 60)} names {shown(value, 60)}, not an "
                                    f"absolute directory without '..'", fix)
            dirs.append(value)
            continue
        if host is not None:
            inner, i = (w[len(host) + 1:], i + 1) if w != host else (nxt, i + 2)
            bad = [x for x in (inner or "").split(",") if not _word_ok(x)]
            if inner is None or bad:
                raise _fail(source, f"flag {shown(text, 60)} hands the host compiler {shown(bad[0] if bad else inner, 40)}, "
                                    f"which is not an option FlashInfer uses", fix)
            continue
        if not _word_ok(w):
            raise _fail(source, f"flag {shown(text, 60)}: {shown(w, 40)} is not an option FlashInfer uses "
                                f"(options that name programs, plugins or output files are never taken "
                                f"from a manifest or a compiler variable)", fix)
        i += 1
    return text, dirs


# threat-model: P6, P8 (command-line values parsed once, bounded, named with their fix)
_SIZE_RE = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*([KMGT]i?B?|B)?", re.I)
_SIZE_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def _size(text: str) -> int:
    m = _SIZE_RE.fullmatch(text.strip()) if len(text) < 40 else None
    if not m:
        raise ValueError(text)
    return int(float(m.group(1)) * _SIZE_UNITS[(m.group(2) or "")[:1].upper()])


def _cli(flag: str, convert, lo, hi, what: str, bound=lambda v: f"{v:g}", hint=lambda text: ""):
    """An argparse ``type=``: ``convert(text)`` within ``[lo, hi]`` (NaN and infinities are not), naming ``flag``;
    the range as ``bound`` writes a value, and ``hint(text)`` added."""
    def parse(text: str):
        odd = non_ascii_digits(text, flag)
        if odd:
            raise argparse.ArgumentTypeError(odd)
        try:
            value = convert(text)
        except (ValueError, OverflowError):
            raise argparse.ArgumentTypeError(f"{flag} {shown(text, 40)} is not {what}") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{flag} {shown(text, 40)} is out of range: give {what} "
                                             f"from {bound(lo)} to {bound(hi)}{hint(text)}")
        return value
    parse.__name__ = flag  # argparse names the type in some messages
    return parse


def cli_int(flag: str, lo: int = 1, hi: int = 1024):
    return _cli(flag, int, lo, hi, "a whole number")


def cli_float(flag: str, lo: float, hi: float):
    return _cli(flag, float, lo, hi, "a number")


def _size_text(n: int) -> str:
    """``n`` bytes in the largest unit that divides it (``64M``, ``1024T``), as a size option takes it."""
    unit = next(u for u in "TGMK" if n % _SIZE_UNITS[u] == 0) if n % 1024 == 0 else ""
    return f"{n // _SIZE_UNITS[unit]}{unit}"


def cli_size(flag: str, lo: int = 1, hi: int = 1 << 50):
    return _cli(flag, _size, lo, hi, "a size such as 512M or 4G", _size_text,
                lambda text: f" (a number alone is bytes: did you mean {text.strip()}G?)" if text.strip().isdigit()
                else "")


_NINJA_LOG_RE = re.compile(rb"# ninja log v([0-9]{1,4})")


def parse_ninja_log_header(line: Any, source: str) -> int:
    """The format of a ``.ninja_log`` from its first line, ``# ninja log v7`` (ninja ``src/build_log.cc``)."""
    m = _NINJA_LOG_RE.fullmatch(line.rstrip(b"\r\n")) if isinstance(line, bytes) else None
    if not m:
        raise _fail(source, f"first line {shown(line, 40)} is not a ninja log header such as '# ninja log v7'", "")
    return int(m.group(1))
