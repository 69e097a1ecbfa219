"""What FlashInfer will load, in the order 0.7.4 looks (``JitSpec.try_load``: ``FLASHINFER_AOT_PROVIDERS``, then
``FLASHINFER_CUBIN_DIR``, then the JIT directory, read from ``flashinfer.jit.env``), and whether the GPUs here can
run it: targets from a trusted ``cuobjdump``, else only whether there is device code; cubins by ELF header SM."""

from __future__ import annotations

import collections
import contextlib
import glob
import itertools
import os
import shutil
import stat

from flashinfer_sm120.errors import FormatError
from flashinfer_sm120.safety.formats.base import shown
from flashinfer_sm120.safety.formats.binary import cuda_elf_sm, parse_cuobjdump_headers, parse_cuobjdump_list, read_elf
from flashinfer_sm120.diagnose.tree import walk_tree
from flashinfer_sm120.diagnose.verify import rules

__all__ = ["MODULE_CAP", "CUBIN_CAP", "find_cuobjdump", "module_targets", "check_module", "jit_modules",
           "prebuilt_places", "cubin_summary", "inventory", "gpus_to_check", "doctor_section"]

#: Modules inspected per place at most (a jit-cache package holds hundreds).
MODULE_CAP = 200
#: Cubins read per ``flashinfer-cubin`` directory at most.
CUBIN_CAP = 20000
_TOOL_TIMEOUT_S = 20.0
_TOOL_OUTPUT = 4 << 20


def find_cuobjdump(cuda_home: str | None = None) -> str | None:
    """A trusted ``cuobjdump``: the toolkit's, cuda-pathfinder's, the NVIDIA wheels' on ``sys.path``, then ``PATH``."""
    from flashinfer_sm120.core.toolkit.sources import pathfinder_binary, site_dirs
    from flashinfer_sm120.safety.trust import trace

    cands = [os.path.join(cuda_home, "bin", "cuobjdump")] if cuda_home else []
    cands.append(pathfinder_binary("cuobjdump") or "")
    for sd in site_dirs():
        cands += sorted(glob.glob(os.path.join(glob.escape(sd), "nvidia", "cu1[0-9]", "bin", "cuobjdump")),
                        reverse=True)
        cands.append(os.path.join(sd, "nvidia", "cuda_cuobjdump", "bin", "cuobjdump"))
    cands.append(shutil.which("cuobjdump") or "")
    for c in dict.fromkeys(c for c in cands if c):
        if os.path.isfile(c) and os.access(c, os.X_OK) and trace(c).problem is None:
            return c
    return None


def module_targets(path: str, cuobjdump: str | None) -> dict:
    """``{"sass": [...], "ptx": [...], "known": bool, "note": str | None}`` for one ``.so``."""
    from flashinfer_sm120.safety import proc

    why = "no cuobjdump found (pip install nvidia-cuda-cuobjdump)"
    if cuobjdump:
        listed = proc.run([cuobjdump, "--list-elf", "--list-ptx", path], timeout=_TOOL_TIMEOUT_S,
                          max_output=_TOOL_OUTPUT)
        heads = proc.run([cuobjdump, path], timeout=_TOOL_TIMEOUT_S, max_output=_TOOL_OUTPUT)
        try:  # the list names every entry; the headers add the a/f suffix when they name as many
            use = entries = parse_cuobjdump_list(listed.output, f"{cuobjdump} --list-elf {path}")
            exact = parse_cuobjdump_headers(heads.output, f"{cuobjdump} {path}") if heads.ok else []
            use = exact if exact and len(exact) == len(entries) else entries
        except FormatError as exc:
            use, why = [], str(exc)
        else:
            why = f"cuobjdump failed (exit {listed.returncode}): " + shown(
                listed.error or listed.text().strip()[-300:], 300)
        if listed.ok or use:
            sass, ptx = (sorted({t for k, t in use if k == kind}) for kind in ("SASS", "PTX"))
            return {"sass": sass, "ptx": ptx, "known": True,
                    "note": None if sass or ptx else "no device code (cuobjdump lists no ELF or PTX)"}
    try:
        fatbin = read_elf(path).sections.get(".nv_fatbin")
    except FormatError as exc:
        return {"sass": [], "ptx": [], "known": False, "note": str(exc)}
    if fatbin is None:
        return {"sass": [], "ptx": [], "known": True, "note": "no device code (no .nv_fatbin section)"}
    return {"sass": [], "ptx": [], "known": False, "note": f"targets unknown: {why}; .nv_fatbin of {fatbin[2]} bytes"}


