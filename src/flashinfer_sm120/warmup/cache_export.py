"""What a cache export is, and writing one (``cache export``): FlashInfer's JIT cache entries of modules
built here, with a ``meta.json`` that the import's grammar (:func:`parse_meta`) accepts.
:mod:`.cache_import` reads an export and installs it.

Layout (a new directory, or a ``.tar``/``.tar.gz``/``.tgz`` archive)::

    flashinfer-sm120-cache/meta.json          fingerprint, manifest entries, sha256 of every file
    flashinfer-sm120-cache/jit/NAME/...       FlashInfer's module dir: objects, .so, build.ninja, ninja log/deps
    flashinfer-sm120-cache/generated/...      sources FlashInfer generated for the module
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import io
import json
import os
import shutil
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

from flashinfer_sm120.core.facts import buildline
from flashinfer_sm120.core.jitenv import manifest
from flashinfer_sm120.errors import FormatError
from flashinfer_sm120.safety import formats
from flashinfer_sm120.warmup import modules as _modules
from flashinfer_sm120.warmup.regenerate import make_spec
from flashinfer_sm120.warmup import ninjacmd, pool, session
from flashinfer_sm120.warmup.session import BuildError, Session

__all__ = ["TOP", "FORMAT", "MAX_META_BYTES", "FIX", "CacheError", "Limits", "Module", "Meta", "Budget",
           "parse_meta", "refused", "member_rel", "file_sha256", "umask", "built_entries", "check_out",
           "nvcc_targets", "built_targets", "ARCHIVES", "export"]

TOP = "flashinfer-sm120-cache"
FORMAT = 1
#: Most parts of a path meta.json lists (``generated/a/b/...``); a member adds the top folder.
_MAX_PARTS = 16
#: Largest meta.json read (bytes): it carries manifest entries with their generated sources.
MAX_META_BYTES = 64 << 20
FIX = "give the path `flashinfer-sm120 cache export` wrote"
_FINGERPRINT = {"flashinfer": str, "targets": list, "cuda_version": str, "cuda_home": str, "jit_dir": str}


class CacheError(BuildError):
    """A refused export or import.  ``kind`` says what kind of refusal (``archive``: the export
    itself is not what `cache export` writes; ``mismatch``: it was made for another machine;
    ``space``, ``permission``, ``path``, ``exists``...: :data:`flashinfer_sm120.safety.oserrors.BY_ERRNO`),
    ``fix`` the fix alone (also at the end of the message).  threat-model: P8"""

    def __init__(self, message: str, kind: str = "archive", fix: str = "") -> None:
        super().__init__(message)
        self.kind, self.fix = kind, fix

    def __reduce__(self):
        return (type(self), (str(self), self.kind, self.fix))


@dataclasses.dataclass(frozen=True)
class Limits:
    """Caps on what an export writes and an import reads and writes (``--max-bytes``), the same for an
    archive and a directory (threat-model: P6, P7): files, bytes and members counted on headers and
    sizes before anything is written, and on the bytes actually read while copying; ``max_seconds``
    bounds each pass over an archive."""

    max_total: int = 32 << 30
    max_file: int = 8 << 30
    max_members: int = 100_000
    max_seconds: float = 600.0

    def max_stream(self) -> int:
        """Most bytes one pass may read out of an archive's decompressor: the files, meta.json,
        and a header and padding per member (threat-model: P6)."""
        return self.max_total + MAX_META_BYTES + (self.max_members + 2) * 3 * 512


@dataclasses.dataclass(frozen=True)
class Module:
    """One module of an export: FlashInfer's name, ``{relative path: sha256}`` (every jit/ path under
    ``jit/<name>/``, every other under ``generated/``) and the name ``build`` gives it (``decode-bf16-hd128``;
    FlashInfer's where none was recorded: a manifest's module, an export of 0.3.0 or before)."""

    name: str
    files: dict[str, str]
    label: str = ""


@dataclasses.dataclass(frozen=True)
class Meta:
    """An export's ``meta.json``, every field checked (:func:`parse_meta`)."""

    format: int
    fingerprint: dict[str, Any]
    modules: tuple[Module, ...]
    manifest: tuple[dict, ...]


def refused(src: str, what: str) -> CacheError:
    """The refusal of the whole export ``src`` for ``what``, with the fix."""
    return CacheError(f"{src}: {what}; refusing the whole archive; {FIX}", "archive", FIX)


