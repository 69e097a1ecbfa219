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
    "safe_join", "make_private_dirs", "env_text", "check_text", "parse_target", "parse_flag", "parse_path_text",
    "parse_sha256", "string_list", "cli_int", "cli_float", "cli_size", "parse_ninja_log_header",
    "parse_leading_version",
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


_LEADING_VERSION_RE = re.compile(r"([0-9]{1,6}(?:\.[0-9]{1,9}){0,3})(?:$|[.+-][A-Za-z])")


def parse_leading_version(text: Any, source: str, *, fix: str = "") -> Version:
    """The release at the start of a program's ``--version`` line: its first word's
    dotted numeric part (``1.13.2.git.kitware.jobserver-pipe-1`` -> 1.13.2, as the
    ``ninja`` wheel prints; ``1.11.1`` -> 1.11.1).

    Raises:
        FormatError: not a string, or its first word does not start with a release.
    """
    if not isinstance(text, str):
        raise _fail(source, f"output {shown(text, 40)} is {_type_name(text)}, not text", fix)
    words = text[:4096].split(None, 1)
    m = _LEADING_VERSION_RE.match(words[0]) if words else None
    if not m:
        raise _fail(source, f"{shown(text)} does not start with a version such as 1.13.2", fix)
    return Version(m.group(1))


_NINJA_LOG_RE = re.compile(rb"# ninja log v([0-9]{1,4})")


def parse_ninja_log_header(line: Any, source: str, *, fix: str = "") -> int:
    """The format number of a ``.ninja_log`` from its first line, ``# ninja log v7``
    (ninja ``src/build_log.cc``: ``kFileSignature = "# ninja log v%d\\n"``).

    Raises:
        FormatError: not bytes/str, or not that header exactly.
    """
    if isinstance(line, str):
        line = line.encode("utf-8", "replace")
    m = _NINJA_LOG_RE.fullmatch(line.rstrip(b"\r\n")) if isinstance(line, (bytes, bytearray)) else None
    if not m:
        raise _fail(source, f"first line {shown(line, 40)} is not a ninja log header such as '# ninja log v7'",
                    fix)
    return int(m.group(1))


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


# ----------------------------------------------------------------------------- ELF files and tool output
# Read by the checks of what was built (flashinfer_sm120.verify) and by ``cache prune``: a
# module's ELF headers, cuobjdump's listings, FlashInfer's build.ninja variables, /proc maps.

__all__ += ["ElfInfo", "read_elf", "cuda_elf_sm", "parse_cuobjdump_list", "parse_cuobjdump_headers",
            "ninja_variables", "proc_maps_paths"]

_ELF_SECTION_CAP = 1 << 16   # section headers read at most
_ELF_STRTAB_CAP = 8 << 20    # bytes of a string table read at most
_ELF_DYN_CAP = 1 << 14       # dynamic entries read at most
_DT = {1: "needed", 14: "soname", 15: "rpath", 29: "runpath"}  # System V ABI, "Dynamic Section"


class ElfInfo:
    """What :func:`read_elf` read from a 64-bit ELF file (nothing else is kept).

    Attributes:
        path: the file.
        osabi, abi_version: ``e_ident[EI_OSABI]``, ``e_ident[EI_ABIVERSION]``.
        machine, flags: ``e_machine`` (62 x86-64, 183 AArch64, 190 CUDA), ``e_flags``.
        sections: ``{name: (type, offset, size)}`` from the section header table.
        needed: ``DT_NEEDED`` names, in order; soname: ``DT_SONAME`` or ``None``;
        rpath: ``DT_RPATH`` and ``DT_RUNPATH`` entries, split at ``:``.
    """

    __slots__ = ("path", "osabi", "abi_version", "machine", "flags", "sections", "needed", "soname", "rpath")

    def __init__(self, path, osabi, abi_version, machine, flags, sections, needed, soname, rpath):
        self.path, self.osabi, self.abi_version, self.machine, self.flags = path, osabi, abi_version, machine, flags
        self.sections, self.needed, self.soname, self.rpath = sections, needed, soname, rpath


def _pread(fd: int, size: int, offset: int, file_size: int, what: str, path: str) -> bytes:
    if offset < 0 or size < 0 or offset + size > file_size:
        raise _fail(path, f"{what} lies outside the file (offset {offset}, {size} bytes, file {file_size})",
                    "rebuild it; the file is truncated or not an ELF file")
    data = os.pread(fd, size, offset)
    if len(data) != size:
        raise _fail(path, f"{what} could not be read whole", "rebuild it")
    return data


def _cstr(table: bytes, offset: int) -> str:
    if not 0 <= offset < len(table):
        return ""
    end = table.find(b"\0", offset, offset + 4096)
    return table[offset: end if end >= 0 else offset + 4096].decode("utf-8", "replace")


