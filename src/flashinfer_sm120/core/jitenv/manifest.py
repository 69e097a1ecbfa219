"""Manifest entries: one JIT module as JSON data that another machine turns back into the same spec.

An entry holds the FlashInfer version, the module name, the targets it was built for, and the
FlashInfer generator that made it with its parameters (``"generator":
"flashinfer.jit.attention.modules:gen_batch_decode_module"``, ``"params": {"args": [{"dtype":
"bfloat16"}, ..., 128, ...], "kwargs": {}}``; grammar: :mod:`flashinfer_sm120.safety.formats.params`).
:func:`make_spec` calls that generator of the local FlashInfer (:mod:`.generators`), which writes
its own sources, so what is compiled is what the local FlashInfer generates: a manifest names
modules and parameters, never source text (docs/threat-model.md P2).

Entries written before generators were recorded carry the spec's fields (``spec``: sources and
flags with ``@FLASHINFER@``/``@GEN@``/``@JIT@`` placeholders) and the generated text
(``generated``).  Neither is ever written or compiled: such an entry is rebuilt from the one
parameterless generator its name names (``sampling``, ``norm``, ``rope``, ``page``), and any text or
source it carries must equal what that generator produces here, or the entry is refused.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from flashinfer_sm120.safety import formats
from flashinfer_sm120.safety.formats.flags import parse_compile_flag
from flashinfer_sm120.safety.formats.params import parse_generator, parse_params
from flashinfer_sm120.errors import FormatError, Sm120Error

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


def parse_entry(obj: Any, source: str) -> dict:
    """One manifest entry, checked field by field against its grammar
    (:mod:`flashinfer_sm120.safety.formats`), returned as a new dict of the same shape.

    A regenerable entry names its generator (:func:`~flashinfer_sm120.safety.formats.params.parse_generator`)
    and parameters (:func:`~flashinfer_sm120.safety.formats.params.parse_params`), or, recorded before
    those were, carries a ``spec``.

    Names are :func:`~flashinfer_sm120.safety.formats.parse_name` (no whitespace, ``$``,
    ``:``, ``/``, NUL: they become ``build.ninja`` paths), targets
    :func:`~flashinfer_sm120.safety.formats.parse_target`, flags
    :func:`~flashinfer_sm120.safety.formats.flags.parse_compile_flag` (options FlashInfer uses, never one that
    names a program, plugin or output file), paths
    :func:`~flashinfer_sm120.safety.formats.parse_path_text`, generated files
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
    server = f(obj, "server", str, source, default=None, fix=fix)  # serverprobe.recorded(): the process it came from
    if server is not None:
        out["server"] = formats.parse_name(server, f"{source} 'server'", fix=fix)
    base = f(obj, "workspace_base", (str, type(None)), source, default=None, fix=fix)
    if base is not None:
        out["workspace_base"] = formats.parse_path_text(base, f"{source} 'workspace_base'", fix=fix)
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
    f = formats.field
    sources = formats.string_list(f(spec, "sources", list, spec_src, fix=fix), f"{spec_src} 'sources'", fix=fix)
    clean: dict[str, Any] = {"sources": [formats.parse_path_text(p, f"{spec_src} 'sources'", fix=fix)
                                         for p in sources]}
    for k in _FLAG_LISTS:
        v = f(spec, k, (list, type(None)), spec_src, default=None, fix=fix)
        clean[k] = None if v is None else [parse_compile_flag(x, f"{spec_src} {k!r}", fix=fix)[0] for x in v]
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
             [parse_compile_flag(x, f"{spec_src} 'extra_cuda_cflags_by_source'", fix=fix)[0]
              for x in pair[1]]])
    return clean


def _parse_generated(obj: dict, source: str, fix: str, out: dict) -> None:
    """``generated``: text an old entry carries per generated file, kept only to be compared."""
    f = formats.field
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


def key(entry: dict) -> tuple:
    """What makes two entries the same module: FlashInfer version, name and targets."""
    return (entry.get("flashinfer"), entry.get("name"), tuple(entry.get("targets") or ()))


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