def parse_meta(obj: Any, source: str) -> Meta:
    """Check a decoded ``meta.json`` field by field (:mod:`flashinfer_sm120.safety.formats`).

    :raises CacheError: the first field that is not of its grammar, named with a cut value; module
        names are names, file paths relative paths of names under ``jit/<module>/`` or ``generated/``,
        no path is both a file and a directory, every digest is SHA-256, manifest entries parse
        (:func:`~flashinfer_sm120.core.jitenv.manifest.parse_entry`)."""
    f = formats.field
    try:
        fmt = f(obj, "format", int, source, fix=FIX)
        if fmt != FORMAT:
            raise CacheError(f"{source} is export format {fmt}; this version reads {FORMAT}", "archive",
                             f"export it again with this flashinfer-sm120 (format {FORMAT})")
        fp_obj = f(obj, "fingerprint", dict, source, fix=FIX)
        # threat-model: P6, P8 -- as many targets as a manifest entry may carry: more would be printed
        # whole ("using the archive's targets ...") and refused as a too-long "--arch" never given
        fp = {k: f(fp_obj, k, kind, f"{source} 'fingerprint'", fix=FIX,
                   max_len=manifest._MAX_TARGETS if k == "targets" else 4096)
              for k, kind in _FINGERPRINT.items()}
        fp["targets"] = [formats.parse_target(t, f"{source} 'fingerprint'", fix=FIX) for t in fp["targets"]]
        if "build_vars" in fp_obj:  # since flashinfer-sm120 0.2.x; older exports lack it
            fp["build_vars"] = buildline.checked(fp_obj["build_vars"])
            if fp["build_vars"] is None:
                raise CacheError(f"{source}: 'fingerprint' 'build_vars' is not a set of FlashInfer's build-line "
                                 f"variables; {FIX}", "archive", FIX)
        mods, seen, names = [], {}, set()
        for m in f(obj, "modules", list, source, fix=FIX, max_len=10_000):
            name = formats.parse_name(f(m, "name", str, f"{source} module", fix=FIX), f"{source} module", fix=FIX)
            if name in names:
                raise CacheError(f"{source}: module {name} is listed twice; {FIX}", "archive", FIX)
            names.add(name)
            files = {}
            for rel, sha in f(m, "files", dict, f"{source} module {name}", fix=FIX, max_len=100_000).items():
                parts = formats.parse_relpath(rel, f"{source} module {name}", fix=FIX, max_parts=_MAX_PARTS)
                if not ((parts[0] == "jit" and len(parts) > 2 and parts[1] == name)
                        or (parts[0] == "generated" and len(parts) > 1)):
                    raise CacheError(f"{source}: module {name} names {formats.shown(rel)}, outside jit/{name}/ "
                                     f"and generated/; {FIX}", "archive", FIX)
                files[rel] = formats.parse_sha256(sha, f"{source} module {name} {rel}", fix=FIX)
                for i in range(1, len(parts) + 1):  # a path cannot be a file and a directory at once
                    prefix = "/".join(parts[:i])
                    kind = "file" if i == len(parts) else "dir"
                    if seen.setdefault(prefix, kind) != kind:
                        raise CacheError(f"{source}: {formats.shown(prefix)} is both a file and a directory; {FIX}",
                                         "archive", FIX)
            label = f(m, "label", str, f"{source} module {name}", default=name, fix=FIX)  # build's name; 0.3.1+
            mods.append(Module(name, files, formats.parse_name(label, f"{source} module {name} label", fix=FIX)))
        entries = [manifest.parse_entry(e, f"{source} manifest entry {i + 1}")
                   for i, e in enumerate(f(obj, "manifest", list, source, default=[], fix=FIX, max_len=10_000))]
    except FormatError as exc:
        raise CacheError(str(exc), "archive", exc.fix or FIX) from None
    return Meta(fmt, fp, tuple(mods), tuple(entries))


def member_rel(name: str, src: str) -> str:
    """``name`` (an archive member) relative to the top folder, refusing anything that could land
    outside it: every part must be a name (no ``..``, no absolute part, no empty part, no backslash)."""
    try:  # one more part than meta.json's paths may have: the top folder
        parts = formats.parse_relpath(name, f"{src}: archive member", max_parts=_MAX_PARTS + 1)
    except FormatError as exc:
        raise refused(src, f"member {formats.shown(name)} is not a plain relative path ({exc})") from None
    if parts[0] != TOP:
        raise refused(src, f"member {formats.shown(name)} is outside {TOP}/")
    return "/".join(parts[1:])


