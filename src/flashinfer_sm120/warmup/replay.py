"""One path from names and manifests to specs: ``build``'s variants and ``build --from`` entries, each remade by the
generator it names in the local FlashInfer (0.2.0's entries with source text refused, P2); grammar: ``core.jitenv``."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from pathlib import Path
from typing import Any

from flashinfer_sm120.core.jitenv.record import parse_entry, setting
from flashinfer_sm120.errors import FormatError, Sm120Error
from flashinfer_sm120.safety.formats.base import shown
from flashinfer_sm120.safety.formats.params import parse_generator
from flashinfer_sm120.safety.formats.reads import loads_json
from flashinfer_sm120.safety.formats.fields import iter_lines
from flashinfer_sm120.warmup.session import BuildError

#: Largest manifest line accepted (bytes); generated sources are bounded well below.
MAX_LINE_BYTES = 8 << 20
#: Most lines read from one manifest (one per module and worker process).
MAX_LINES = 100_000


class CannotRegenerate(Sm120Error):
    """This FlashInfer cannot regenerate a manifest entry; the message says why."""


def load(path: str) -> tuple[list[dict], list[str]]:
    """The first entry of each (FlashInfer, name, targets) in ``path`` (many workers record one module) and a
    problem per line skipped, streamed and bounded (P6); :raises BuildError: unreadable or no entry."""
    fix = f"record the manifest again with {setting(path)}"
    entries, problems, seen = [], [], set()
    try:
        for no, raw in iter_lines(path, max_line=MAX_LINE_BYTES, max_lines=MAX_LINES, fix=fix, skip_long=True):
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
            key = (entry.get("flashinfer"), entry.get("name"), tuple(entry.get("targets") or ()))
            if key not in seen:
                seen.add(key)
                entries.append(entry)
    except FormatError as exc:  # missing, not a regular file (/dev/zero, a FIFO), too many lines
        raise BuildError(str(exc), exc.fix) from None
    if not entries:
        raise BuildError(f"manifest {path} holds no module entries"
                         + (f" ({problems[0]}" + (f"; and {len(problems) - 1} more" if len(problems) > 1 else "")
                            + ")" if problems else "") + f"; {fix}")
    return entries, problems


def arch_for(entries: list[dict], arch: str | None) -> str | None:
    """``--arch`` if given, else the manifest's one target set; :raises BuildError: it has several."""
    if arch is not None:
        return arch
    sets = sorted({tuple(e.get("targets") or ()) for e in entries if e.get("targets")})
    if not sets:
        return None
    if len(sets) > 1:
        raise BuildError("the manifest was recorded for different targets ("
                         + "; ".join(" ".join(s) for s in sets) + "); pass --arch to pick one, "
                         f"e.g. --arch '{' '.join(sets[0])}'")
    return " ".join(sets[0])


def specs(variants: list, entries: list[dict], flashinfer_version: str) -> tuple[list[tuple[str, object]], list[tuple[str, str]]]:
    """``(label, spec)`` for named variants and recorded entries alike (one path into the plan), each FlashInfer
    module once (its build directory) under build's name where it has one, and ``(name, why)`` for each not made."""
    made: dict[str, tuple[str, object]] = {}
    not_made = []
    for v in variants:
        try:
            spec = v.spec()
        except Exception as exc:  # FlashInfer refuses this combination: said, the rest is built
            not_made.append((v.label, f"FlashInfer's {v.getter.name} raised {exc!r}"))
            continue
        made.setdefault(spec.name, (v.label, spec))
    for entry in entries:  # each checked by load()
        if entry["name"] in made:  # named too (or recorded for other targets): built and reported once
            continue
        try:
            spec = make_spec(entry, flashinfer_version)
        except CannotRegenerate as exc:
            not_made.append((entry["name"], str(exc)))
            continue
        made.setdefault(spec.name, (entry["name"], spec))
    return list(made.values()), not_made


def make_spec(entry: dict, flashinfer_version: str):
    """The ``JitSpecNvcc`` the local FlashInfer's generator makes for ``entry`` (it writes its own sources);
    :raises CannotRegenerate: naming why (release, generator, parameters, name); ``entry`` is one :func:`load` read."""
    name = entry["name"]
    if not entry.get("regenerable"):
        raise CannotRegenerate(entry.get("why") or "recorded as not regenerable")
    if entry.get("flashinfer") != flashinfer_version:
        raise CannotRegenerate(f"recorded with FlashInfer {entry.get('flashinfer')}, this is "
                               f"{flashinfer_version}; record again with {flashinfer_version}")
    generator = entry["generator"]  # load() refused 0.2.0's entries (source text, no generator)
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
    return spec


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
    """The function ``generator`` (``flashinfer.x.y:gen_z_module``) names, defined by the installed
    ``flashinfer`` package in one of its files; :raises FormatError: it names anything else."""
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
    """FlashInfer's ``generator`` called with parsed ``params`` (it renders its sources); :raises FormatError."""
    fn = lookup(generator)
    args = [_decode(v) for v in params.get("args", [])]
    kwargs = {k: _decode(v) for k, v in params.get("kwargs", {}).items()}
    return fn(*args, **kwargs)
