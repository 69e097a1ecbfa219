"""Replaying a manifest: reading it, and turning each entry back into a FlashInfer spec by calling
the generator it names of the local FlashInfer, which writes its own sources (docs/threat-model.md P2).

What an entry is (its grammar, :func:`~flashinfer_sm120.core.jitenv.manifest.parse_entry`) and how it
is recorded (:mod:`flashinfer_sm120.core.jitenv.record`) are in core: recording runs in the server.
Entries written before generators were recorded carry the spec's fields and generated text; neither is
ever written or compiled: such an entry is rebuilt from the one parameterless generator its name
names (``sampling``, ``norm``, ``rope``, ``page``), and any text or source it carries must equal what
that generator produces here, or the entry is refused.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import re
from pathlib import Path
from typing import Any

from flashinfer_sm120.safety.formats.reads import iter_lines, loads_json
from flashinfer_sm120.safety.formats.paths import safe_join
from flashinfer_sm120.safety.formats.base import shown
from flashinfer_sm120.safety.formats.params import parse_generator
from flashinfer_sm120.errors import FormatError, Sm120Error
from flashinfer_sm120.core.jitenv.manifest import parse_entry

__all__ = ["CannotRegenerate", "make_spec", "read", "key", "lookup", "call", "legacy_generator",
           "MAX_LINE_BYTES", "MAX_LINES"]

#: Largest manifest line accepted (bytes); generated sources are bounded well below.
MAX_LINE_BYTES = 8 << 20
#: Most lines read from one manifest (one per module and worker process).
MAX_LINES = 100_000


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


def _safe_generated_path(portable: str, roots: dict[str, str]) -> Path:
    """Where a generated file is: :func:`flashinfer_sm120.safety.formats.paths.safe_join` under
    FlashInfer's generated-source dir (no absolute part, no ``..``, no symlinked parent)."""
    if not portable.startswith("@GEN@/"):
        raise CannotRegenerate(f"generated file {shown(portable)} is outside FlashInfer's generated dir")
    try:
        return safe_join(roots["@GEN@"], portable[len("@GEN@/"):], "manifest 'generated'")
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
            raise CannotRegenerate(f"generated file {shown(portable)} is not one FlashInfer "
                                   f"{flashinfer_version} generates for the recorded parameters; record the "
                                   "manifest again with FLASHINFER_SM120_RECORD") from None
        if have != want:
            raise CannotRegenerate(f"generated file {shown(portable)} {why}")
    if "spec" in entry:
        local = set(_to_portable([str(p) for p in spec.sources], _roots()))
        other = [p for p in entry["spec"]["sources"] if p not in local]
        if other:
            raise CannotRegenerate(f"source {shown(other[0])} is not one FlashInfer {flashinfer_version} "
                                   f"generates for {entry['name']}; record the manifest again with "
                                   "FLASHINFER_SM120_RECORD")


def make_spec(entry: dict, flashinfer_version: str):
    """The FlashInfer ``JitSpecNvcc`` for ``entry``, made by the local FlashInfer: the entry's
    generator (looked up by :func:`lookup`) is called with its parameters and writes
    its own sources.  Source text or source paths the entry carries (old manifests) must equal
    what that call generated.

    :raises CannotRegenerate: another FlashInfer release, another toolchain, no generator this
        FlashInfer has, parameters it refuses, a module of another name, carried text or sources
        that differ, or a malformed entry (the message names which).
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
    generator = entry.get("generator") or legacy_generator(name)
    if generator is None:
        raise CannotRegenerate("recorded without the FlashInfer generator and parameters that make it (an older "
                               "flashinfer-sm120), so its sources cannot be made here; record the manifest again "
                               "with FLASHINFER_SM120_RECORD, or build it by name (flashinfer-sm120 build --list)")
    try:
        spec = call(generator, entry.get("params") or {})
    except FormatError as exc:
        raise CannotRegenerate(str(exc)) from None
    except Exception as exc:  # FlashInfer's own refusal of these values (an assert, a KeyError)
        raise CannotRegenerate(f"FlashInfer {flashinfer_version}'s {generator} refused the recorded parameters "
                               f"({type(exc).__name__}: {shown(str(exc), 200)}); record the manifest again "
                               f"with FLASHINFER_SM120_RECORD from a server that built the module, or build it by "
                               f"name (flashinfer-sm120 build --list)") from None
    if getattr(spec, "name", None) != name or not hasattr(spec, "sources"):
        raise CannotRegenerate(f"FlashInfer {flashinfer_version}'s {generator} makes "
                               f"{shown(getattr(spec, 'name', spec))} from the recorded parameters, "
                               f"not the nvcc module {name}; record the manifest again")
    _check_carried(entry, spec, flashinfer_version)
    return spec


def read(path: str) -> tuple[list[dict], list[str]]:
    """Entries of a manifest file, first occurrence of each :func:`key` kept, in order.

    Lines are streamed (:func:`flashinfer_sm120.safety.formats.reads.iter_lines`): a line over
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
    for no, raw in iter_lines(path, max_line=MAX_LINE_BYTES, max_lines=MAX_LINES, fix=fix,
                                      skip_long=True):
        where = f"{path}:{no}"
        if raw is None:
            problems.append(f"{where}: line longer than {MAX_LINE_BYTES} bytes, skipped")
            continue
        if not raw.strip():
            continue
        try:
            entry = parse_entry(loads_json(raw, where), where)
        except FormatError as exc:
            problems.append(f"{exc}, skipped")
            continue
        k = key(entry)
        if k not in seen:
            seen.add(k)
            entries.append(entry)
    return entries, problems

