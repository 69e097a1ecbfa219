"""Compiler and linker flags a manifest or compiler variable may carry: an allowlist of the option
forms FlashInfer 0.7.4 itself uses (``flashinfer/jit/*.py``), not of characters: ``-ccbin=/x/cc``,
``-Xcompiler=-fplugin=/x.so``, ``-B``, ``-specs=``, ``-MF`` run, load or write something.
"""
# threat-model: P2 (compiler options as listed forms: none that names a program, plugin or output)

from __future__ import annotations

import re
from typing import Any

from flashinfer_sm120.safety.formats.base import _fail, shown
from flashinfer_sm120.safety.formats.grammar import _match

__all__ = ["FLAG_RE", "OPTION_FORMS", "PATH_OPTIONS", "parse_flag", "parse_compile_flag"]

#: The characters of a flag: no control character (a new ``build.ninja`` line), no shell syntax
#: (FlashInfer joins flags into ``/bin/sh -c`` unquoted).
FLAG_RE = re.compile(r"[A-Za-z0-9_.,:=+/@%{}~ -]{1,4096}")

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


def parse_flag(text: Any, source: str, *, fix: str = "") -> str:
    """One flag of the :data:`FLAG_RE` grammar, returned unchanged."""
    return _match(FLAG_RE, text, source, f"flag {shown(text, 60)} is not a plain compiler flag (letters, "
                                         f"digits, '_.,:=+/@%{{}}~-' and spaces; no newline, quote, '$', ';', "
                                         f"'|', '&')", fix)


def _word_ok(word: str) -> bool:
    return any(f.fullmatch(word) for f in _FORMS)


def parse_compile_flag(text: Any, source: str, *, fix: str = "") -> tuple[str, list[str]]:
    """One manifest flag: ``(flag unchanged, [directories it names])``.  Every word must be an
    :data:`OPTION_FORMS` word, a :data:`PATH_OPTIONS` option with an absolute or placeholder
    (``@FLASHINFER@/``, ``@GEN@/``, ``@JIT@/``) directory, or ``-Xcompiler`` with a comma-separated list
    of such words; any other (``-ccbin=/x``, ``-Xcompiler=-fplugin=/x.so``, ``-MF /x``, ``-B/x``) is a
    :class:`FormatError`.  The caller checks each directory returned by the trust rule."""
    parse_flag(text, source, fix=fix)
    words, dirs, i = text.split(), [], 0
    if not words:
        raise _fail(source, f"flag {shown(text, 60)} is blank", fix)
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
