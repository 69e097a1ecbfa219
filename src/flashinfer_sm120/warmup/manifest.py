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

import os
from pathlib import Path
from typing import Any

from .. import formats
from ..errors import FormatError, Sm120Error

__all__ = ["FORMAT", "CannotRegenerate", "encode", "make_spec", "parse_entry", "read", "key", "MAX_LINE_BYTES",
           "MAX_LINES"]

FORMAT = 1
#: Largest manifest line accepted (bytes); generated sources are bounded well below.
MAX_LINE_BYTES = 8 << 20
#: Most lines read from one manifest (one per module and worker process).
MAX_LINES = 100_000
_MAX_GENERATED_BYTES = 4 << 20
_MAX_TARGETS = 32
_FLAG_LISTS = ("extra_cflags", "extra_cuda_cflags", "extra_ldflags")


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


def parse_entry(obj: Any, source: str) -> dict:
    """One manifest entry, checked field by field against its grammar
    (:mod:`flashinfer_sm120.formats`), returned as a new dict of the same shape.

    Names are :func:`~flashinfer_sm120.formats.parse_name` (no whitespace, ``$``,
    ``:``, ``/``, NUL: they become ``build.ninja`` paths), targets
    :func:`~flashinfer_sm120.formats.parse_target`, flags
    :func:`~flashinfer_sm120.formats.parse_compile_flag` (options FlashInfer uses, never one that
    names a program, plugin or output file), paths
    :func:`~flashinfer_sm120.formats.parse_path_text`, generated files
    ``@GEN@/`` plus a relative path of names.

    Raises:
        FormatError: naming ``source``, the key and the offending value (cut short).
    """
    fix = "record the manifest again with FLASHINFER_SM120_RECORD"
    f = formats.field
    if not isinstance(obj, dict):
        raise FormatError(f"{source}: holds {type(obj).__name__}, not a JSON object; {fix}")
    fmt = f(obj, "format", int, source, fix=fix)
    if fmt != FORMAT:
        raise FormatError(f"{source}: entry format {fmt} is not {FORMAT}; {fix} with this release")
    out: dict[str, Any] = {"format": fmt}
    out["name"] = formats.parse_name(f(obj, "name", str, source, fix=fix), f"{source} 'name'", fix=fix)
    out["flashinfer"] = str(formats.parse_version(f(obj, "flashinfer", str, source, fix=fix),
                                                  f"{source} 'flashinfer'", fix=fix))
    targets = f(obj, "targets", list, source, fix=fix, max_len=_MAX_TARGETS)
    out["targets"] = [formats.parse_target(t, f"{source} 'targets'", fix=fix) for t in targets]
    out["toolchain"] = formats.parse_name(f(obj, "toolchain", str, source, default="unknown", fix=fix),
                                          f"{source} 'toolchain'", fix=fix)
    out["regenerable"] = f(obj, "regenerable", bool, source, default=False, fix=fix)
    why = f(obj, "why", str, source, default=None, fix=fix, max_len=1000)
    if why is not None:
        out["why"] = why
    pid = f(obj, "pid", int, source, default=None, fix=fix)
    if pid is not None:
        out["pid"] = pid
    server = f(obj, "server", str, source, default=None, fix=fix)  # servers.recorded(): the process it came from
    if server is not None:
        out["server"] = formats.parse_name(server, f"{source} 'server'", fix=fix)
    base = f(obj, "workspace_base", (str, type(None)), source, default=None, fix=fix)
    if base is not None:
        out["workspace_base"] = formats.parse_path_text(base, f"{source} 'workspace_base'", fix=fix)
    if not out["regenerable"]:
        return out
    spec_src = f"{source} 'spec'"
    spec = f(obj, "spec", dict, source, fix=fix)
    sources = formats.string_list(f(spec, "sources", list, spec_src, fix=fix), f"{spec_src} 'sources'", fix=fix)
    clean: dict[str, Any] = {"sources": [formats.parse_path_text(p, f"{spec_src} 'sources'", fix=fix)
                                         for p in sources]}
    for k in _FLAG_LISTS:
        v = f(spec, k, (list, type(None)), spec_src, default=None, fix=fix)
        clean[k] = None if v is None else [formats.parse_compile_flag(x, f"{spec_src} {k!r}", fix=fix)[0] for x in v]
    inc = f(spec, "extra_include_dirs", (list, type(None)), spec_src, default=None, fix=fix)
    clean["extra_include_dirs"] = None if inc is None else [
        formats.parse_path_text(x, f"{spec_src} 'extra_include_dirs'", fix=fix) for x in inc]
    clean["needs_device_linking"] = f(spec, "needs_device_linking", bool, spec_src, default=False, fix=fix)
    pairs = f(spec, "extra_cuda_cflags_by_source", (list, type(None)), spec_src, default=[], fix=fix) or []
    clean["extra_cuda_cflags_by_source"] = []
    for pair in pairs:
        if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[1], list)):
            raise FormatError(f"{spec_src}: 'extra_cuda_cflags_by_source' item {formats.shown(pair, 60)} is "
                              f"not [source, [flags]]; {fix}")
        clean["extra_cuda_cflags_by_source"].append(
            [formats.parse_path_text(pair[0], f"{spec_src} 'extra_cuda_cflags_by_source'", fix=fix),
             [formats.parse_compile_flag(x, f"{spec_src} 'extra_cuda_cflags_by_source'", fix=fix)[0]
              for x in pair[1]]])
    out["spec"] = clean
    generated = f(obj, "generated", (dict, type(None)), source, default={}, fix=fix) or {}
    size = 0
    out["generated"] = {}
    for portable, text in generated.items():
        if not (isinstance(portable, str) and portable.startswith("@GEN@/")):
            raise FormatError(f"{source}: generated file {formats.shown(portable, 60)} is not under @GEN@/; {fix}")
        formats.parse_relpath(portable[len("@GEN@/"):], f"{source} 'generated'", fix=fix)
        if not isinstance(text, str):
            raise FormatError(f"{source}: generated file {formats.shown(portable, 60)} holds "
                              f"{type(text).__name__}, not text; {fix}")
        size += len(text)
        if size > _MAX_GENERATED_BYTES:
            raise FormatError(f"{source}: generated sources exceed {_MAX_GENERATED_BYTES >> 20} MiB; {fix}")
        out["generated"][portable] = text
    return out


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
    """Where a generated file goes: :func:`flashinfer_sm120.formats.safe_join` under
    FlashInfer's generated-source dir (no absolute part, no ``..``, no symlinked parent)."""
    if not portable.startswith("@GEN@/"):
        raise CannotRegenerate(f"generated file {formats.shown(portable)} is outside FlashInfer's generated dir")
    try:
        return formats.safe_join(roots["@GEN@"], portable[len("@GEN@/"):], "manifest 'generated'")
    except FormatError as exc:
        raise CannotRegenerate(str(exc)) from None


