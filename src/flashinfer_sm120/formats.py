"""The input boundary: everything flashinfer-sm120 reads that someone else could
have written enters here once and leaves as a typed value.

Rules, by construction rather than by listing bad cases:

* **bounded reads**: a size cap is enforced while reading (never "read, then
  check"); line reads stream with a per-line and a line-count cap; a FIFO or
  device is never opened for a blocking read;
* **depth-bounded JSON**: nesting is measured before :func:`json.loads` runs,
  so ``[[[[...`` ten thousand deep is refused with a message instead of a
  ``RecursionError``; ``NaN``/``Infinity`` are refused;
* **explicit types**: :func:`field` takes a key and the type wanted and says
  which file, which key and what it held;
* **one grammar per kind of value**: versions (:func:`parse_version`, parsed
  once into :class:`~packaging.version.Version` and only formatted from it),
  names (:data:`NAME_RE`: letters, digits, ``_``, ``.``, ``-``; no whitespace,
  ``$``, ``:``, ``/``, NUL), relative paths made of such names;
* **paths we write are checked where they are joined**: :func:`safe_join`
  refuses absolute parts, ``..`` and symlinked parents under the root;
  :func:`make_private_dirs` creates directories ``0700`` level by level,
  whatever the umask;
* **bounded messages**: :func:`shown` quotes at most :data:`MAX_SHOWN`
  characters of a value and :func:`some` at most a few items of a list.

Every refusal is a :class:`FormatError` (a :class:`~flashinfer_sm120.errors.Sm120Error`)
naming the file or variable, the offending value (truncated) and the fix.
"""

from __future__ import annotations

import argparse
import errno
import json
import math
import os
import re
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from .errors import FormatError

__all__ = [
    "FormatError", "MAX_SHOWN", "MAX_JSON_DEPTH", "NAME_RE", "FILE_NAME_RE", "shown", "some", "read_bytes", "read_prefix",
    "read_text",
    "iter_lines", "loads_json", "read_json_file", "field", "parse_version", "parse_name", "parse_relpath",
    "safe_join", "make_private_dirs", "env_text", "check_text", "parse_target", "parse_flag", "parse_path_text", "parse_sha256", "string_list",
    "cli_int", "cli_float", "cli_size",
]

#: Characters of an offending value quoted in a message, at most.
MAX_SHOWN = 80

#: Deepest JSON nesting accepted; everything we write is at most 4 deep.
MAX_JSON_DEPTH = 32

#: A name: a module, a variant, a file in a cache entry.  No whitespace, no
#: ``$`` or ``:`` (ninja syntax), no ``/`` (paths are lists of names), no NUL.
NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,199}")

#: A file name in a relative path: a name that may also start with ``.``
#: (``.ninja_log``, ``.ninja_deps``) but is never ``.`` or ``..``.
FILE_NAME_RE = re.compile(r"(?!\.\.?$)[A-Za-z0-9_.][A-Za-z0-9_.+-]{0,199}")

#: A version as nvcc, ninja, FlashInfer or pip print it: ``13.0.88``, ``1.13.2``,
#: ``0.7.2.post1``, ``2.14.0+cu130``.
_VERSION_RE = re.compile(r"[0-9]{1,6}(?:\.[0-9]{1,9}){0,4}(?:(?:\.?(?:post|dev|rc|a|b)[0-9]{0,9})){0,2}"
                         r"(?:\+[A-Za-z0-9.]{1,32})?")

_JSON_STRING_RE = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)
_BRACKETS_RE = re.compile(r"[\[\]{}]")


# ----------------------------------------------------------------------------- messages


