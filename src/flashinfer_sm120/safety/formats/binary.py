"""What ``doctor`` reads of a build, with bounds (threat-model: P6): a ninja log's header."""

from __future__ import annotations

import re
from typing import Any

from flashinfer_sm120.safety.formats.base import _fail, shown


_NINJA_LOG_RE = re.compile(rb"# ninja log v([0-9]{1,4})")


def parse_ninja_log_header(line: Any, source: str, *, fix: str = "") -> int:
    """The format of a ``.ninja_log`` from its first line, ``# ninja log v7`` (ninja ``src/build_log.cc``)."""
    if isinstance(line, str):
        line = line.encode("utf-8", "replace")
    m = _NINJA_LOG_RE.fullmatch(line.rstrip(b"\r\n")) if isinstance(line, (bytes, bytearray)) else None
    if not m:
        raise _fail(source, f"first line {shown(line, 40)} is not a ninja log header such as '# ninja log v7'",
                    fix)
    return int(m.group(1))