def _decode(value: Any) -> Any:
    if isinstance(value, list):
        return [_decode(v) for v in value]
    if isinstance(value, dict) and "tuple" in value:
        return tuple(_decode(v) for v in value["tuple"])
    if isinstance(value, dict):
        import torch

        dtype = getattr(torch, value["dtype"], None)
        if not isinstance(dtype, torch.dtype):
            raise FormatError(f"{shown(value['dtype'])} is not a dtype of this torch")
        return dtype
    return value


def lookup(generator: str):
    """The function ``generator`` (``flashinfer.x.y:gen_z_module``) names, from the installed
    FlashInfer only: its module must be a file of the installed ``flashinfer`` package and the
    function a Python function FlashInfer defines under that very name.

    :raises FormatError: it names anything else (the message says what)."""
    # threat-model: P2 (no dotted path from a file is ever resolved outside FlashInfer's gen_*_module family)
    module, name = parse_generator(generator, "manifest 'generator'")
    import flashinfer

    root = Path(flashinfer.__file__).resolve().parent
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        found = None
    origin = Path(found.origin).resolve() if found is not None and found.origin else None
    if origin is None or root not in origin.parents:
        raise FormatError(f"the installed FlashInfer has no module {module}")
    fn = getattr(importlib.import_module(module), name, None)
    inner = inspect.unwrap(fn) if callable(fn) else None
    if not (inspect.isfunction(inner) and inner.__name__ == name
            and (inner.__module__ == "flashinfer" or str(inner.__module__).startswith("flashinfer."))):
        raise FormatError(f"the installed FlashInfer's {module} defines no function {name}")
    return fn


def call(generator: str, params: dict):
    """Call ``generator`` with ``params`` (as :func:`flashinfer_sm120.safety.formats.params.parse_params` returns
    them): FlashInfer renders its sources and returns the spec.

    :raises FormatError: the generator is not FlashInfer's, or a dtype this torch lacks.
    :raises Exception: whatever FlashInfer's generator raises for these values."""
    fn = lookup(generator)
    args = [_decode(v) for v in params.get("args", [])]
    kwargs = {k: _decode(v) for k, v in params.get("kwargs", {}).items()}
    return fn(*args, **kwargs)


def legacy_generator(name: str) -> str | None:
    """For an entry recorded before generators were recorded: ``flashinfer.jit.<name>:gen_<name>_module``
    where the installed FlashInfer has it and it takes no required argument (``sampling``, ``norm``,
    ``rope``, ``page`` on 0.7.4); else ``None``."""
    if not re.fullmatch(r"[a-z][a-z0-9_]{0,60}", name):
        return None
    generator = f"flashinfer.jit.{name}:gen_{name}_module"
    try:
        fn = lookup(generator)
        required = [p for p in inspect.signature(fn).parameters.values()
                    if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    except (FormatError, ImportError, ValueError, TypeError):
        return None
    return None if required else generator


def key(entry: dict) -> tuple:
    """What makes two entries the same module: FlashInfer version, name and targets."""
    return (entry.get("flashinfer"), entry.get("name"), tuple(entry.get("targets") or ()))