def shown(value: Any, limit: int = MAX_SHOWN) -> str:
    """``repr(value)`` cut to ``limit`` characters (``...`` and the full length
    added when cut), so a message never carries a megabyte of input."""
    if isinstance(value, (bytes, bytearray)):
        text = repr(bytes(value[: limit + 1]))
        size = len(value)
    elif isinstance(value, str):
        text = repr(value[: limit + 1])
        size = len(value)
    else:
        try:
            text = repr(value)
        except Exception:  # a hostile __repr__
            text = f"<{type(value).__name__}>"
        size = len(text)
        if len(text) > limit:
            return text[:limit] + f"... ({type(value).__name__})"
        return text
    if size > limit:
        return text[: limit + 1] + f"... ({size} characters)"
    return text


def some(items: Iterable[Any], limit: int = 3) -> str:
    """``'a', 'b', 'c' and 97 more``: at most ``limit`` items, each :func:`shown`."""
    out, extra = [], 0
    for item in items:
        if len(out) < limit:
            out.append(shown(item, 40))
        else:
            extra += 1
    return ", ".join(out) + (f" and {extra} more" if extra else "")


def _fail(source: str, problem: str, fix: str) -> FormatError:
    return FormatError(f"{source}: {problem}; {fix}" if fix else f"{source}: {problem}")


# ----------------------------------------------------------------------------- bounded reads


def read_bytes(path: str | os.PathLike, max_bytes: int, *, fix: str = "", follow: bool = True,
               owners: tuple[int, ...] | None = None) -> bytes:
    """The whole of a regular file, refused past ``max_bytes`` while reading.

    Args:
        path: the file.
        max_bytes: the cap; a larger file is refused without reading past the cap.
        fix: what the message tells the user to do.
        follow: ``False`` refuses a symlink at ``path`` (``O_NOFOLLOW``).
        owners: uids allowed to own the file (``None``: anyone).

    Raises:
        FormatError: absent, not a regular file (a FIFO is never waited on),
            wrong owner, unreadable, or too large; the message names the path.
    """
    path = os.fspath(path)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    if not follow:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow:
            raise _fail(path, "is a symlink, which is never followed here", fix) from None
        raise _fail(path, f"cannot be opened ({exc.strerror or exc})", fix) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _fail(path, "is not a regular file", fix)
        if owners is not None and st.st_uid not in owners:
            raise _fail(path, f"is owned by uid {st.st_uid}, not {' or '.join(map(str, owners))}", fix)
        if st.st_size > max_bytes:
            raise _fail(path, f"is {st.st_size} bytes, more than the {max_bytes}-byte cap", fix)
        os.set_blocking(fd, True)
        chunks, left = [], max_bytes + 1
        while left > 0:
            b = os.read(fd, min(left, 1 << 16))
            if not b:
                break
            chunks.append(b)
            left -= len(b)
    except OSError as exc:
        raise _fail(path, f"cannot be read ({exc.strerror or exc})", fix) from None
    finally:
        os.close(fd)
    raw = b"".join(chunks)
    if len(raw) > max_bytes:
        raise _fail(path, f"is more than the {max_bytes}-byte cap", fix)
    return raw