class Budget:
    """The bytes an export or import may still copy (``--max-bytes``), counted on the bytes actually
    read, not on sizes a header or ``stat`` declared (a file may grow while read).  threat-model: P6"""

    def __init__(self, limits: Limits) -> None:
        self.limits, self.left = limits, limits.max_total

    def take(self, n: int, src: object) -> None:
        self.left -= n
        if self.left < 0:
            raise over_cap(formats.shown(str(src), 300), "the export's files add up to more", self.limits,
                           per_file=False)


def over_cap(src: str, what: str, limits: Limits, *, per_file: bool) -> CacheError:
    """The refusal of ``src`` for ``what`` (``member m is N bytes``) over the cap that refused it:
    ``--max-bytes`` (the files' total; the fix says how to raise it), or the per-file cap, which no
    option changes.  threat-model: P6, P8"""
    if per_file:
        return CacheError(f"{src}: {what}, over the per-file cap of {limits.max_file} bytes (which no "
                          f"option changes); refusing the whole export; {FIX}", "archive", FIX)
    fix = "pass a larger --max-bytes if you trust this export"
    return CacheError(f"{src}: {what} than the {limits.max_total}-byte cap of --max-bytes (default 32G); "
                      f"refusing the whole export; {fix}", "archive", fix)


def file_sha256(path: Path) -> str:
    """The SHA-256 of the file at ``path``, as meta.json records each file of an export."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def umask() -> int:
    """This process's umask, read without changing it (``/proc/self/status``); ``077`` if unknown."""
    try:
        for line in formats.read_text("/proc/self/status", 1 << 16).splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8) & 0o777
    except (FormatError, ValueError, IndexError):
        pass
    return 0o077


@contextlib.contextmanager
def _capturing():
    """While active, every ``JitSpecNvcc`` made notes the FlashInfer generator and parameters that
    made it, as ``FLASHINFER_SM120_RECORD`` does (:mod:`flashinfer_sm120.core.jitenv.record`)."""
    from flashinfer.jit import core

    from flashinfer_sm120.core.jitenv.generators import capture

    cls = core.JitSpecNvcc
    original = cls.__dict__["__init__"]

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        capture(self)

    cls.__init__ = init
    try:
        yield
    finally:
        cls.__init__ = original


def built_entries(names: list[str], everything: bool, arch: str | None, *, head_dims=None, dtypes=None,
                  kv_dtypes=None, acts=None):
    """``(entries, skipped, session, labels)`` for modules built here by the names ``build`` takes, so an
    export needs no recorded manifest: a manifest entry (:func:`~flashinfer_sm120.core.jitenv.manifest.encode`
    of FlashInfer's own spec) per variant of ``names`` (every name ``build`` knows when ``everything``,
    keeping those built here), ``(name, why)`` for what cannot be exported, and ``{FlashInfer's name:
    build's}`` (``decode-bf16-hd128``), the names said to the user.

    :raises ModuleError: an unknown name or variant flag.
    :raises BuildError: FlashInfer cannot be set up, or ``everything`` finds nothing built."""
    variants = _modules.expand(["all"] if everything else names, head_dims=head_dims, dtypes=dtypes,
                               kv_dtypes=kv_dtypes, acts=acts)
    sess = session.prepare(arch)  # the caller pointed the workspace at the server's (apply_server_cache)
    entries, skipped, labels = [], [], {}
    with _capturing():
        for v in variants:
            try:
                spec = v.spec()
            except Exception as exc:  # FlashInfer refuses this combination here
                skipped.append((v.label, f"FlashInfer's {v.generator} raised {exc!r}"))
                continue
            if everything and not spec.jit_library_path.exists():
                continue  # --all: only what is built here
            entry = manifest.encode(spec, sess.flashinfer, sess.targets)
            if not entry.get("regenerable"):
                skipped.append((spec.name, entry.get("why", "")))
                continue
            entries.append(entry)
            labels[spec.name] = v.label
    if everything:
        for d in sorted(sess.jit_dir.iterdir()) if sess.jit_dir.is_dir() else ():
            if d.is_dir() and d.name not in labels and (d / f"{d.name}.so").exists():
                skipped.append((d.name, "built with parameters `build` does not name; record a manifest "
                                        "(FLASHINFER_SM120_RECORD) and export with --from"))
        if not entries:
            raise BuildError(f"nothing `build` can name is built in {sess.jit_dir} for "
                             f"{nvcc_targets(sess.targets)}; build it first (`flashinfer-sm120 build "
                             f"--arch ... MODULE`) or give the same --head-dim/--dtype as the build")
    return entries, skipped, sess, labels