def _check_named_paths(spec: dict, roots: dict[str, str]) -> None:
    """Sources, include dirs and the directories flags name (``-I``, ``-isystem``, ``-L``) outside
    FlashInfer's own roots must pass the trust rule: a manifest naming ``/tmp/x/evil.cu`` or
    ``-I/home/other/include`` would compile another user's code into a module the server loads.

    :raises CannotRegenerate: naming the path and why it is not trusted."""
    from ..ownership import check_path

    named = list(spec.get("sources") or []) + list(spec.get("extra_include_dirs") or [])
    flags = [f for k in _FLAG_LISTS for f in spec.get(k) or []]
    for src, by in spec.get("extra_cuda_cflags_by_source") or []:
        named.append(src)
        flags += by
    for flag in flags:
        named += formats.parse_compile_flag(flag, "manifest flag")[1]
    own = [os.path.realpath(r) for t, r in roots.items()]
    for portable in named:
        if portable.split("/", 1)[0] in roots:
            continue  # under FlashInfer's package, its generated or JIT dir (placeholders)
        real = os.path.realpath(portable)
        if any(real == r or real.startswith(r + os.sep) for r in own):
            continue
        problem = check_path(portable)
        if problem:
            raise CannotRegenerate(f"the manifest names {formats.shown(portable)} outside FlashInfer's "
                                   f"directories, which is not trusted: {problem}")


def make_spec(entry: dict, flashinfer_version: str):
    """Rebuild the FlashInfer ``JitSpecNvcc`` for ``entry`` and write back its generated
    sources (only when their content differs, like FlashInfer's ``write_if_different``).

    :raises CannotRegenerate: another FlashInfer release, another toolchain, a source
        missing here, or a malformed entry (the message names which).
    """
    try:
        entry = parse_entry(entry, "manifest entry")
    except FormatError as exc:
        raise CannotRegenerate(str(exc)) from None
    name = entry["name"]
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
        formats.make_private_dirs(path.parent)
        write_if_different(path, text)
    sources = [Path(p) for p in _from_portable(s["sources"], roots)]
    _check_named_paths(s, roots)
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

    Lines are streamed (:func:`flashinfer_sm120.formats.iter_lines`): a line over
    :data:`MAX_LINE_BYTES` is skipped without being held whole; every entry goes
    through :func:`parse_entry`.

    :returns: ``(entries, problems)``; a problem names the line that was skipped and why.
    :raises OSError: the file cannot be opened (absent, unreadable).
    :raises FormatError: not a regular file (``/dev/zero``, a FIFO), or more than
        :data:`MAX_LINES` lines.
    """
    if not os.path.lexists(path):
        raise FileNotFoundError(2, "No such file or directory", path)
    entries, problems, seen = [], [], set()
    fix = f"record the manifest again with FLASHINFER_SM120_RECORD={path}"
    for no, raw in formats.iter_lines(path, max_line=MAX_LINE_BYTES, max_lines=MAX_LINES, fix=fix,
                                      skip_long=True):
        where = f"{path}:{no}"
        if raw is None:
            problems.append(f"{where}: line longer than {MAX_LINE_BYTES} bytes, skipped")
            continue
        if not raw.strip():
            continue
        try:
            entry = parse_entry(formats.loads_json(raw, where), where)
        except FormatError as exc:
            problems.append(f"{exc}, skipped")
            continue
        k = key(entry)
        if k not in seen:
            seen.add(k)
            entries.append(entry)
    return entries, problems
