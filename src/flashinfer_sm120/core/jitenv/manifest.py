"""Manifest entries: one JIT module as JSON data that another machine turns back into the same spec.

An entry holds the FlashInfer version, the module name, the targets it was built for, and the
FlashInfer generator that made it with its parameters (``"generator":
"flashinfer.jit.attention.modules:gen_batch_decode_module"``, ``"params": {"args": [{"dtype":
"bfloat16"}, ..., 128, ...], "kwargs": {}}``; grammar: :mod:`flashinfer_sm120.safety.formats.params`):
it names modules and parameters, never source text (docs/threat-model.md P2).  Entries written before
generators were recorded carry the spec's fields (``spec``: sources and flags with
``@FLASHINFER@``/``@GEN@``/``@JIT@`` placeholders) and the generated text (``generated``), checked here
and only ever compared (:mod:`flashinfer_sm120.warmup.replay`).
"""

from __future__ import annotations

from typing import Any

from flashinfer_sm120.safety.formats.reads import field, string_list
from flashinfer_sm120.safety.formats.grammar import parse, parse_relpath, parse_version
from flashinfer_sm120.safety.formats.base import shown
from flashinfer_sm120.safety.formats.params import parse_compile_flag
from flashinfer_sm120.safety.formats.params import parse_generator, parse_params
from flashinfer_sm120.errors import FormatError

__all__ = ["FORMAT", "encode", "parse_entry"]

FORMAT = 1
_MAX_GENERATED_BYTES = 4 << 20
_MAX_TARGETS = 32
_FLAG_LISTS = ("extra_cflags", "extra_cuda_cflags", "extra_ldflags")


def parse_entry(obj: Any, source: str) -> dict:
    """One manifest entry, checked field by field against its grammar
    (:mod:`flashinfer_sm120.safety.formats`), returned as a new dict of the same shape.

    A regenerable entry names its generator (:func:`~flashinfer_sm120.safety.formats.params.parse_generator`)
    and parameters (:func:`~flashinfer_sm120.safety.formats.params.parse_params`), or, recorded before
    those were, carries a ``spec``.

    Names, targets and paths are of :data:`~flashinfer_sm120.safety.formats.grammar.GRAMMAR` (a name has no
    whitespace, ``$``, ``:``, ``/``, NUL: it becomes a ``build.ninja`` path), flags
    :func:`~flashinfer_sm120.safety.formats.params.parse_compile_flag` (options FlashInfer uses, never one that
    names a program, plugin or output file), generated files
    ``@GEN@/`` plus a relative path of names.

    Raises:
        FormatError: naming ``source``, the key and the offending value (cut short).
    """
    fix = "record the manifest again with FLASHINFER_SM120_RECORD"
    f = field
    if not isinstance(obj, dict):
        raise FormatError(f"{source}: holds {type(obj).__name__}, not a JSON object; {fix}")
    fmt = f(obj, "format", int, source, fix=fix)
    if fmt != FORMAT:
        raise FormatError(f"{source}: entry format {fmt} is not {FORMAT}; {fix} with this release")
    out: dict[str, Any] = {"format": fmt}
    out["name"] = parse("name", f(obj, "name", str, source, fix=fix), f"{source} 'name'", fix=fix)
    out["flashinfer"] = str(parse_version(f(obj, "flashinfer", str, source, fix=fix),
                                                  f"{source} 'flashinfer'", fix=fix))
    targets = f(obj, "targets", list, source, fix=fix, max_len=_MAX_TARGETS)
    out["targets"] = [parse("target", t, f"{source} 'targets'", fix=fix) for t in targets]
    out["toolchain"] = parse("name", f(obj, "toolchain", str, source, default="unknown", fix=fix),
                                          f"{source} 'toolchain'", fix=fix)
    out["regenerable"] = f(obj, "regenerable", bool, source, default=False, fix=fix)
    why = f(obj, "why", str, source, default=None, fix=fix, max_len=1000)
    if why is not None:
        out["why"] = why
    pid = f(obj, "pid", int, source, default=None, fix=fix)
    if pid is not None:
        out["pid"] = pid
    server = f(obj, "server", str, source, default=None, fix=fix)  # serverprobe.recorded(): the process it came from
    if server is not None:
        out["server"] = parse("name", server, f"{source} 'server'", fix=fix)
    base = f(obj, "workspace_base", (str, type(None)), source, default=None, fix=fix)
    if base is not None:
        out["workspace_base"] = parse("path", base, f"{source} 'workspace_base'", fix=fix)
    if not out["regenerable"]:
        return out
    generator = f(obj, "generator", (str, type(None)), source, default=None, fix=fix)
    if generator is not None:  # threat-model: P2 (a generator and plain parameters, never code)
        out["generator"] = ":".join(parse_generator(generator, f"{source} 'generator'", fix=fix))
        params = f(obj, "params", (dict, type(None)), source, default=None, fix=fix) or {}
        out["params"] = parse_params(params, f"{source} 'params'", fix=fix)
    spec = f(obj, "spec", (dict, type(None)), source, default=None, fix=fix)
    if spec is None and generator is None:
        raise FormatError(f"{source}: a regenerable entry names no 'generator'; {fix}")
    if spec is not None:
        out["spec"] = _parse_legacy_spec(spec, f"{source} 'spec'", fix)
    _parse_generated(obj, source, fix, out)
    return out


