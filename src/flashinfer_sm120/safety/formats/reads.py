"""The one bounded reader of files: size caps enforced while reading, depth-bounded JSON; boolean variables.
Streamed lines, typed fields and checked text are in :mod:`.fields` (not loaded by a server's replay)."""
# threat-model: P6 (every read of outside input bounded in bytes, depth and kind of file)

from __future__ import annotations

import errno
import json
import os
import re
import stat
from collections.abc import Mapping
from typing import Any

from flashinfer_sm120.safety.formats.base import _fail, shown

#: Deepest JSON nesting accepted; everything we write is at most 4 deep.
MAX_JSON_DEPTH = 32
#: Largest state file of ours read (bytes): anything larger is not ours and is rewritten.
MAX_STATE_BYTES = 1 << 20

#: One token of the depth scan: a string (its closing quote optional: an unterminated one ends the
#: scan rather than being retried from every later quote) or a bracket; one pass, no backtracking.
_DEPTH_TOKEN_RE = re.compile(r'"(?:[^"\\]+|\\.)*(?:"|\\?\Z)|[\[\]{}]', re.S)


def _open_regular(path: str, fix: str, follow: bool = True,
                  owners: tuple[int, ...] | None = None) -> tuple[int, os.stat_result]:
    """A blocking fd on the regular file ``path``, opened without waiting on a FIFO (P6), owned by ``owners``."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow:
            raise _fail(path, "is a symlink, which is never followed here", fix) from None
        raise _fail(path, f"cannot be opened ({exc.strerror or exc})", fix) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # the caller's fix is for content: this one is for the path (P8)
            raise _fail(path, f"is not a regular file (mode {stat.filemode(st.st_mode)}; only regular files are "
                              f"read)", "give the path of the file itself")
        if owners is not None and st.st_uid not in owners:
            raise _fail(path, f"is owned by uid {st.st_uid}, not {' or '.join(map(str, owners))}", fix)
        os.set_blocking(fd, True)
    except BaseException as exc:
        os.close(fd)
        if isinstance(exc, OSError):
            raise _fail(path, f"cannot be read ({exc.strerror or exc})", fix) from None
        raise
    return fd, st


def read_bytes(path: str | os.PathLike, max_bytes: int, *, fix: str = "", follow: bool = True,
               owners: tuple[int, ...] | None = None, prefix: bool = False) -> bytes:
    """The whole of a regular file, refused past ``max_bytes`` while reading (``prefix``: its first bytes only)."""
    path = os.fspath(path)
    fd, st = _open_regular(path, fix, follow, owners)
    chunks, left = [], max_bytes + (0 if prefix else 1)
    try:
        if st.st_size > max_bytes and not prefix:
            raise _fail(path, f"is {st.st_size} bytes, more than the {max_bytes}-byte cap", fix)
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
    if left == 0 and not prefix:
        raise _fail(path, f"is more than the {max_bytes}-byte cap", fix)
    return b"".join(chunks)


def read_text(path: str | os.PathLike, max_bytes: int, *, follow: bool = True) -> str:
    """:func:`read_bytes` decoded as UTF-8 (refused, not replaced, when it is not)."""
    raw = read_bytes(path, max_bytes, follow=follow)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _fail(os.fspath(path), f"is not UTF-8 text (byte {exc.start})", "") from None


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _bounded_int(text: str) -> int:
    """An integer of at most 64 digits (P6, P8: Python's own refusal past 4,300 names an interpreter setting)."""
    if len(text.lstrip("-")) > 64:
        raise ValueError(f"a number of {len(text.lstrip('-'))} digits, more than the 64 accepted")
    return int(text)


def json_depth(text: str) -> int:
    """Deepest ``[``/``{`` nesting of JSON text, strings skipped, in one linear pass without recursion."""
    depth = deepest = 0
    for m in _DEPTH_TOKEN_RE.finditer(text):
        tok = m.group()
        if tok[0] == '"':
            continue
        if tok in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def loads_json(data: str | bytes, source: str, *, max_depth: int = MAX_JSON_DEPTH, fix: str = "") -> Any:
    """JSON from an untrusted ``source``: UTF-8, no ``NaN``/``Infinity``, at most ``max_depth`` deep."""
    if isinstance(data, (bytes, bytearray)):
        try:
            data = bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _fail(source, f"is not UTF-8 (byte {exc.start})", fix) from None
    depth = json_depth(data)
    if depth > max_depth:
        raise _fail(source, f"is JSON nested {depth} deep, more than the {max_depth} accepted", fix)
    try:
        return json.loads(data, parse_constant=_refuse_constant, parse_int=_bounded_int)
    except (ValueError, RecursionError) as exc:
        raise _fail(source, f"is not valid JSON ({shown(str(exc), 120)})", fix) from None


def read_json_file(path: str | os.PathLike, max_bytes: int, *, fix: str = "", follow: bool = True,
                   owners: tuple[int, ...] | None = None) -> Any:
    """:func:`read_bytes` then :func:`loads_json`, one message style for both."""
    raw = read_bytes(path, max_bytes, fix=fix, follow=follow, owners=owners)
    return loads_json(raw, os.fspath(path), fix=fix)


#: Values of a boolean environment variable that mean "off" (case-insensitive, stripped; the ``.pth`` hook
#: keeps its own copy, which tests/integration/test_autoload.py checks agrees).
FALSE_VALUES = ("", "0", "false", "no", "off")


def env_flag(name: str, env: Mapping[str, str] | None = None) -> bool:
    """Whether boolean variable ``name`` is on in ``env`` (default ``os.environ``)."""
    env = os.environ if env is None else env
    return env.get(name, "").strip().lower() not in FALSE_VALUES
