"""The two files a user may mix up, told apart cheaply (first bytes, first line, a folder's name): a manifest
recorded with ``FLASHINFER_SM120_RECORD`` (``build --from``) and an export (``cache import``), so a refusal of
one names the command the other takes (P8)."""

from __future__ import annotations

import os
import shlex

from flashinfer_sm120.errors import FormatError
from flashinfer_sm120.safety.formats.reads import loads_json, read_bytes
from flashinfer_sm120.safety.formats.tar import compression

#: The one top-level folder of an export (directory or archive).
TOP = "flashinfer-sm120-cache"


def _kind(path: str) -> str | None:
    """``export``, ``inner`` (the folder ``TOP`` inside an exported directory), ``manifest`` or ``None``."""
    if os.path.isdir(path):
        if os.path.isfile(os.path.join(path, TOP, "meta.json")):
            return "export"
        inner = os.path.basename(os.path.normpath(path)) == TOP and os.path.isfile(os.path.join(path, "meta.json"))
        return "inner" if inner else None
    try:
        head = read_bytes(path, 64 << 10, prefix=True)  # a regular file only, never a FIFO waited on (P6)
        if compression(head[:512]) in ("gzip", "tar"):
            return "export"
        entry = loads_json(head.split(b"\n", 1)[0], path)
    except FormatError:
        return None
    return "manifest" if isinstance(entry, dict) and {"format", "name", "flashinfer"} <= entry.keys() else None


def instead(path: str, wanted: str) -> tuple[str, str] | None:
    """``(message, fix)`` when ``path``, given as a ``wanted`` (``manifest`` or ``export``), is the other kind or
    the folder inside an export; else ``None`` (the caller's own refusal stands)."""
    kind = _kind(path)
    if kind == "inner":
        parent = os.path.dirname(os.path.normpath(os.path.abspath(path)))
        kind, path, inside = "export", parent, f"{path} is the {TOP} folder of the export {parent}"
    else:
        inside = ""
    if wanted == "manifest" and kind == "export":
        return (inside or f"{path} is an export written by 'flashinfer-sm120 cache export', not a manifest",
                f"install it with 'flashinfer-sm120 cache import {shlex.quote(path)}'")
    if wanted == "export" and inside:
        return inside, f"give the directory cache export wrote: 'flashinfer-sm120 cache import {shlex.quote(path)}'"
    if wanted == "export" and kind == "manifest":
        return (f"{path} is a manifest recorded with FLASHINFER_SM120_RECORD, not an export",
                f"build its modules with 'flashinfer-sm120 build --from {shlex.quote(path)}' (then "
                f"'flashinfer-sm120 cache export OUT --from {shlex.quote(path)}' writes an export)")
    return None
