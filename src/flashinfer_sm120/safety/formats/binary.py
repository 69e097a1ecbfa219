"""What ``doctor`` and ``cache prune`` read of a build, with bounds (threat-model: P6): FlashInfer's build.ninja
variables, a ninja log's header, /proc maps."""

from __future__ import annotations

import re
from typing import Any

from flashinfer_sm120.safety.formats.base import _fail, shown


def ninja_variables(text: Any, source: str, *, max_bytes: int = 4 << 20) -> dict[str, str]:
    """Top-level ``name = value`` lines of a ``build.ninja`` (FlashInfer's ``cuda_home``), ``$`` continuations joined."""
    if not isinstance(text, str) or len(text) > max_bytes:
        raise _fail(source, "is not build.ninja text of a sane size", "")
    out: dict[str, str] = {}
    for line in re.sub(r"\$\n[ \t]*", "", text).splitlines():  # ninja: "$" newline, indent dropped
        m = re.match(r"^([A-Za-z_][A-Za-z0-9_.-]*)\s*=\s?(.*)$", line)
        if m:
            out[m.group(1)] = m.group(2).strip()
    return out


def proc_maps_paths(text: Any, source: str) -> set[str]:
    """The file paths mapped in a ``/proc/<pid>/maps`` text of at most 64 MiB (`` (deleted)`` dropped)."""
    if not isinstance(text, str) or len(text) > 64 << 20:
        raise _fail(source, "is not /proc maps text of a sane size", "")
    out = set()
    for line in text.splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[5].startswith("/"):
            out.add(parts[5].removesuffix(" (deleted)"))
    return out


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
