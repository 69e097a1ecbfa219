"""Manifest entries: one JIT module as JSON that another machine can turn back into the same spec.

An entry holds the FlashInfer version, the module name, the targets it was built
for, and the spec's own fields (sources, flags, include dirs; FlashInfer 0.7.4
``flashinfer/jit/core.py`` ``JitSpecNvcc``) with machine paths replaced by
placeholders (``@FLASHINFER@`` for the installed package, ``@GEN@`` for FlashInfer's
generated-source dir, ``@JIT@`` for its JIT dir).  Sources FlashInfer generated from
templates (attention variants) are carried in the entry, so the builder needs no GPU
and no call path: it writes them back and FlashInfer's own ``write_ninja`` does the rest.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..errors import Sm120Error

__all__ = ["FORMAT", "CannotRegenerate", "encode", "make_spec", "read", "key", "MAX_LINE_BYTES"]

FORMAT = 1
#: Largest manifest line accepted (bytes); generated sources are bounded well below.
MAX_LINE_BYTES = 8 << 20
_MAX_GENERATED_BYTES = 4 << 20


class CannotRegenerate(Sm120Error):
    """This FlashInfer cannot regenerate a manifest entry; the message says why."""


def _roots() -> list[tuple[str, str]]:
    from flashinfer.jit import env as jit_env

    pkg = Path(jit_env.__file__).resolve().parents[1]
    pairs = [("@GEN@", jit_env.FLASHINFER_GEN_SRC_DIR), ("@JIT@", jit_env.FLASHINFER_JIT_DIR),
             ("@FLASHINFER@", pkg)]
    out = []
    for token, path in pairs:
        for form in {str(path), str(Path(path).resolve())}:
            out.append((token, form))
    return sorted(out, key=lambda x: -len(x[1]))


def _to_portable(value: Any, roots) -> Any:
    if isinstance(value, (str, Path)):
        s = str(value)
        for token, root in roots:
            if s == root or s.startswith(root + os.sep):
                return token + s[len(root):]
            if root + os.sep in s:  # a flag such as -I/path
                return s.replace(root, token)
        return s
    if isinstance(value, (list, tuple)):
        return [_to_portable(v, roots) for v in value]
    return value


def _from_portable(value: Any, roots: dict[str, str]) -> Any:
    if isinstance(value, str):
        for token, root in roots.items():
            value = value.replace(token, root)
        return value
    if isinstance(value, list):
        return [_from_portable(v, roots) for v in value]
    return value


def key(entry: dict) -> tuple:
    """What makes two entries the same module: FlashInfer version, name and targets."""
    return (entry.get("flashinfer"), entry.get("name"), tuple(entry.get("targets") or ()))


def encode(spec, flashinfer_version: str, targets: list[str]) -> dict:
    """The manifest entry for ``spec`` (a FlashInfer ``JitSpec``).  Never raises for an
    unusual spec: one this module cannot carry gets ``"regenerable": false`` and ``"why"``."""
    entry: dict[str, Any] = {"format": FORMAT, "flashinfer": flashinfer_version, "name": spec.name,
                             "targets": sorted(targets), "toolchain": getattr(spec, "toolchain", "unknown")}
    if entry["toolchain"] != "nvcc" or not hasattr(spec, "sources"):
        entry.update(regenerable=False, why=f"toolchain {entry['toolchain']!r} is not built by nvcc/ninja")
        return entry
    if getattr(spec, "embedded_cubin_factory", None) is not None:
        entry.update(regenerable=False, why="it embeds cubins made by a Python callback at build time")
        return entry
    roots = _roots()
    gen_root = dict((t, r) for t, r in roots)["@GEN@"]
    by_source = getattr(spec, "extra_cuda_cflags_by_source", None) or {}
    entry["spec"] = {
        "sources": _to_portable(list(spec.sources), roots),
        "extra_cflags": _to_portable(spec.extra_cflags, roots),
        "extra_cuda_cflags": _to_portable(spec.extra_cuda_cflags, roots),
        "extra_ldflags": _to_portable(spec.extra_ldflags, roots),
        "extra_include_dirs": _to_portable(spec.extra_include_dirs, roots),
        "needs_device_linking": bool(spec.needs_device_linking),
        "extra_cuda_cflags_by_source": [[_to_portable(k, roots), _to_portable(v, roots)]
                                        for k, v in by_source.items()],
    }
    dirs = {Path(s).parent for s in spec.sources if str(s).startswith(gen_root)}
    dirs |= {Path(d) for d in (spec.extra_include_dirs or []) if str(d).startswith(gen_root)}
    generated, size = {}, 0
    for d in sorted(dirs):
        for f in sorted(d.iterdir()) if d.is_dir() else ():
            if f.is_file() and not f.is_symlink():
                try:
                    data = f.read_text(errors="strict")
                except UnicodeDecodeError:
                    entry.update(regenerable=False, why=f"generated file {f.name} is not text")
                    entry.pop("spec")
                    return entry
                size += len(data)
                if size > _MAX_GENERATED_BYTES:
                    entry.update(regenerable=False, why="its generated sources exceed 4 MiB")
                    entry.pop("spec")
                    return entry
                generated[_to_portable(f, roots)] = data
    entry["generated"] = generated
    entry["regenerable"] = True
    return entry


def _safe_generated_path(portable: str, roots: dict[str, str]) -> Path:
    if not portable.startswith("@GEN@/"):
        raise CannotRegenerate(f"generated file {portable!r} is outside FlashInfer's generated dir")
    rel = Path(portable[len("@GEN@/"):])
    if rel.is_absolute() or ".." in rel.parts:
        raise CannotRegenerate(f"generated file {portable!r} escapes FlashInfer's generated dir")
    return Path(roots["@GEN@"]) / rel


def make_spec(entry: dict, flashinfer_version: str):
    """Rebuild the FlashInfer ``JitSpecNvcc`` for ``entry`` and write back its generated
    sources (only when their content differs, like FlashInfer's ``write_if_different``).

    :raises CannotRegenerate: another FlashInfer release, another toolchain, a source
        missing here, or a malformed entry (the message names which).
    """
    name = entry.get("name")
    if entry.get("format") != FORMAT or not isinstance(name, str) or not name:
        raise CannotRegenerate(f"entry format {entry.get('format')!r} is not {FORMAT}")
    if "/" in name or name in (".", ".."):
        raise CannotRegenerate(f"module name {name!r} is not a plain name")
    if not entry.get("regenerable"):
        raise CannotRegenerate(entry.get("why") or "recorded as not regenerable")
    if entry.get("flashinfer") != flashinfer_version:
        raise CannotRegenerate(f"recorded with FlashInfer {entry.get('flashinfer')}, this is "
                               f"{flashinfer_version}; record again with {flashinfer_version}")
    from flashinfer.jit import core
    from flashinfer.jit.utils import write_if_different

    roots = {t: r for t, r in _roots()[::-1]}  # the unresolved form wins (FlashInfer's own)
    s = entry["spec"]
    for portable, text in (entry.get("generated") or {}).items():
        path = _safe_generated_path(portable, roots)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_if_different(path, text)
    sources = [Path(p) for p in _from_portable(s["sources"], roots)]
    missing = [str(p) for p in sources if not p.exists()]
    if missing:
        raise CannotRegenerate(f"source {missing[0]} does not exist here")
    by_source = {Path(_from_portable(k, roots)): _from_portable(v, roots)
                 for k, v in s.get("extra_cuda_cflags_by_source") or []}
    inc = _from_portable(s.get("extra_include_dirs"), roots)
    return core.JitSpecNvcc(
        name=name, sources=sources,
        extra_cflags=_from_portable(s.get("extra_cflags"), roots),
        extra_cuda_cflags=_from_portable(s.get("extra_cuda_cflags"), roots),
        extra_ldflags=_from_portable(s.get("extra_ldflags"), roots),
        extra_include_dirs=[Path(p) for p in inc] if inc is not None else None,
        needs_device_linking=bool(s.get("needs_device_linking")),
        extra_cuda_cflags_by_source=by_source or None,
    )


def read(path: str) -> tuple[list[dict], list[str]]:
    """Entries of a manifest file, first occurrence of each :func:`key` kept, in order.

    :returns: ``(entries, problems)``; a problem names the line that was skipped and why.
    :raises OSError: the file cannot be opened.
    """
    entries, problems, seen = [], [], set()
    with open(path, "rb") as f:
        for no, raw in enumerate(f, 1):
            if len(raw) > MAX_LINE_BYTES:
                problems.append(f"{path}:{no}: line longer than {MAX_LINE_BYTES} bytes, skipped")
                continue
            if not raw.strip():
                continue
            try:
                entry = json.loads(raw)
                if not isinstance(entry, dict):
                    raise ValueError("not an object")
            except ValueError as exc:
                problems.append(f"{path}:{no}: not a JSON object ({exc}), skipped")
                continue
            k = key(entry)
            if k not in seen:
                seen.add(k)
                entries.append(entry)
    return entries, problems
