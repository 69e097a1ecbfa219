"""Move a warmed JIT cache: write a manifest's JIT cache entries to a directory or
archive, and install them on another machine (Docker build stages, fleets).

Layout (directory or ``.tar``/``.tar.gz``/``.tgz``)::

    flashinfer-sm120-cache/meta.json          fingerprint, manifest entries, sha256 of every file
    flashinfer-sm120-cache/jit/NAME/...       FlashInfer's module dir: objects, .so, build.ninja, ninja log/deps
    flashinfer-sm120-cache/generated/...      sources FlashInfer generated for the module

A JIT cache entry is only reusable where FlashInfer would write the same
``build.ninja`` (ninja recompiles when a command line changes): the same FlashInfer
release (it keys the cache directory, flashinfer/jit/env.py), the same targets (the
directory name and ``-gencode`` flags) and the same toolkit (``cuda_home`` and the
nvcc release are written into the file, flashinfer/jit/cpp_ext.py).  Import checks
these first and refuses with the mismatch and the fix; it then regenerates each
module's ``build.ninja`` with this machine's FlashInfer, and asks ninja (``-n``)
whether anything would be rebuilt, reporting the truth per module.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path, PurePosixPath

from . import ninjadeps, pool
from .manifest import make_spec
from .session import BuildError, Session

__all__ = ["export", "install", "read_meta", "check_members", "TOP"]

TOP = "flashinfer-sm120-cache"
_FORMAT = 1
_SKIP = {".ninja_lock"}
_NINJA_OWN = ("/build.ninja", "/.ninja_log", "/.ninja_deps")
_MAX_META_BYTES = 64 << 20


def _sha(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _is_archive(path: str) -> bool:
    return path.endswith((".tar", ".tar.gz", ".tgz"))


def export(entries: list[dict], sess: Session, out: str) -> list[str]:
    """Write the JIT cache entries of ``entries`` (built on this machine) to ``out``.

    :returns: the module names written.
    :raises BuildError: a module is not built or not up to date here, or ``out`` exists
        and is not an empty directory (never overwritten).
    """
    from flashinfer.jit import env as jit_env

    if os.path.lexists(out) and not (os.path.isdir(out) and not os.listdir(out)):
        raise BuildError(f"{out} already exists; choose a new path (an export never overwrites)")
    files: list[tuple[str, Path]] = []
    modules, names = [], []
    gen_root = Path(jit_env.FLASHINFER_GEN_SRC_DIR)
    for entry in entries:
        spec = make_spec(entry, sess.flashinfer)
        job = pool.Job(spec.name, spec.build_dir, spec.ninja_path)
        if not spec.jit_library_path.exists() or pool.dry_run(job):
            raise BuildError(f"{spec.name} is not built for {' '.join(sess.targets)} here; run "
                             "`flashinfer-sm120 build --from MANIFEST` first")
        mod_files = {}
        for f in sorted(spec.build_dir.iterdir()):
            if f.is_file() and not f.is_symlink() and f.name not in _SKIP and not f.name.endswith(".lock"):
                rel = f"jit/{spec.name}/{f.name}"
                files.append((rel, f))
                mod_files[rel] = _sha(f)
        for portable in (entry.get("generated") or {}):
            f = gen_root / portable[len("@GEN@/"):]
            rel = "generated/" + portable[len("@GEN@/"):]
            files.append((rel, f))
            mod_files[rel] = _sha(f)
        modules.append({"name": spec.name, "files": mod_files})
        names.append(spec.name)
    meta = {"format": _FORMAT, "fingerprint": sess.fingerprint(), "modules": modules, "manifest": entries,
            "created": time.time()}
    blob = json.dumps(meta, indent=1).encode()
    if _is_archive(out):
        tmp = out + ".partial"
        with tarfile.open(tmp, "w:gz" if out.endswith("gz") else "w") as tar:
            info = tarfile.TarInfo(f"{TOP}/meta.json")
            info.size, info.mtime, info.mode = len(blob), int(time.time()), 0o644
            tar.addfile(info, io.BytesIO(blob))
            for rel, f in files:
                tar.add(str(f), arcname=f"{TOP}/{rel}", recursive=False)
        os.replace(tmp, out)
    else:
        root = Path(out) / TOP
        for rel, f in files:
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, root / rel)
        (root / "meta.json").write_bytes(blob)
    return names


def _safe_rel(name: str) -> str:
    """``name`` relative to the top folder, refusing anything that could land outside it."""
    p = PurePosixPath(name)
    if p.is_absolute() or ".." in p.parts or not p.parts or p.parts[0] != TOP or "\\" in name:
        raise BuildError(f"archive member {name!r} is outside {TOP}/; refusing the whole archive")
    return "/".join(p.parts[1:])


def check_members(src: str) -> None:
    """Refuse an archive with any member outside TOP/, any link or device (no extraction).

    :raises BuildError: the first unsafe member, or an unreadable archive."""
    if os.path.isdir(src):
        return
    try:
        with tarfile.open(src) as tar:
            for m in tar.getmembers():
                _safe_rel(m.name)
                if not (m.isfile() or m.isdir()):
                    raise BuildError(f"archive member {m.name!r} is a link or device; refusing the whole archive")
    except (OSError, tarfile.TarError) as exc:
        raise BuildError(f"cannot read {src}: {exc}") from None


def _unpack(src: str, into: Path) -> Path:
    """Copy or extract ``src`` below ``into``; only regular files and folders under TOP/."""
    if os.path.isdir(src):
        root = Path(src) / TOP
        if not root.is_dir():
            raise BuildError(f"{src} has no {TOP}/ folder; give the path `cache export` wrote")
        return root
    try:
        tar = tarfile.open(src)
    except (OSError, tarfile.TarError) as exc:
        raise BuildError(f"cannot read {src}: {exc}") from None
    with tar:
        for m in tar.getmembers():
            rel = _safe_rel(m.name)
            if not (m.isfile() or m.isdir()):
                raise BuildError(f"archive member {m.name!r} is a link or device; refusing the whole archive")
            if m.isdir():
                continue
            dest = into / TOP / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            with tar.extractfile(m) as fsrc, open(dest, "wb") as fdst:  # type: ignore[union-attr]
                shutil.copyfileobj(fsrc, fdst)
            os.utime(dest, (m.mtime, m.mtime))
    return into / TOP


def read_meta(src: str) -> dict:
    """meta.json of an export (directory or archive), without unpacking anything else.

    :raises BuildError: unreadable, or no meta.json."""
    try:
        if os.path.isdir(src):
            raw = (Path(src) / TOP / "meta.json").read_bytes()
        else:
            with tarfile.open(src) as tar:
                m = tar.getmember(f"{TOP}/meta.json")
                if not m.isfile() or m.size > _MAX_META_BYTES:
                    raise KeyError(m.name)
                raw = tar.extractfile(m).read()  # type: ignore[union-attr]
        return json.loads(raw)
    except (OSError, KeyError, ValueError, tarfile.TarError) as exc:
        raise BuildError(f"{src} has no readable {TOP}/meta.json ({exc!r}); give the path "
                         "`cache export` wrote") from None


def _mismatch(theirs: dict, ours: dict) -> str | None:
    fixes = {
        "flashinfer": "install the same flashinfer-python on both machines (the JIT cache is keyed by its version)",
        "targets": "export for this machine's targets (`flashinfer-sm120 build --from M --arch ...` then "
                   "`cache export --arch ...`), or pass the archive's targets with --arch here",
        "cuda_version": "use the same nvcc release on both machines (e.g. the same cuda-toolkit pip pin)",
        "cuda_home": "FlashInfer writes CUDA_HOME into each build.ninja, so a different path recompiles "
                     "everything: give both machines the same toolkit path and FLASHINFER_SM120_CACHE_DIR",
        "jit_dir": "FlashInfer writes its JIT dir into each build.ninja: use the same FLASHINFER_WORKSPACE_BASE "
                   "(default: $HOME) on both machines",
    }
    for k, fix in fixes.items():
        if theirs.get(k) != ours.get(k):
            return f"archive has {k} {theirs.get(k)!r}, this machine {ours.get(k)!r}: {fix}"
    return None


def install(src: str, sess: Session, *, force: bool = False) -> list[dict]:
    """Install an exported JIT cache into this machine's FlashInfer JIT cache.

    Each module is reported with ``status``: ``installed``, ``already present``,
    ``kept existing`` (a different entry is here; ``force`` replaces it) or ``stale``
    (installed, but ninja would rebuild it here; ``why`` says which command).

    :raises BuildError: unreadable source, an unsafe archive member, a file whose
        checksum does not match meta.json, or a fingerprint mismatch (message names
        the mismatch and the fix).
    """
    from flashinfer.jit import env as jit_env

    with tempfile.TemporaryDirectory(prefix="fi-sm120-import-") as tmp:
        root = _unpack(src, Path(tmp))
        meta_path = root / "meta.json"
        if not meta_path.is_file() or meta_path.stat().st_size > _MAX_META_BYTES:
            raise BuildError(f"{src} has no readable {TOP}/meta.json")
        meta = json.loads(meta_path.read_text())
        if meta.get("format") != _FORMAT:
            raise BuildError(f"{src} is export format {meta.get('format')!r}; this version reads {_FORMAT}")
        problem = _mismatch(meta.get("fingerprint") or {}, sess.fingerprint())
        if problem:
            raise BuildError(f"refusing {src}: {problem}")
        targets = {"jit": Path(jit_env.FLASHINFER_JIT_DIR), "generated": Path(jit_env.FLASHINFER_GEN_SRC_DIR)}
        entries = {e.get("name"): e for e in meta.get("manifest") or []}
        report = []
        for mod in meta.get("modules") or []:
            name, files = mod["name"], mod["files"]
            for rel, sha in files.items():
                _safe_rel(f"{TOP}/{rel}")
                if rel.split("/", 1)[0] not in targets:
                    raise BuildError(f"meta.json names {rel!r} outside jit/ and generated/")
                if not (root / rel).is_file() or _sha(root / rel) != sha:
                    raise BuildError(f"{src}: {rel} is missing or its checksum does not match meta.json")
            dests = {rel: targets[rel.split("/", 1)[0]] / rel.split("/", 1)[1] for rel in files}
            # build.ninja and ninja's logs are rewritten here by design (see _settle)
            content = {rel: d for rel, d in dests.items() if not rel.endswith(_NINJA_OWN)}
            differing = [str(d) for rel, d in content.items() if d.exists() and _sha(d) != files[rel]]
            present = all(d.exists() and _sha(d) == files[rel] for rel, d in content.items())
            if differing and not force:
                report.append({"module": name, "status": "kept existing",
                               "why": f"a different {differing[0]} is already here; pass --force to replace it"})
                continue
            if not present:
                for rel, d in dests.items():
                    d.parent.mkdir(parents=True, exist_ok=True)
                    part = d.with_name(d.name + f".import-{os.getpid()}")
                    shutil.copy2(root / rel, part)
                    os.replace(part, d)
            report.append({"module": name, "status": "already present" if present else "installed",
                           "replaced": differing})
        for r in report:
            if r["status"] in ("installed", "already present"):
                r.update(_settle(entries.get(r["module"]), sess))
        return report


def _settle(entry: dict | None, sess: Session) -> dict:
    """Regenerate the module's build.ninja with this FlashInfer, make the imported outputs
    newer than this machine's inputs (objects before the library), record that in ninja's
    log (``ninja -t restat``), and ask ninja whether it would rebuild."""
    if entry is None:
        return {"status": "stale", "why": "meta.json has no manifest entry for it"}
    spec = make_spec(entry, sess.flashinfer)
    from .session import write_ninjas

    write_ninjas([spec])
    # Make the imported outputs newer than this machine's inputs (its pip install may be
    # later than the export): objects first, the library last; then tell ninja's logs.
    now = time.time_ns()
    outs = sorted(p for p in spec.build_dir.iterdir() if p.suffix == ".o")
    if spec.jit_library_path.exists():
        outs.append(spec.jit_library_path)
    stamps = {}
    for i, p in enumerate(outs):
        ns = now + i * 1_000_000
        os.utime(p, ns=(ns, ns))
        stamps[str(p.resolve())] = os.stat(p).st_mtime_ns
    job = pool.Job(spec.name, spec.build_dir, spec.ninja_path)
    ninjadeps.restamp(str(spec.build_dir / ".ninja_deps"), stamps)
    subprocess.run(pool._cmd(job, "-t", "restat"), capture_output=True, timeout=120)
    left = pool.dry_run(job)
    if left:
        return {"status": "stale", "why": f"ninja would run: {left[0][:300]}"}
    return {}