def read_elf(path: str | os.PathLike) -> ElfInfo:
    """The header, section names and dynamic entries of a 64-bit ELF file (a ``.so``, a cubin),
    read with ``pread`` at the offsets the file gives, every offset checked against its size.

    Raises:
        FormatError: not a regular file, not a 64-bit ELF, or a table outside the file.
    """
    import struct

    path = os.fspath(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise _fail(path, f"cannot be opened ({exc.strerror or exc})", "") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _fail(path, "is not a regular file", "")
        size = st.st_size
        head = _pread(fd, 64, 0, size, "the ELF header", path) if size >= 64 else b""
        if head[:4] != b"\x7fELF" or head[4] != 2 or head[5] not in (1, 2):
            raise _fail(path, "is not a 64-bit ELF file", "")
        o = "<" if head[5] == 1 else ">"
        machine, = struct.unpack_from(o + "H", head, 18)
        shoff, = struct.unpack_from(o + "Q", head, 40)
        flags, = struct.unpack_from(o + "I", head, 48)
        shentsize, shnum, shstrndx = struct.unpack_from(o + "HHH", head, 58)
        sections: dict[str, tuple[int, int, int]] = {}
        raw: list[tuple[int, int, int, int, int]] = []  # name offset, type, offset, size, link
        if shoff:
            if shentsize != 64:
                raise _fail(path, f"has {shentsize}-byte section headers, not 64", "")
            first = _pread(fd, 64, shoff, size, "section header 0", path)
            if shnum == 0:  # extended numbering: the count is in section 0's sh_size
                shnum = struct.unpack_from(o + "Q", first, 32)[0]
            if shstrndx == 0xFFFF:
                shstrndx = struct.unpack_from(o + "I", first, 40)[0]
            if shnum > _ELF_SECTION_CAP:
                raise _fail(path, f"has {shnum} sections, more than {_ELF_SECTION_CAP}", "")
            table = _pread(fd, 64 * shnum, shoff, size, "the section header table", path)
            for i in range(shnum):
                name, typ, _f, _a, off, sz, link = struct.unpack_from(o + "IIQQQQI", table, 64 * i)
                raw.append((name, typ, off, sz, link))
        names = b""
        if raw and 0 < shstrndx < len(raw) and raw[shstrndx][1] != 8:  # SHT_NOBITS has no bytes
            names = _pread(fd, min(raw[shstrndx][3], _ELF_STRTAB_CAP), raw[shstrndx][2], size,
                           "the section name table", path)
        for name, typ, off, sz, _link in raw[1:]:
            sections.setdefault(_cstr(names, name), (typ, off, sz))
        dyn: dict[str, list[str]] = {"needed": [], "soname": [], "rpath": [], "runpath": []}
        dyn_sec = next((r for r in raw if r[1] == 6), None)  # SHT_DYNAMIC
        if dyn_sec is not None and 0 < dyn_sec[4] < len(raw):
            strtab = raw[dyn_sec[4]]
            strs = _pread(fd, min(strtab[3], _ELF_STRTAB_CAP), strtab[2], size, "the dynamic string table", path)
            count = min(dyn_sec[3] // 16, _ELF_DYN_CAP)
            entries = _pread(fd, 16 * count, dyn_sec[2], size, "the dynamic section", path)
            for i in range(count):
                tag, val = struct.unpack_from(o + "qQ", entries, 16 * i)
                if tag == 0:
                    break
                if tag in _DT:
                    dyn[_DT[tag]].append(_cstr(strs, val))
    except OSError as exc:
        raise _fail(path, f"cannot be read ({exc.strerror or exc})", "") from None
    finally:
        os.close(fd)
    rpath = tuple(p for v in dyn["rpath"] + dyn["runpath"] for p in v.split(":") if p)
    return ElfInfo(path, head[7], head[8], machine, flags, sections, tuple(dyn["needed"]),
                   dyn["soname"][0] if dyn["soname"] else None, rpath)


def cuda_elf_sm(info: ElfInfo) -> int | None:
    """The SM number (``120``) of a CUDA cubin's ELF header, or ``None`` for another ELF.

    LLVM ``llvm/include/llvm/BinaryFormat/ELF.h`` (``EF_CUDA_SM``, ``EF_CUDA_SM_MASK``,
    ``EF_CUDA_SM_OFFSET``) and ``ELFObjectFileBase::getNVPTXCPUName``: ABI version 7 keeps
    it in the low byte of ``e_flags``, later ones in bits 8-15.  The ``a``/``f`` suffix is
    not in ``e_flags`` (measured: sm_120, sm_120a and sm_120f cubins of nvcc 13.5 carry
    the same flags), so it is never guessed from here.
    """
    if info.machine != 190:  # EM_CUDA
        return None
    sm = info.flags & 0xFF if info.abi_version <= 7 else (info.flags >> 8) & 0xFF
    return sm or None


_CUOBJ_LIST_RE = re.compile(r"^(ELF|PTX) file\s+\d+:\s+(\S+)$")
_CUOBJ_TARGET_RE = re.compile(r"\.(sm_[0-9]{2,3}[af]?)\.(?:cubin|ptx)$")
_CUOBJ_ARCH_RE = re.compile(r"^arch = (sm_[0-9]{2,3}[af]?)$")


def _tool_text(text: Any, source: str, cap: int) -> list[str]:
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8", "replace")
    if not isinstance(text, str):
        raise _fail(source, f"printed {_type_name(text)}, not text", "")
    if len(text) > cap:
        raise _fail(source, f"printed {len(text)} characters, more than {cap}", "")
    if "Usage  : cuobjdump" in text or "Usage: cuobjdump" in text:
        raise _fail(source, "printed its usage instead of a listing", "use a cuobjdump of CUDA 12 or later")
    return text.splitlines()


def parse_cuobjdump_list(text: Any, source: str) -> list[tuple[str, str]]:
    """``cuobjdump --list-elf --list-ptx`` output as ``[("SASS", "sm_120"), ("PTX", "compute_120a")]``.

    The target is read from the file name cuobjdump gives (``k.1.sm_120.cubin``;
    a 120f cubin is listed as ``sm_120``: use :func:`parse_cuobjdump_headers` for the
    suffix).  Lines of another form (``cuobjdump info : ...``) are skipped.

    Raises:
        FormatError: not text, larger than 4 MiB, or cuobjdump's usage text.
    """
    out = []
    for line in _tool_text(text, source, 4 << 20):
        m = _CUOBJ_LIST_RE.match(line.strip())
        if m:
            t = _CUOBJ_TARGET_RE.search(m.group(2))
            if t:
                kind = "SASS" if m.group(1) == "ELF" else "PTX"
                out.append((kind, t.group(1) if kind == "SASS" else "compute_" + t.group(1)[3:]))
    return out


def parse_cuobjdump_headers(text: Any, source: str) -> list[tuple[str, str]]:
    """The fatbin headers ``cuobjdump FILE`` prints (``Fatbin elf code:`` ... ``arch = sm_120f``)
    as ``[("SASS", "sm_120f"), ("PTX", "compute_120a")]``: exact targets, suffix included.

    Raises:
        FormatError: as :func:`parse_cuobjdump_list`.
    """
    out, kind = [], None
    for line in _tool_text(text, source, 16 << 20):
        line = line.strip()
        if line.startswith("Fatbin ") and line.endswith(" code:"):
            kind = {"elf": "SASS", "ptx": "PTX"}.get(line.split()[1])
            continue
        m = _CUOBJ_ARCH_RE.match(line)
        if m and kind:
            out.append((kind, m.group(1) if kind == "SASS" else "compute_" + m.group(1)[3:]))
            kind = None
    return out


def ninja_variables(text: Any, source: str, *, max_bytes: int = 4 << 20) -> dict[str, str]:
    """Top-level ``name = value`` lines of a ``build.ninja`` (``$``-newline continuations
    joined), e.g. ``cuda_home`` and ``common_cflags`` of FlashInfer's generated file
    (``flashinfer/jit/cpp_ext.py`` ``generate_ninja_build_for_op``).  Rules, builds and
    indented (scoped) variables are skipped; ``$`` escapes are left as written.

    Raises:
        FormatError: not text, or larger than ``max_bytes``.
    """
    if not isinstance(text, str) or len(text) > max_bytes:
        raise _fail(source, "is not build.ninja text of a sane size", "")
    out: dict[str, str] = {}
    for line in re.sub(r"\$\n[ \t]*", "", text).splitlines():  # ninja: "$" newline, indent dropped
        m = re.match(r"^([A-Za-z_][A-Za-z0-9_.-]*)\s*=\s?(.*)$", line)
        if m:
            out[m.group(1)] = m.group(2).strip()
    return out


def proc_maps_paths(text: Any, source: str) -> set[str]:
    """The file paths mapped in a ``/proc/<pid>/maps`` text (`` (deleted)`` dropped).

    Raises:
        FormatError: not text or larger than 64 MiB.
    """
    if not isinstance(text, str) or len(text) > 64 << 20:
        raise _fail(source, "is not /proc maps text of a sane size", "")
    out = set()
    for line in text.splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[5].startswith("/"):
            out.add(parts[5].removesuffix(" (deleted)"))
    return out