def _safe_generated_path(portable: str, roots: dict[str, str]) -> Path:
    """Where a generated file is: :func:`flashinfer_sm120.safety.formats.safe_join` under
    FlashInfer's generated-source dir (no absolute part, no ``..``, no symlinked parent)."""
    if not portable.startswith("@GEN@/"):
        raise CannotRegenerate(f"generated file {formats.shown(portable)} is outside FlashInfer's generated dir")
    try:
        return formats.safe_join(roots["@GEN@"], portable[len("@GEN@/"):], "manifest 'generated'")
    except FormatError as exc:
        raise CannotRegenerate(str(exc)) from None


def _check_carried(entry: dict, spec, flashinfer_version: str) -> None:
    """Text and sources an entry carries must be what FlashInfer just generated for its parameters.

    :raises CannotRegenerate: naming the first file that differs or that FlashInfer does not make."""
    # threat-model: P2 (carried source text is compared, never written or compiled)
    roots = {t: r for t, r in _roots()[::-1]}  # the unresolved form wins (FlashInfer's own)
    why = (f"differs from what FlashInfer {flashinfer_version} generates for the recorded parameters, so "
           "the manifest carries source of its own; record the manifest again with FLASHINFER_SM120_RECORD")
    for portable, text in (entry.get("generated") or {}).items():
        path = _safe_generated_path(portable, roots)
        want = text.encode()
        try:
            with open(path, "rb", opener=lambda p, fl: os.open(p, fl | os.O_NOFOLLOW | os.O_NONBLOCK)) as f:
                have = f.read(len(want) + 1)
        except OSError:
            raise CannotRegenerate(f"generated file {formats.shown(portable)} is not one FlashInfer "
                                   f"{flashinfer_version} generates for the recorded parameters; record the "
                                   "manifest again with FLASHINFER_SM120_RECORD") from None
        if have != want:
            raise CannotRegenerate(f"generated file {formats.shown(portable)} {why}")
    if "spec" in entry:
        local = set(_to_portable([str(p) for p in spec.sources], _roots()))
        other = [p for p in entry["spec"]["sources"] if p not in local]
        if other:
            raise CannotRegenerate(f"source {formats.shown(other[0])} is not one FlashInfer {flashinfer_version} "
                                   f"generates for {entry['name']}; record the manifest again with "
                                   "FLASHINFER_SM120_RECORD")


def make_spec(entry: dict, flashinfer_version: str):
    """The FlashInfer ``JitSpecNvcc`` for ``entry``, made by the local FlashInfer: the entry's
    generator (looked up by :func:`.generators.lookup`) is called with its parameters and writes
    its own sources.  Source text or source paths the entry carries (old manifests) must equal
    what that call generated.

    :raises CannotRegenerate: another FlashInfer release, another toolchain, no generator this
        FlashInfer has, parameters it refuses, a module of another name, carried text or sources
        that differ, or a malformed entry (the message names which).
    """
    from flashinfer_sm120.core.jitenv import generators

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
    generator = entry.get("generator") or generators.legacy_generator(name)
    if generator is None:
        raise CannotRegenerate("recorded without the FlashInfer generator and parameters that make it (an older "
                               "flashinfer-sm120), so its sources cannot be made here; record the manifest again "
                               "with FLASHINFER_SM120_RECORD, or build it by name (flashinfer-sm120 build --list)")
    try:
        spec = generators.call(generator, entry.get("params") or {})
    except FormatError as exc:
        raise CannotRegenerate(str(exc)) from None
    except Exception as exc:  # FlashInfer's own refusal of these values (an assert, a KeyError)
        raise CannotRegenerate(f"FlashInfer {flashinfer_version}'s {generator} refused the recorded parameters "
                               f"({type(exc).__name__}: {formats.shown(str(exc), 200)}); record the manifest again "
                               f"with FLASHINFER_SM120_RECORD from a server that built the module, or build it by "
                               f"name (flashinfer-sm120 build --list)") from None
    if getattr(spec, "name", None) != name or not hasattr(spec, "sources"):
        raise CannotRegenerate(f"FlashInfer {flashinfer_version}'s {generator} makes "
                               f"{formats.shown(getattr(spec, 'name', spec))} from the recorded parameters, "
                               f"not the nvcc module {name}; record the manifest again")
    _check_carried(entry, spec, flashinfer_version)
    return spec


def read(path: str) -> tuple[list[dict], list[str]]:
    """Entries of a manifest file, first occurrence of each :func:`key` kept, in order.

    Lines are streamed (:func:`flashinfer_sm120.safety.formats.iter_lines`): a line over
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