def check_module(name: str, path: str, gpus: list[tuple[str, tuple[int, int]]], cuobjdump: str | None,
                 fix: str) -> dict:
    """One module: its targets and, per GPU, how it runs; ``problem`` when a GPU runs none of it."""
    found = module_targets(path, cuobjdump)
    try:
        size = os.stat(path).st_size
    except OSError:
        size = None
    out = {"name": name, "path": path, "bytes": size, **found, "runs": {}, "problem": None, "caution": None}
    if not found["known"] or not (found["sass"] or found["ptx"]):
        return out  # unknown, or host code only: nothing to hold against it
    missing = []
    for label, cap in gpus:
        verdict, target = rules.best(found["sass"] + found["ptx"], cap)
        out["runs"][label] = {"verdict": verdict, "target": target}
        if verdict is None:
            missing.append(label)
        out["caution"] = out["caution"] or rules.caution(verdict, target, cap)
    if missing:
        held = ", ".join(found["sass"] + found["ptx"])
        out["problem"] = f"no code {' or '.join(missing)} can run (it holds {held}). Fix: {fix}"
    return out


def jit_modules(jit_dir: str) -> list[tuple[str, str]]:
    """``(name, path)`` of each built module ``<jit_dir>/<name>/<name>.so`` (links not followed)."""
    out = []
    try:
        entries = sorted(os.scandir(jit_dir), key=lambda e: e.name)
    except OSError:
        return out
    for e in entries:
        if e.name == "tmp" or not e.is_dir(follow_symlinks=False):
            continue
        so = os.path.join(e.path, f"{e.name}.so")
        with contextlib.suppress(OSError):
            if stat.S_ISREG(os.lstat(so).st_mode):
                out.append((e.name, so))
    return out


def prebuilt_places() -> list[dict]:
    """The prebuilt directories FlashInfer would load from first, as its ``jit.env`` computed them."""
    try:
        import flashinfer.jit.env as env
        from flashinfer import __version__ as fi_version
    except Exception:
        return []
    places: list[dict] = [{"kind": "flashinfer-jit-cache", "label": f"{p.distribution} {p.version}",
                           "path": str(p.jit_cache_dir), "modules": sorted(p.modules), "flashinfer": fi_version,
                           "declared": sorted(p.cuda_architectures), "distribution": p.distribution}
                          for p in getattr(env, "FLASHINFER_AOT_PROVIDERS", ()) or ()]
    aot = getattr(env, "FLASHINFER_AOT_DIR", None)
    if aot is not None and os.path.isdir(aot) and str(aot) not in {p["path"] for p in places}:
        own = os.path.join("flashinfer", "data", "aot") in str(aot)
        places.append({"kind": "flashinfer-aot" if own else "flashinfer-jit-cache",
                       "label": "flashinfer-python data/aot" if own else "flashinfer-jit-cache", "path": str(aot),
                       "modules": None, "declared": None, "distribution": "flashinfer-python" if own else
                       "flashinfer-jit-cache", "flashinfer": fi_version})
    cubin = getattr(env, "FLASHINFER_CUBIN_DIR", None)
    if cubin is not None and os.path.isdir(cubin):
        places.append({"kind": "flashinfer-cubin", "label": "flashinfer-cubin", "path": str(cubin)})
    return places


def _fix(place: dict, caps: str) -> str:
    """How to be rid of a module no GPU here runs, by where FlashInfer finds it."""
    warm = f"flashinfer-sm120 build --arch {caps}"
    if place["kind"] == "jit":
        return (f"delete that module's directory (FlashInfer rebuilds it for the GPUs present on first use), "
                f"or warm it now with {warm}")
    if place["kind"] == "flashinfer-aot":
        return (f"FlashInfer loads {place['path']} before building its own: reinstall flashinfer-python "
                f"from PyPI (its wheel has no data/aot), then {warm}")
    return (f"FlashInfer {place['flashinfer']} loads {place['distribution']}'s module before JIT-building its own "
            f"and has no variable to skip that package: pip uninstall {place['distribution']} (or install one built "
            f"for {caps}); then warm the JIT build with {warm}")


