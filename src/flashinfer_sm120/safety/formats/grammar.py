"""The grammar of every value read from outside, as data (:data:`GRAMMAR`, one :func:`parse`), versions and
command words."""
# threat-model: P2, P6 (one grammar per field of outside input)

from __future__ import annotations

import contextlib
import re
from typing import Any

from packaging.version import InvalidVersion, Version

from flashinfer_sm120.safety.formats.base import _fail, _type_name, shown

#: kind -> (the pattern a value must match whole, what such a value is, in a refusal).
GRAMMAR: dict[str, tuple[re.Pattern, str]] = {
    # no whitespace, '$', ':' (ninja syntax), '/' or NUL; at most Linux's NAME_MAX (attention modules pass 200)
    "name": (re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,254}"),
             "a name (letters, digits, '_', '.', '+', '-'; at most 255; not starting with '.' or '-')"),
    # as manifests and --arch carry it (not 12.0 as a number, not sm_120)
    "target": (re.compile(r"[0-9]{1,2}\.[0-9][af]?"), "a target of the form major.minor[a|f], e.g. '12.0' or '12.0f'"),
    # a file path as a manifest carries it (@FLASHINFER@/data/csrc/norm.cu): build.ninja and /bin/sh carry it unquoted
    "path": (re.compile(r"[A-Za-z0-9_./+@%=,~-]{1,4096}"),
             "a plain path (letters, digits, '_./+@%=,~-'; no whitespace, '$', ':', '..')"),
    # a word of a command FlashInfer writes into build.ninja from the environment (cxx = $CXX, then /bin/sh -c):
    # nothing ninja or the shell reads as syntax, a leading '~' included, so the words checked are the words run
    "word": (re.compile(r"[A-Za-z0-9_./+@%=,:-][A-Za-z0-9_./+@%=,:~-]{0,4095}"),
             "a plain word (only letters, digits and '_./+@%=,:~-': others are ninja or shell syntax)"),
}

#: A version as nvcc, ninja, FlashInfer or pip print it: ``13.0.88``, ``0.7.2.post1``, ``2.14.0+cu130``.
_VERSION_RE = re.compile(r"[0-9]{1,6}(?:\.[0-9]{1,9}){0,4}(?:(?:\.?(?:post|dev|rc|a|b)[0-9]{0,9})){0,2}"
                         r"(?:\+[A-Za-z0-9.]{1,32})?")
_LEADING_VERSION_RE = re.compile(r"([0-9]{1,6}(?:\.[0-9]{1,9}){0,3})(?:$|[.+-][A-Za-z])")


def parse(kind: str, text: Any, source: str, *, fix: str = "") -> str:
    """``text`` when it is a string of :data:`GRAMMAR`'s ``kind`` (a path: no ``..``), else a :class:`FormatError`."""
    regex, what = GRAMMAR[kind]
    if not isinstance(text, str) or not regex.fullmatch(text) or (kind == "path" and "/../" in f"/{text}/"):
        raise _fail(source, f"{shown(text, 60)} is not {what}", fix)
    return text


def parse_version(text: Any, source: str, *, fix: str = "") -> Version:
    """One version of :data:`_VERSION_RE`, e.g. ``13.0.88`` (surrounding whitespace dropped)."""
    t = text.strip() if isinstance(text, str) else ""
    with contextlib.suppress(InvalidVersion):
        if _VERSION_RE.fullmatch(t):
            return Version(t)
    raise _fail(source, f"{shown(text)} is not a version such as 13.0.88", fix)


def parse_leading_version(text: Any, source: str, *, fix: str = "") -> Version:
    """The release a ``--version`` line starts with (the ``ninja`` wheel's ``1.13.2.git.kitware...`` is 1.13.2)."""
    words = text[:4096].split(None, 1) if isinstance(text, str) else []
    m = _LEADING_VERSION_RE.match(words[0]) if words else None
    if not m:
        raise _fail(source, f"{shown(text)} does not start with a version such as 1.13.2", fix)
    return Version(m.group(1))


def parse_command_words(text: Any, source: str, *, fix: str = "") -> tuple[str, ...]:
    """A command of 1 to 64 blank-separated ``word`` values (``ccache g++ -O2``)."""
    if not isinstance(text, str):
        raise _fail(source, f"{shown(text, 40)} is {_type_name(text)}, not a command", fix)
    if any(ord(c) < 32 and c != "\t" for c in text[:1 << 16]):
        raise _fail(source, f"{shown(text, 60)} holds a control character (a newline would start a new line "
                            f"of build.ninja)", fix)
    words = text.split()
    if len(text) > 1 << 16 or not words or len(words) > 64:
        raise _fail(source, f"{shown(text, 60)} is not a command of 1 to 64 words", fix)
    regex, what = GRAMMAR["word"]
    for w in words:
        if not regex.fullmatch(w):
            raise _fail(source, f"word {shown(w, 40)} of {shown(text, 60)} is not {what}", fix)
    return tuple(words)