def _parse_legacy_spec(spec: dict, spec_src: str, fix: str) -> dict:
    """The ``spec`` block of an entry recorded before generators were: checked, compared with
    what the local generator makes (:func:`make_spec`), never used to build."""
    f = field
    sources = string_list(f(spec, "sources", list, spec_src, fix=fix), f"{spec_src} 'sources'", fix=fix)
    clean: dict[str, Any] = {"sources": [parse("path", p, f"{spec_src} 'sources'", fix=fix)
                                         for p in sources]}
    for k in _FLAG_LISTS:
        v = f(spec, k, (list, type(None)), spec_src, default=None, fix=fix)
        clean[k] = None if v is None else [parse_compile_flag(x, f"{spec_src} {k!r}", fix=fix)[0] for x in v]
    inc = f(spec, "extra_include_dirs", (list, type(None)), spec_src, default=None, fix=fix)
    clean["extra_include_dirs"] = None if inc is None else [
        parse("path", x, f"{spec_src} 'extra_include_dirs'", fix=fix) for x in inc]
    clean["needs_device_linking"] = f(spec, "needs_device_linking", bool, spec_src, default=False, fix=fix)
    pairs = f(spec, "extra_cuda_cflags_by_source", (list, type(None)), spec_src, default=[], fix=fix) or []
    clean["extra_cuda_cflags_by_source"] = []
    for pair in pairs:
        if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[1], list)):
            raise FormatError(f"{spec_src}: 'extra_cuda_cflags_by_source' item {shown(pair, 60)} is "
                              f"not [source, [flags]]; {fix}")
        clean["extra_cuda_cflags_by_source"].append(
            [parse("path", pair[0], f"{spec_src} 'extra_cuda_cflags_by_source'", fix=fix),
             [parse_compile_flag(x, f"{spec_src} 'extra_cuda_cflags_by_source'", fix=fix)[0]
              for x in pair[1]]])
    return clean


def _parse_generated(obj: dict, source: str, fix: str, out: dict) -> None:
    """``generated``: text an old entry carries per generated file, kept only to be compared."""
    f = field
    generated = f(obj, "generated", (dict, type(None)), source, default={}, fix=fix) or {}
    size = 0
    out["generated"] = {}
    for portable, text in generated.items():
        if not (isinstance(portable, str) and portable.startswith("@GEN@/")):
            raise FormatError(f"{source}: generated file {shown(portable, 60)} is not under @GEN@/; {fix}")
        parse_relpath(portable[len("@GEN@/"):], f"{source} 'generated'", fix=fix)
        if not isinstance(text, str):
            raise FormatError(f"{source}: generated file {shown(portable, 60)} holds "
                              f"{type(text).__name__}, not text; {fix}")
        size += len(text)
        if size > _MAX_GENERATED_BYTES:
            raise FormatError(f"{source}: generated sources exceed {_MAX_GENERATED_BYTES >> 20} MiB; {fix}")
        out["generated"][portable] = text


def encode(spec, flashinfer_version: str, targets: list[str]) -> dict:
    """The manifest entry for ``spec`` (a FlashInfer ``JitSpec``): the generator that made it and its
    parameters, as :func:`.generators.capture` noted them; no source text, no paths, no flags.
    Never raises for an unusual spec: one this module cannot carry gets ``"regenerable": false``
    and ``"why"``."""
    from flashinfer_sm120.core.jitenv.generators import ORIGIN

    entry: dict[str, Any] = {"format": FORMAT, "flashinfer": flashinfer_version, "name": spec.name,
                             "targets": sorted(targets), "toolchain": getattr(spec, "toolchain", "unknown")}
    if entry["toolchain"] != "nvcc" or not hasattr(spec, "sources"):
        entry.update(regenerable=False, why=f"toolchain {entry['toolchain']!r} is not built by nvcc/ninja")
        return entry
    if getattr(spec, "embedded_cubin_factory", None) is not None:
        entry.update(regenerable=False, why="it embeds cubins made by a Python callback at build time")
        return entry
    origin = getattr(spec, ORIGIN, None)
    if not isinstance(origin, dict):
        entry.update(regenerable=False, why=origin or "it was made before recording started, so its FlashInfer "
                                                      "generator and parameters are unknown")
        return entry
    entry.update(origin, regenerable=True)
    return entry
