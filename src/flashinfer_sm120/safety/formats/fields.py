"""Bounded reads of structured input: streamed lines of a file, typed fields of parsed JSON, checked text of
variables (the rest of the one bounded reader, :mod:`.reads`)."""
# threat-model: P6 (every read of outside input bounded in bytes, depth and kind of file)

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from typing import Any

from flashinfer_sm120.errors import FormatError
from flashinfer_sm120.safety.formats.base import _TYPE_NAMES, _fail, _type_name, shown, some
from flashinfer_sm120.safety.formats.reads import _open_regular


def iter_lines(path: str | os.PathLike, *, max_line: int, max_lines: int, fix: str = "",
               skip_long: bool = False) -> Iterator[tuple[int, bytes | None]]:
    """``(number, line)`` of a regular file, streamed; a line over ``max_line`` is refused (``skip_long``: ``None``)."""
    path = os.fspath(path)
    fd, _ = _open_regular(path, fix)
    try:
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


def field(obj: Any, key: str, kind: type | tuple[type, ...], source: str, *, fix: str = "",
          default: Any = ..., max_len: int | None = None) -> Any:
    """``obj[key]`` of ``kind`` (``bool`` is no ``int``, numbers finite), at most ``max_len``; ``default`` when absent."""
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


def check_text(value: Any, name: str, *, max_len: int = 4096, fix: str = "") -> str:
    """``value`` if it is a string of at most ``max_len`` characters, no control character but tab."""
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
    """``env[name]`` (default ``os.environ``) by :func:`check_text`, or ``None`` when unset."""
    value = (os.environ if env is None else env).get(name)
    if value is None:
        return None
    return check_text(value, name, max_len=max_len)
