"""One grammar per kind of value every process reads: versions, names, relative paths, targets, path
text, digests, command words.  (Manifest flags: :mod:`.flags`; tool output: :mod:`.binary`.)"""
# threat-model: P2, P6 (one grammar per field of outside input)

from __future__ import annotations

import re
from typing import Any

from packaging.version import InvalidVersion, Version

from flashinfer_sm120.safety.formats.base import _fail, _type_name, shown


#: A name (a module, a variant, a file in a cache entry): no whitespace, ``$``, ``:`` (ninja syntax),
#: ``/`` or NUL; at most 255 characters, Linux's NAME_MAX (FlashInfer's attention module names pass 200).
NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,254}")

#: A file name in a relative path: a name that may start with ``.`` (``.ninja_log``), never ``.``/``..``.
FILE_NAME_RE = re.compile(r"(?!\.\.?$)[A-Za-z0-9_.][A-Za-z0-9_.+-]{0,254}")

#: A version as nvcc, ninja, FlashInfer or pip print it: ``13.0.88``, ``0.7.2.post1``, ``2.14.0+cu130``.
_VERSION_RE = re.compile(r"[0-9]{1,6}(?:\.[0-9]{1,9}){0,4}(?:(?:\.?(?:post|dev|rc|a|b)[0-9]{0,9})){0,2}"
                         r"(?:\+[A-Za-z0-9.]{1,32})?")


def _match(regex: re.Pattern, text: Any, source: str, problem: str, fix: str) -> str:
    """``text`` when it is a string ``regex`` matches whole, else a :class:`FormatError` with ``problem``."""
    if not isinstance(text, str) or not regex.fullmatch(text):
        raise _fail(source, problem, fix)
    return text


def parse_version(text: Any, source: str, *, fix: str = "") -> Version:
    """One version of :data:`_VERSION_RE`, e.g. ``13.0.88`` (surrounding whitespace dropped)."""
    if not isinstance(text, str):
        raise _fail(source, f"version {shown(text, 40)} is {_type_name(text)}, not a string", fix)
    t = text.strip()
    if not _VERSION_RE.fullmatch(t):
        raise _fail(source, f"{shown(text)} is not a version such as 13.0.88", fix)
    try:
        return Version(t)
    except InvalidVersion:
        raise _fail(source, f"{shown(text)} is not a version such as 13.0.88", fix) from None


def parse_name(text: Any, source: str, *, fix: str = "") -> str:
    """A name of :data:`NAME_RE` grammar, returned unchanged."""
    return _match(NAME_RE, text, source, f"{shown(text)} is not a name (letters, digits, '_', '.', '+', "
                                         f"'-'; at most 200; not starting with '.' or '-')", fix)


def parse_relpath(text: Any, source: str, *, fix: str = "", max_parts: int = 16) -> tuple[str, ...]:
    """A relative path ``a/b/c`` whose every part is a :data:`FILE_NAME_RE` (so no absolute path,
    empty part, ``.`` or ``..``)."""
    if not isinstance(text, str) or not text:
        raise _fail(source, f"{shown(text)} is not a relative path", fix)
    parts = tuple(text.split("/"))
    if len(parts) > max_parts:
        raise _fail(source, f"{shown(text)} has more than {max_parts} parts", fix)
    for part in parts:
        if not FILE_NAME_RE.fullmatch(part):
            raise _fail(source, f"{shown(text)} is not a relative path of names (part {shown(part, 40)})",
                        fix)
    return parts


_LEADING_VERSION_RE = re.compile(r"([0-9]{1,6}(?:\.[0-9]{1,9}){0,3})(?:$|[.+-][A-Za-z])")


def parse_leading_version(text: Any, source: str, *, fix: str = "") -> Version:
    """The release at the start of a program's ``--version`` line: its first word's dotted numeric
    part (``1.13.2.git.kitware.jobserver-pipe-1``, as the ``ninja`` wheel prints, is 1.13.2)."""
    if not isinstance(text, str):
        raise _fail(source, f"output {shown(text, 40)} is {_type_name(text)}, not text", fix)
    words = text[:4096].split(None, 1)
    m = _LEADING_VERSION_RE.match(words[0]) if words else None
    if not m:
        raise _fail(source, f"{shown(text)} does not start with a version such as 1.13.2", fix)
    return Version(m.group(1))


#: A file path as a manifest carries it (``@FLASHINFER@/data/csrc/norm.cu``): no whitespace, ``$``,
#: ``:`` or quotes (FlashInfer's ``build.ninja`` lines and ``/bin/sh`` carry it unquoted).
PATH_TEXT_RE = re.compile(r"[A-Za-z0-9_./+@%=,~-]{1,4096}")

#: A word of a command FlashInfer writes into ``build.ninja`` from the environment (``cxx = $CXX``,
#: then ``/bin/sh -c``): no character ninja or the shell reads as syntax (a leading ``~`` included),
#: so the words we check are the words that run.
COMMAND_WORD_RE = re.compile(r"[A-Za-z0-9_./+@%=,:-][A-Za-z0-9_./+@%=,:~-]{0,4095}")

#: A target as manifests and ``--arch`` carry it: ``12.0``, ``12.0f``, ``9.0a``.
TARGET_RE = re.compile(r"[0-9]{1,2}\.[0-9][af]?")
_SHA256_RE = re.compile(r"[0-9a-f]{64}")


def parse_target(text: Any, source: str, *, fix: str = "") -> str:
    """One target of the ``major.minor[a|f]`` grammar (``12.0f``; not ``12.0`` as a number, ``sm_120``)."""
    return _match(TARGET_RE, text, source, f"target {shown(text, 40)} is not of the form major.minor[a|f], "
                                           f"e.g. '12.0' or '12.0f'", fix)


def parse_command_words(text: Any, source: str, *, fix: str = "", max_words: int = 64) -> tuple[str, ...]:
    """A command of 1 to ``max_words`` blank-separated :data:`COMMAND_WORD_RE` words (``ccache g++ -O2``)."""
    if not isinstance(text, str):
        raise _fail(source, f"{shown(text, 40)} is {_type_name(text)}, not a command", fix)
    if any(ord(c) < 32 and c != "\t" for c in text[:1 << 16]):
        raise _fail(source, f"{shown(text, 60)} holds a control character (a newline would start a new line "
                            f"of build.ninja)", fix)
    words = text.split()
    if len(text) > 1 << 16 or not words or len(words) > max_words:
        raise _fail(source, f"{shown(text, 60)} is not a command of 1 to {max_words} words", fix)
    for w in words:
        if not COMMAND_WORD_RE.fullmatch(w):
            raise _fail(source, f"word {shown(w, 40)} of {shown(text, 60)} holds characters that ninja or the "
                                f"shell read as syntax (only letters, digits and '_./+@%=,:~-' are plain)", fix)
    return tuple(words)


def parse_path_text(text: Any, source: str, *, fix: str = "") -> str:
    """A path of the :data:`PATH_TEXT_RE` grammar, returned unchanged (not resolved)."""
    if not isinstance(text, str) or not PATH_TEXT_RE.fullmatch(text) or "/../" in f"/{text}/":
        raise _fail(source, f"path {shown(text, 60)} is not a plain path (letters, digits, '_./+@%=,~-'; "
                            f"no whitespace, '$', ':', '..')", fix)
    return text


def parse_sha256(text: Any, source: str, *, fix: str = "") -> str:
    """A SHA-256 digest as 64 lower-case hex digits."""
    return _match(_SHA256_RE, text, source, f"{shown(text, 40)} is not a SHA-256 digest (64 hex digits)", fix)
