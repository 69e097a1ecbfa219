"""Fake `cache export` output: a directory export of one module (:func:`make_export`) and the same as an
archive (:func:`as_archive`), with the layout and ``meta.json`` that ``cache import`` reads; and the one
set of tar builders the tests use, well-formed (:func:`tar_bytes`) or hand-made (:func:`tar_header`)."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from pathlib import Path

TOP = "flashinfer-sm120-cache"


def sha(data_or_size) -> str:
    h = hashlib.sha256()
    if isinstance(data_or_size, int):
        block = bytes(1 << 20)
        left = data_or_size
        while left:
            h.update(block[:min(left, len(block))])
            left -= min(left, len(block))
    else:
        h.update(data_or_size)
    return h.hexdigest()


def make_export(where: Path, files: dict[str, bytes | int], name: str | None = "m") -> Path:
    """A directory export of one module ``name`` (``None``: one module per folder under ``jit/``):
    ``files`` maps paths under the export's top folder to their bytes, or to a size for a sparse file
    of zeros."""
    top = where / TOP
    for rel, data in files.items():
        p = top / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, int):
            with open(p, "wb") as fh:
                fh.truncate(data)
        else:
            p.write_bytes(data)
    meta = {"format": 1, "fingerprint": {"flashinfer": "0.7.4", "targets": ["12.0f"], "cuda_version": "13.0",
                                         "cuda_home": "/usr/local/cuda", "jit_dir": "/nowhere"},
            "modules": [{"name": n, "files": {rel: sha(d) for rel, d in files.items()
                                              if name is not None or rel.split("/")[1] == n}}
                        for n in ([name] if name is not None else sorted({r.split("/")[1] for r in files}))]}
    (top / "meta.json").write_bytes(json.dumps(meta).encode())
    return where


def as_archive(export: Path, out: Path) -> Path:
    """The directory export as `cache export` writes an archive: meta.json first."""
    with tarfile.open(out, "w:gz", compresslevel=1) as tar:
        tar.add(export / TOP / "meta.json", f"{TOP}/meta.json")
        for p in sorted((export / TOP).rglob("*")):
            if p.is_file() and p.name != "meta.json":
                tar.add(p, f"{TOP}/{p.relative_to(export / TOP)}")
    return out


# ---------------------------------------------------------------- tar archives, well-formed or hand-made


def tar_member(name: str, data: bytes | None = b"x", *, kind=tarfile.REGTYPE, link: str = "",
               pax: dict | None = None) -> tuple[tarfile.TarInfo, bytes | None]:
    """One member for :func:`tar_bytes`: a regular file of ``data``, or a directory/link (``kind``)."""
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    info.size = len(data or b"") if kind == tarfile.REGTYPE else 0
    if pax:
        info.pax_headers = pax
    return info, (data if kind == tarfile.REGTYPE else None)


def tar_bytes(members, *, gz: bool = False) -> bytes:
    """A pax-format tar of ``members`` (:func:`tar_member`), gzip-compressed with ``gz``."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return gzip.compress(buf.getvalue(), compresslevel=1) if gz else buf.getvalue()


def tar_header(name: str, size: int, kind: bytes = b"0", *, raw_tail: bytes = b"") -> bytes:
    """One hand-made ustar header block (checksum filled in) declaring ``size`` bytes, no data;
    ``raw_tail`` overwrites bytes 345.. (old GNU sparse fields live there)."""
    b = bytearray(512)
    b[0:len(name)] = name.encode()
    b[100:108] = b"0000644\0"
    b[108:116] = b"0000000\0"
    b[116:124] = b"0000000\0"
    b[124:136] = b"%011o\0" % size
    b[136:148] = b"00000000000\0"
    b[148:156] = b" " * 8
    b[156:157] = kind
    b[257:265] = b"ustar  \0" if kind == b"S" else b"ustar\x0000"
    if raw_tail:
        b[345:345 + len(raw_tail)] = raw_tail
    b[148:156] = b"%06o\0 " % sum(b)
    return bytes(b)


def tar_file(name: str = f"{TOP}/meta.json", data: bytes = b"{}") -> bytes:
    """A hand-made regular member: :func:`tar_header` and ``data`` padded to a block."""
    return tar_header(name, len(data)) + data + b"\0" * (-len(data) % 512)


def pax_header(records: bytes) -> bytes:
    """A hand-made pax extended header holding ``records`` (:func:`pax_record`)."""
    return tar_header("././@PaxHeader", len(records), b"x") + records + b"\0" * (-len(records) % 512)


def pax_record(key: bytes, value: bytes) -> bytes:
    body = b" " + key + b"=" + value + b"\n"
    n = len(body) + 1
    while len(str(n).encode()) + len(body) != n:
        n += 1
    return str(n).encode() + body