def nvcc_targets(targets: list[str]) -> str:
    """Targets as nvcc and ``build`` spell them for the user: ``['12.0f', '12.1f']`` -> ``sm_120f sm_121f``."""
    return " ".join("sm_" + t.replace(".", "") for t in targets)


def built_targets() -> dict[str, int]:
    """``{target set: modules built}`` in this machine's FlashInfer JIT workspace (FlashInfer's
    ``<workspace>/<release>/<targets>/`` directories, ``120f_121f``, each holding a JIT dir per toolkit
    under flashinfer-sm120), target sets as ``--arch`` takes them (``sm_120f sm_121f``); read only,
    nothing imported: what an export without ``--arch`` on a machine without a GPU exports."""
    from flashinfer_sm120.core.facts.workspace import workspace_path
    from flashinfer_sm120.core.patch.resolve import flashinfer_version

    root = Path(workspace_path()[0]) / (flashinfer_version() or "none")
    out = {}
    for key in sorted(os.listdir(root)) if root.is_dir() else ():
        built = {so.parent.name for pattern in ("*/cached_ops/*/*.so", "cached_ops/*/*.so")
                 for so in (root / key).glob(pattern) if so.stem == so.parent.name}
        if built:
            out[" ".join("sm_" + k for k in key.split("_"))] = len(built)
    return out


#: Archive names `cache export` writes; any other archive-looking name is refused, never made a directory.
ARCHIVES = (".tar", ".tar.gz", ".tgz")
_NOT_WRITTEN = (".zip", ".gz", ".xz", ".txz", ".bz2", ".tbz", ".tbz2", ".zst", ".tzst", ".lz4", ".lzma", ".7z", ".rar",
                ".z")


def check_out(out: str) -> None:
    """Refuse ``out`` unless it is absent or an empty directory (an export never overwrites), and
    unless its name is a directory's or an archive's that `cache export` writes (:data:`ARCHIVES`).

    :raises CacheError: kind ``exists``, or ``usage`` for a name ending like another archive."""
    name = out.lower()
    if not name.endswith(ARCHIVES) and name.endswith(_NOT_WRITTEN):
        fix = f"name the archive {', '.join(ARCHIVES[:-1])} or {ARCHIVES[-1]}, or give a directory"
        raise CacheError(f"{out} names an archive `cache export` cannot write; {fix}", "usage", fix)
    if os.path.lexists(out) and not (os.path.isdir(out) and not os.listdir(out)):
        fix = "choose a new path (an export never overwrites)"
        raise CacheError(f"{out} already exists; {fix}", "exists", fix)


def export(entries: list[dict], sess: Session, out: str, *, labels: dict[str, str] | None = None,
           limits: Limits = Limits()) -> list[tuple[str, str]]:
    """Write the JIT cache entries of ``entries`` (built on this machine) to ``out``, a directory or an
    archive, with the same caps and free-space check for both (threat-model: P6, P7).

    :returns: ``(build's name, FlashInfer's)`` of each module written (``labels``: build's names).
    :raises BuildError: a module is not built or not up to date here, ``out`` exists and is not an
        empty directory (never overwritten), is in a place another user controls, the files are over
        ``limits`` or do not fit on ``out``'s disk."""
    from flashinfer.jit import env as jit_env

    from flashinfer_sm120.safety.ownership import check_place

    check_out(out)
    labels = labels or {}
    files: list[tuple[str, Path]] = []
    mods = []
    gen_root = Path(jit_env.FLASHINFER_GEN_SRC_DIR)
    for entry in entries:
        spec = make_spec(entry, sess.flashinfer)
        if not spec.jit_library_path.exists() or ninjacmd.dry_run(pool.Job(spec.name, spec.build_dir, spec.ninja_path)):
            raise BuildError(f"{labels.get(spec.name, spec.name)} is not built (or not up to date) for "
                             f"{nvcc_targets(sess.targets)} here; "
                             "build it first (`flashinfer-sm120 build` with the same module names, or --from "
                             "MANIFEST)")
        mine = [(f"jit/{spec.name}/{f.name}", f) for f in sorted(spec.build_dir.iterdir())
                if f.is_file() and not f.is_symlink() and not f.name.endswith((".lock", ".ninja_lock"))]
        mine += [("generated/" + p[len("@GEN@/"):], gen_root / p[len("@GEN@/"):]) for p in entry.get("generated") or {}]
        files += mine
        mods.append({"name": spec.name, "label": labels.get(spec.name, spec.name),
                     "files": {rel: file_sha256(f) for rel, f in mine}})
    blob = json.dumps({"format": FORMAT, "fingerprint": sess.fingerprint(), "modules": mods, "manifest": entries,
                       "created": time.time()}, indent=1).encode()
    # threat-model: P7 (what export writes, import accepts: checked by the import's own grammar first)
    parse_meta(json.loads(blob), "the export's meta.json")
    for rel, _ in files:
        member_rel(f"{TOP}/{rel}", out)
    _check_space(out, len(blob) + sum(os.lstat(f).st_size for _, f in files), limits)
    # threat-model: P4, P7: both forms go where another user can neither write nor replace what we put
    # (an archive there could be swapped for one carrying their .so; a planted link could redirect writes)
    archive = out.lower().endswith(ARCHIVES)
    problem = check_place(os.path.dirname(os.path.abspath(out)) if archive else out,
                          "the export's directory" if archive else "the export directory",
                          "export to a new path in a directory of your own", doing="export into")
    if problem:
        raise CacheError(str(problem), "place", problem.fix)
    if archive:
        _write_archive(out, blob, files)
    else:
        _write_directory(out, blob, files, Budget(limits))
    return [(m["label"], m["name"]) for m in mods]


