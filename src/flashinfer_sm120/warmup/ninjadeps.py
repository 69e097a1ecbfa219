"""Restamp output mtimes in a ninja deps log (``.ninja_deps``, format version 4).

Ninja stores, per output, the output's mtime next to its header dependencies and
treats the output as dirty when that mtime differs from the file's ("stored deps
info out of date", ninja src/graph.cc ``ImplicitDepLoader::LoadDeps``).  Layout
(ninja src/deps_log.cc): ``"# ninjadeps\\n"``, int32 version 4, then records,
each a uint32 size (high bit set for a deps record) and a payload: a path record is
the NUL-padded path and a uint32 checksum; a deps record is int32 output id, the
output mtime as two uint32 (low, high; nanoseconds on Linux) and int32 input ids.
"""

from __future__ import annotations

import os
import struct

from flashinfer_sm120.safety.formats.reads import read_bytes
from flashinfer_sm120.safety.fs.atomic import write_atomic
from flashinfer_sm120.errors import FormatError

__all__ = ["restamp", "MAX_DEPS_BYTES"]

#: Largest deps log rewritten (bytes); a module's is a few hundred KiB.
MAX_DEPS_BYTES = 256 << 20

_HEADER = b"# ninjadeps\n"


def restamp(path: str, mtimes_ns: dict[str, int]) -> int:
    """Set the recorded mtime of each output in ``mtimes_ns`` (absolute path -> ns).

    :returns: how many records were changed; 0 if the log is missing, not version 4, not a
        regular file, a symlink or over :data:`MAX_DEPS_BYTES` (left untouched).
    :raises OSError: the log cannot be read or rewritten.
    """
    if not os.path.lexists(path):
        return 0
    try:  # bounded, never through a link, never a FIFO (read_bytes)
        data = bytearray(read_bytes(path, MAX_DEPS_BYTES, follow=False))
    except FormatError:
        return 0
    if not data.startswith(_HEADER) or len(data) < 16 or struct.unpack_from("<i", data, 12)[0] != 4:
        return 0
    ids: list[str] = []
    pos, changed = 16, 0
    while pos + 4 <= len(data):
        (size,) = struct.unpack_from("<I", data, pos)
        is_deps, size = bool(size & 0x80000000), size & 0x7FFFFFFF
        body = pos + 4
        if body + size > len(data):
            break  # a truncated last record: ninja ignores it too
        if size % 4 or size < (12 if is_deps else 8):
            # threat-model: P6 -- not a record ninja writes (a deps record holds its output id and an
            # 8-byte mtime, a path record a padded path and a checksum, both whole 4-byte words): the
            # log travels in exports, and such a record raised struct.error or had the mtime written
            # over the next record.  The whole log is left untouched.
            return 0
        if is_deps:
            (out_id,) = struct.unpack_from("<i", data, body)
            if 0 <= out_id < len(ids) and ids[out_id] in mtimes_ns:
                ns = mtimes_ns[ids[out_id]]
                struct.pack_into("<II", data, body + 4, ns & 0xFFFFFFFF, (ns >> 32) & 0xFFFFFFFF)
                changed += 1
        else:
            ids.append(bytes(data[body:body + size - 4]).rstrip(b"\0").decode(errors="surrogateescape"))
        pos = body + size
    if changed:
        write_atomic(path, data, mode=0o644)
    return changed
