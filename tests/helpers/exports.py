"""Fake `cache export` output: a directory export of one module (:func:`make_export`) and the same as an
archive (:func:`as_archive`), with the layout and ``meta.json`` that ``cache import`` reads."""

from __future__ import annotations

import hashlib
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