def _check_space(out: str, total: int, limits: Limits) -> None:
    """Refuse an export of ``total`` bytes (``lstat`` sizes: a sparse file is written at its full length)
    over ``--max-bytes`` or the free space where it goes, before anything is written.  threat-model: P6, P7"""
    if total > limits.max_total:
        fix = "pass a larger --max-bytes, or export fewer modules"
        raise CacheError(f"the export to {out} would be {total} bytes, more than the {limits.max_total}-byte "
                         f"cap (--max-bytes); {fix}", "limit", fix)
    where = formats.deepest_existing(out)
    free = shutil.disk_usage(where).free
    if total > free:
        fix = f"free space on the disk of {where}, or export to another disk"
        raise CacheError(f"the export to {out} needs {total} bytes and {where} has {free} free; {fix}", "space", fix)


def _appeared(out: str) -> BuildError:
    return BuildError(f"{out} appeared while the export was written; choose a new path (an export never overwrites)")


def _write_directory(out: str, blob: bytes, files: list[tuple[str, Path]], budget: Budget) -> None:
    """The export written into a new private directory beside ``out``, renamed to ``out`` when whole
    (onto nothing, or onto the empty directory that was there): a failed export leaves nothing
    behind, and only its creator removes the directory.  threat-model: P4, P5"""
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(os.path.abspath(out))}.", suffix=".partial",
                           dir=os.path.dirname(os.path.abspath(out)))
    try:
        root = Path(tmp) / TOP
        formats.make_private_dirs(root)
        for rel, f in [*files, ("meta.json", None)]:
            dest = formats.safe_join(root, rel, out)
            formats.make_private_dirs(dest.parent)
            # O_EXCL | O_NOFOLLOW: nothing there is followed or replaced
            fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            with os.fdopen(fd, "wb") as fh, (open(f, "rb") if f else io.BytesIO(blob)) as src:
                for block in iter(lambda: src.read(1 << 20), b""):
                    budget.take(len(block), dest)  # threat-model: P6
                    fh.write(block)
            if f:
                shutil.copystat(f, dest)
        os.chmod(tmp, 0o777 & ~umask())  # as a plain mkdir would have made it
        try:
            os.rename(tmp, out)  # replaces only an empty directory; never a file or a full directory
        except OSError as exc:
            if exc.errno in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR, errno.EISDIR):
                raise _appeared(out) from None
            raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _write_archive(out: str, blob: bytes, files: list[tuple[str, Path]]) -> None:
    """The archive, written to a new private file beside ``out`` (``mkstemp``: a random name, nothing of
    that name opened, followed or truncated), then linked to ``out``, which fails rather than replace
    anything that appeared there meanwhile.  threat-model: P5"""
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(out)}.", suffix=".partial",
                               dir=os.path.dirname(os.path.abspath(out)))
    try:
        with os.fdopen(fd, "wb") as fh, tarfile.open(fileobj=fh, mode="w:gz" if out.lower().endswith("gz") else "w") as tar:
            info = tarfile.TarInfo(f"{TOP}/meta.json")
            info.size, info.mtime, info.mode = len(blob), int(time.time()), 0o644
            tar.addfile(info, io.BytesIO(blob))
            for rel, f in files:
                tar.add(str(f), arcname=f"{TOP}/{rel}", recursive=False)
        os.chmod(tmp, 0o666 & ~umask())  # as a plain open() would have made it
        try:
            os.link(tmp, out)
        except FileExistsError:
            raise _appeared(out) from None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