def read_prefix(path: str | os.PathLike, limit: int, *, fix: str = "") -> bytes:
    """The first ``limit`` bytes of a regular file (for a header whose
    ``#define`` sits near the top, a script's ``#!`` line), never blocking on a
    FIFO or device.

    Raises:
        FormatError: absent, not a regular file, or unreadable.
    """
    path = os.fspath(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise _fail(path, f"cannot be opened ({exc.strerror or exc})", fix) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise _fail(path, "is not a regular file", fix)
        os.set_blocking(fd, True)
        chunks, left = [], limit
        while left > 0:
            b = os.read(fd, min(left, 1 << 16))
            if not b:
                break
            chunks.append(b)
            left -= len(b)
        return b"".join(chunks)
    except OSError as exc:
        raise _fail(path, f"cannot be read ({exc.strerror or exc})", fix) from None
    finally:
        os.close(fd)


def read_text(path: str | os.PathLike, max_bytes: int, *, fix: str = "", follow: bool = True,
              owners: tuple[int, ...] | None = None) -> str:
    """:func:`read_bytes` decoded as UTF-8 (refused, not replaced, when it is not)."""
    raw = read_bytes(path, max_bytes, fix=fix, follow=follow, owners=owners)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _fail(os.fspath(path), f"is not UTF-8 text (byte {exc.start})", fix) from None


def iter_lines(path: str | os.PathLike, *, max_line: int, max_lines: int, fix: str = "",
               skip_long: bool = False) -> Iterator[tuple[int, bytes | None]]:
    """``(line number, line without its newline)`` of a regular file, streamed:
    a line longer than ``max_line`` bytes or more than ``max_lines`` lines are
    refused when reached, never read whole (``/dev/zero``, a 1 GiB line).

    Args:
        skip_long: yield ``(n, None)`` for a line longer than ``max_line`` (read
            past in ``max_line`` chunks, never held whole) instead of refusing.

    Raises:
        FormatError: as :func:`read_bytes`, or a cap was reached.
    """
    path = os.fspath(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise _fail(path, f"cannot be opened ({exc.strerror or exc})", fix) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise _fail(path, "is not a regular file", fix)
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb", closefd=False) as fh:
            n = 0
            while True:
                line = fh.readline(max_line + 1)
                if not line:
                    return
                n += 1
                if n > max_lines:
                    raise _fail(path, f"has more than {max_lines} lines", fix)
                if len(line) > max_line and not line.endswith(b"\n"):
                    if not skip_long:
                        raise _fail(path, f"line {n} is longer than {max_line} bytes", fix)
                    while line and not line.endswith(b"\n"):  # drain it, a chunk at a time
                        line = fh.readline(max_line + 1)
                    yield n, None
                    continue
                yield n, line.rstrip(b"\r\n")
    except OSError as exc:
        raise _fail(path, f"cannot be read ({exc.strerror or exc})", fix) from None
    finally:
        os.close(fd)


# ----------------------------------------------------------------------------- JSON


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def json_depth(text: str) -> int:
    """Deepest ``[``/``{`` nesting of JSON text, strings skipped; no recursion."""
    depth = deepest = 0
    for m in _BRACKETS_RE.finditer(_JSON_STRING_RE.sub('""', text)):
        if m.group() in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def loads_json(data: str | bytes, source: str, *, max_depth: int = MAX_JSON_DEPTH, fix: str = "") -> Any:
    """Parse JSON from an untrusted source.

    Raises:
        FormatError: not UTF-8, not JSON, ``NaN``/``Infinity``, or nested deeper
            than ``max_depth``; the message names ``source`` and the fix.
    """
    if isinstance(data, (bytes, bytearray)):
        try:
            data = bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _fail(source, f"is not UTF-8 (byte {exc.start})", fix) from None
    depth = json_depth(data)
    if depth > max_depth:
        raise _fail(source, f"is JSON nested {depth} deep, more than the {max_depth} accepted", fix)
    try:
        return json.loads(data, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as exc:
        raise _fail(source, f"is not valid JSON ({shown(str(exc), 120)})", fix) from None


def read_json_file(path: str | os.PathLike, max_bytes: int, *, fix: str = "", follow: bool = True,
                   owners: tuple[int, ...] | None = None, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """:func:`read_bytes` then :func:`loads_json`, one message style for both."""
    raw = read_bytes(path, max_bytes, fix=fix, follow=follow, owners=owners)
    return loads_json(raw, os.fspath(path), max_depth=max_depth, fix=fix)


_TYPE_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "true or false",
               list: "a list", dict: "an object", type(None): "null"}


def field(obj: Any, key: str, kind: type | tuple[type, ...], source: str, *, fix: str = "",
          default: Any = ..., max_len: int | None = None) -> Any:
    """``obj[key]`` checked to be of ``kind`` (``bool`` is not an ``int`` here).

    Args:
        obj: a parsed JSON object (anything else is refused).
        key: the key.
        kind: the type or types wanted.
        source: the file or variable, for the message.
        default: returned when the key is absent (omit to make the key required).
        max_len: cap on the length of a string or list value.

    Raises:
        FormatError: ``obj`` is not an object, the key is missing (no default),
            or its value has another type or is too long.
    """
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(obj, dict):
        raise _fail(source, f"holds {_type_name(obj)} where an object was expected", fix)
    if key not in obj:
        if default is ...:
            raise _fail(source, f"has no {key!r}", fix)
        return default
    value = obj[key]
    ok = any(isinstance(value, k) and not (isinstance(value, bool) and k is not bool) for k in kinds)
    if isinstance(value, float) and not math.isfinite(value):
        ok = False
    if not ok:
        want = " or ".join(_TYPE_NAMES.get(k, k.__name__) for k in kinds)
        raise _fail(source, f"{key!r} is {shown(value, 40)} ({_type_name(value)}), not {want}", fix)
    if max_len is not None and isinstance(value, (str, list, dict)) and len(value) > max_len:
        raise _fail(source, f"{key!r} is longer than {max_len}", fix)
    return value


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    return _TYPE_NAMES.get(type(value), type(value).__name__)


# ----------------------------------------------------------------------------- grammars


def parse_version(text: Any, source: str, *, fix: str = "") -> Version:
    """One version, e.g. ``13.0.88`` (surrounding whitespace dropped, nothing else).

    Raises:
        FormatError: not a string, or not of the version grammar (letters,
            inner whitespace, control characters, more than 5 parts, ...).
    """
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
    """A name of :data:`NAME_RE` grammar, returned unchanged.

    Raises:
        FormatError: anything else (``.``/``..``, whitespace, ``$``, ``:``, ``/``, NUL, > 200 chars).
    """
    if not isinstance(text, str) or not NAME_RE.fullmatch(text):
        raise _fail(source, f"{shown(text)} is not a name (letters, digits, '_', '.', '+', '-'; "
                            f"at most 200; not starting with '.' or '-')", fix)
    return text


def parse_relpath(text: Any, source: str, *, fix: str = "", max_parts: int = 16) -> tuple[str, ...]:
    """A relative path ``a/b/c`` whose every part is a file name (:data:`FILE_NAME_RE`:
    a name, or one starting with ``.`` such as ``.ninja_log``).

    Absolute paths, empty parts (``a//b``), ``.`` and ``..`` are refused by the grammar.
    """
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


#: A compiler or linker flag as a manifest carries it (``-DENABLE_BF16``,
#: ``-I@FLASHINFER@/data/include``, ``-gencode=arch=compute_120f,code=sm_120f``):
#: no control character (a newline would start a new ``build.ninja`` line), no
#: shell syntax (FlashInfer joins flags into a ``/bin/sh -c`` command unquoted:
#: ``;``, ``|``, ``&``, quotes, ``$``, backquote, ``<``, ``>``, ``*`` are refused).
FLAG_RE = re.compile(r"[A-Za-z0-9_.,:=+/@%{}~ -]{1,4096}")

#: A file path as a manifest carries it (``@FLASHINFER@/data/csrc/norm.cu``):
#: the characters FlashInfer's unquoted ``build.ninja`` lines and ``/bin/sh`` carry
#: (no whitespace, ``$``, ``:``, quotes).
PATH_TEXT_RE = re.compile(r"[A-Za-z0-9_./+@%=,~-]{1,4096}")

#: A target as manifests and ``--arch`` carry it: ``12.0``, ``12.0f``, ``9.0a``.
TARGET_RE = re.compile(r"[0-9]{1,2}\.[0-9][af]?")
_SHA256_RE = re.compile(r"[0-9a-f]{64}")


def parse_target(text: Any, source: str, *, fix: str = "") -> str:
    """One target of the ``major.minor[a|f]`` grammar (``12.0f``), returned unchanged.

    Raises:
        FormatError: not a string of that grammar (``12.0`` as a number, ``sm_120``, spaces).
    """
    if not isinstance(text, str) or not TARGET_RE.fullmatch(text):
        raise _fail(source, f"target {shown(text, 40)} is not of the form major.minor[a|f], e.g. '12.0' "
                            f"or '12.0f'", fix)
    return text


def parse_flag(text: Any, source: str, *, fix: str = "") -> str:
    """One flag of the :data:`FLAG_RE` grammar, returned unchanged."""
    if not isinstance(text, str) or not FLAG_RE.fullmatch(text):
        raise _fail(source, f"flag {shown(text, 60)} is not a plain compiler flag (letters, digits, "
                            f"'_.,:=+/@%{{}}~-' and spaces; no newline, quote, '$', ';', '|', '&')", fix)
    return text


def parse_path_text(text: Any, source: str, *, fix: str = "") -> str:
    """A path of the :data:`PATH_TEXT_RE` grammar, returned unchanged (not resolved)."""
    if not isinstance(text, str) or not PATH_TEXT_RE.fullmatch(text) or "/../" in f"/{text}/":
        raise _fail(source, f"path {shown(text, 60)} is not a plain path (letters, digits, '_./+@%=,~-'; "
                            f"no whitespace, '$', ':', '..')", fix)
    return text


def parse_sha256(text: Any, source: str, *, fix: str = "") -> str:
    """A SHA-256 digest as 64 lower-case hex digits."""
    if not isinstance(text, str) or not _SHA256_RE.fullmatch(text):
        raise _fail(source, f"{shown(text, 40)} is not a SHA-256 digest (64 hex digits)", fix)
    return text


def string_list(value: Any, source: str, *, max_items: int = 4096, max_len: int = 1 << 16,
                fix: str = "") -> list[str]:
    """A JSON list of strings, each at most ``max_len`` characters and free of NUL.

    Raises:
        FormatError: not a list, too long, or an item that is not such a string.
    """
    if not isinstance(value, list):
        raise _fail(source, f"is {_type_name(value)}, not a list of strings", fix)
    if len(value) > max_items:
        raise _fail(source, f"has {len(value)} items, more than {max_items}", fix)
    for item in value:
        if not isinstance(item, str) or len(item) > max_len or "\0" in item:
            raise _fail(source, f"item {shown(item, 40)} is not a string without NUL of at most "
                                f"{max_len} characters", fix)
    return value


# ----------------------------------------------------------------------------- paths we write


def safe_join(root: str | os.PathLike, rel: str | Iterable[str], source: str, *, fix: str = "") -> Path:
    """``root/rel``, refused unless it stays under ``root``.

    ``rel`` is a ``/``-separated string or a sequence of parts; every part must
    be a name (:func:`parse_relpath`), so absolute parts and ``..`` cannot
    occur; every part that already exists below ``root``, except the last, must
    be a real directory (a symlinked parent is refused, it could lead anywhere).
    The last part may exist; it is refused when it is a symlink.

    Raises:
        FormatError: naming ``source`` and the offending part.
    """
    parts = parse_relpath(rel if isinstance(rel, str) else "/".join(rel), source, fix=fix)
    base = Path(root)
    cur = base
    for i, part in enumerate(parts):
        cur = cur / part
        try:
            st = os.lstat(cur)
        except FileNotFoundError:
            break
        except OSError as exc:
            raise _fail(source, f"cannot check {cur} ({exc.strerror or exc})", fix) from None
        if stat.S_ISLNK(st.st_mode):
            raise _fail(source, f"{cur} is a symlink; nothing is written through links", fix)
        if i < len(parts) - 1 and not stat.S_ISDIR(st.st_mode):
            raise _fail(source, f"{cur} is not a directory", fix)
    return base.joinpath(*parts)


def make_private_dirs(path: str | os.PathLike, *, mode: int = 0o700) -> None:
    """Create ``path`` and any missing parents with exactly ``mode`` (default
    ``0700``), whatever the umask: each level created here is ``chmod``-ed
    right after ``mkdir``.  Existing levels are left as they are.

    Raises:
        OSError: as :func:`os.mkdir`.
    """
    path = os.path.abspath(os.fspath(path))
    missing = []
    p = path
    while not os.path.lexists(p):
        missing.append(p)
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    for d in reversed(missing):
        try:
            os.mkdir(d, mode)
        except FileExistsError:
            continue
        os.chmod(d, mode)


# ----------------------------------------------------------------------------- env and CLI values


def check_text(value: Any, name: str, *, max_len: int = 4096, fix: str = "") -> str:
    """``value`` if it is a string of at most ``max_len`` characters with no
    NUL or control character other than tab, else a :class:`FormatError`
    naming ``name`` and showing a cut value (never the whole of it)."""
    fix = fix or "set it to a short plain value or unset it"
    if not isinstance(value, str):
        raise _fail(name, f"is {_type_name(value)}, not text", fix)
    if len(value) > max_len:
        raise FormatError(f"{name} is {len(value)} characters long, more than {max_len} "
                          f"(starts {shown(value, 40)}); {fix}")
    bad = [c for c in value if ord(c) < 32 and c != "\t"]
    if bad:
        raise FormatError(f"{name}={shown(value)} holds control characters ({some(bad)}); {fix}")
    return value


def env_text(name: str, env: dict[str, str] | None = None, *, max_len: int = 4096) -> str | None:
    """``env[name]`` (default ``os.environ``), or ``None`` when unset.

    Raises:
        FormatError: longer than ``max_len`` or holding a NUL/control character
            other than tab; the message names the variable and shows a cut value.
    """
    value = (os.environ if env is None else env).get(name)
    if value is None:
        return None
    return check_text(value, name, max_len=max_len)


def _number(flag: str, text: str, convert, lo, hi, what: str):
    try:
        value = convert(text)
    except (ValueError, OverflowError):
        raise argparse.ArgumentTypeError(f"{flag} {shown(text, 40)} is not {what}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{flag} {shown(text, 40)} is not a finite number")
    if not lo <= value <= hi:
        raise argparse.ArgumentTypeError(f"{flag} {shown(text, 40)} is out of range: give {what} "
                                         f"from {lo:g} to {hi:g}")
    return value


def cli_int(flag: str, lo: int = 1, hi: int = 1024):
    """An argparse ``type=`` for an integer in ``[lo, hi]``, naming ``flag`` when refused."""
    def convert(text: str) -> int:
        return _number(flag, text, int, lo, hi, "a whole number")
    convert.__name__ = flag  # argparse names the type in some messages
    return convert


def cli_float(flag: str, lo: float, hi: float):
    """An argparse ``type=`` for a finite number in ``[lo, hi]`` (``nan``, ``inf``,
    ``1e999`` and negatives refused), naming ``flag``."""
    def convert(text: str) -> float:
        return _number(flag, text, float, lo, hi, "a number")
    convert.__name__ = flag
    return convert


_SIZE_RE = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*([KMGT]i?B?|B)?", re.I)
_SIZE_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def cli_size(flag: str, lo: int = 1, hi: int = 1 << 50):
    """An argparse ``type=`` for a byte size (``512M``, ``4GiB``, ``1000``), naming ``flag``."""
    def convert(text: str) -> int:
        m = _SIZE_RE.fullmatch(text.strip()) if isinstance(text, str) and len(text) < 40 else None
        if not m:
            raise argparse.ArgumentTypeError(f"{flag} {shown(text, 40)} is not a size such as 512M or 4G")
        value = int(float(m.group(1)) * _SIZE_UNITS[(m.group(2) or "")[:1].upper()])
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{flag} {shown(text, 40)} is out of range ({lo} to {hi} bytes)")
        return value
    convert.__name__ = flag
    return convert
