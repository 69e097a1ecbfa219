"""Bounded messages: the one way a refusal quotes what it was given."""
# threat-model: P6, P8 (one error type, messages cut to a bound)

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from typing import Any

from flashinfer_sm120.errors import FormatError

#: Characters of an offending value quoted in a message, at most.
MAX_SHOWN = 80


def shown(value: Any, limit: int = MAX_SHOWN) -> str:
    """``repr(value)`` cut to ``limit`` characters (``...`` and the full length added), so a message stays small."""
    if isinstance(value, (str, bytes, bytearray)):
        text = repr(value[: limit + 1] if isinstance(value, str) else bytes(value[: limit + 1]))
        return text if len(value) <= limit else f"{text[: limit + 1]}... ({len(value)} characters)"
    try:
        text = repr(value)
    except Exception:  # a hostile __repr__
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else f"{text[:limit]}... ({type(value).__name__})"


def non_ascii_digits(text: str, what: str) -> str | None:
    """Why ``text`` (given as ``what``) is refused when it writes a digit other than ASCII 0-9, which ``int()``,
    ``float()`` and ``\\d`` take (``'١٢.٠'`` as 12.0) though a person reading it may not; None if none.  P6, P8"""
    odd = [c for c in text if c.isdigit() and not c.isascii()]
    if not odd:
        return None
    typed = "".join(str(unicodedata.decimal(c)) if c.isdecimal() else c
                    for c in unicodedata.normalize("NFKC", text))
    return (f"{what} {shown(text, 40)} has digits other than ASCII 0-9 ({some(dict.fromkeys(odd))}); type it with "
            f"0-9" + (f": {shown(typed.strip(), 40)}" if typed.isascii() and all(map(str.isdecimal, odd)) else ""))


def some(items: Iterable[Any], limit: int = 3) -> str:
    """``'a', 'b', 'c' and 97 more``: at most ``limit`` items, each :func:`shown`."""
    out, extra = [], 0
    for item in items:
        if len(out) < limit:
            out.append(shown(item, 40))
        else:
            extra += 1
    return ", ".join(out) + (f" and {extra} more" if extra else "")


#: Characters a terminal acts on instead of showing them: C0 controls but newline and tab (ESC
#: sequences, CR), DEL, C1 controls, and Unicode's bidirectional marks, which reorder the text around them.
_UNSHOWN_RE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """``text`` with every character a terminal acts on (:data:`_UNSHOWN_RE`) escaped (P8)."""
    return _UNSHOWN_RE.sub(lambda m: (f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100
                                      else f"\\u{ord(m.group()):04x}"), text)


#: A run of non-blank characters longer than this is cut in :func:`bounded`.
MAX_WORD = 1024  # a module's JIT path is ~300 characters: real paths pass whole
#: Characters of a whole message kept by :func:`bounded`.
MAX_MESSAGE = 4096


def bounded(message: str, *, max_word: int = MAX_WORD, max_len: int = MAX_MESSAGE) -> str:
    """``message`` :func:`printable`, each run over ``max_word`` and the whole over ``max_len`` cut (argparse's text)."""
    out = re.sub(r"\S{%d,}" % (max_word + 1), lambda m: f"{m.group()[:MAX_SHOWN]}... ({len(m.group())} characters)",
                 printable(message))  # threat-model: P8
    return out if len(out) <= max_len else f"{out[:max_len]}... ({len(out)} characters in all)"


def _fail(source: str, problem: str, fix: str) -> FormatError:
    return FormatError(f"{source}: {problem}; {fix}" if fix else f"{source}: {problem}", source=source,
                       problem=problem, fix=fix)


_TYPE_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "true or false",
               list: "a list", dict: "an object", type(None): "null"}


def _type_name(value: Any) -> str:
    return _TYPE_NAMES.get(type(value), type(value).__name__)


def plural(n: int, word: str, many: str | None = None) -> str:
    """``1 module``, ``2 modules``: ``many`` defaults to ``word + 's'``."""
    return f"{n} {word if n == 1 else many or word + 's'}"