def cubin_summary(cubin_dir: str, gpus: list[tuple[str, tuple[int, int]]]) -> dict:
    """Counts of cubins per SM under ``cubin_dir`` and whether any runs on each GPU."""
    cubins = (os.path.join(root, f) for root, _dirs, files in walk_tree(cubin_dir) for f in files
              if f.endswith(".cubin"))  # any depth (threat-model: P6), no link entered
    found = list(itertools.islice(cubins, CUBIN_CAP + 1))
    sms = []
    for path in found[:CUBIN_CAP]:
        try:
            sms.append(cuda_elf_sm(read_elf(path)))
        except FormatError:
            sms.append(None)
    counts = collections.Counter(f"sm_{sm}" for sm in sms if sm is not None)
    runs = {label: any(rules.runs(t, cap) for t in counts) for label, cap in gpus}
    note = None
    if counts and not any(runs.values()):
        note = ("none of these cubins runs on the visible GPUs; FlashInfer uses them only for kernels of "
                "those GPUs. If a kernel fails with 'no kernel image', set FLASHINFER_CUBIN_DIR to a "
                "directory of cubins for this GPU (FlashInfer then reads it instead of the package)")
    return {"cubins": len(sms), "more": len(found) > CUBIN_CAP, "by_sm": dict(sorted(counts.items())),
            "unreadable": sms.count(None), "runs": runs, "note": note,
            "suffix": "the a/f suffix is not in a cubin's ELF header, so 'sm_100' may be sm_100a"}


def gpus_to_check(gpus: list[dict], targets: list[str]) -> tuple[list[tuple[str, tuple[int, int]]], str]:
    """``[(label, capability)]`` for the visible GPUs, else the chosen targets as stand-ins."""
    out = []
    for g in gpus:
        try:
            major, minor = (int(x) for x in str(g["capability"]).split(".")[:2])
        except (KeyError, ValueError):
            continue
        out.append((f"GPU {g.get('index', '?')} ({major}.{minor})", (major, minor)))
    if out:
        return out, "the visible GPUs"
    stand_ins = [(f"{t} (no GPU visible)", c) for t in targets if (c := rules.capability_of(t))]
    return stand_ins, "the chosen targets (no GPU visible)"


def other_targets(jit_dir: str, limit: int = 64) -> dict[str, int]:
    """``{targets part: module count}`` of the siblings of ``<release>/[<targets>/]<nvcc tag>/cached_ops``."""
    tag_dir = os.path.dirname(jit_dir)
    tag, leaf, out = os.path.basename(tag_dir), os.path.basename(jit_dir), {}
    for root in dict.fromkeys((os.path.dirname(tag_dir), os.path.dirname(os.path.dirname(tag_dir)))):
        try:
            entries = [e.name for e, _ in zip(os.scandir(root), range(limit)) if e.is_dir(follow_symlinks=False)]
        except OSError:
            continue
        for name in sorted(entries):
            other = os.path.join(root, name, tag, leaf)
            if os.path.realpath(other) != os.path.realpath(jit_dir) and os.path.isdir(other):
                count = len(jit_modules(other))
                if count:
                    out[name] = count
    return out


def inventory(jit_dir: str | None, gpus: list[tuple[str, tuple[int, int]]], cuda_home: str | None = None,
              *, prebuilt: bool = True) -> dict:
    """Every place FlashInfer loads modules from, each module checked against ``gpus``."""
    cuobjdump = find_cuobjdump(cuda_home)
    caps = " ".join(dict.fromkeys(f"{c[0]}.{c[1]}" for _, c in gpus)) or "<major.minor>"
    places = prebuilt_places() if prebuilt else []
    if jit_dir:
        places.append({"kind": "jit", "label": "JIT directory", "path": jit_dir, "modules": None})
    for place in places:
        if place["kind"] == "flashinfer-cubin":
            place.update(cubin_summary(place["path"], gpus))
            continue
        names = place["modules"] or [n for n, _ in jit_modules(place["path"])]
        mods = [(n, p) for n in names if os.path.isfile(p := os.path.join(place["path"], n, f"{n}.so"))]
        place["modules"] = [check_module(n, p, gpus, cuobjdump, _fix(place, caps)) for n, p in mods[:MODULE_CAP]]
        place["not_inspected"] = max(0, len(mods) - MODULE_CAP)
        if place["kind"] == "jit":
            place["other_targets"] = {} if mods else other_targets(jit_dir)
    problems = sum(bool(m["problem"]) for p in places for m in p.get("modules") or ())
    return {"cuobjdump": cuobjdump, "checked_against": [label for label, _ in gpus], "places": places,
            "problems": problems}


# ----------------------------------------------------------------------------- doctor


def doctor_section(report: dict) -> dict:
    """``doctor``'s ``inventory`` section, from the report built so far."""
    targets = ((report.get("resolution") or {}).get("choice") or {}).get("targets") or []
    gpus, against = gpus_to_check(report.get("gpus") or [], targets)
    after = report.get("after") or {}
    # FlashInfer not imported on purpose (root with another user's HOME): nor for its prebuilt places
    out = inventory(after.get("jit_dir"), gpus, after.get("cuda_home"), prebuilt=not report.get("import_refused"))
    out["against"] = against
    return out
