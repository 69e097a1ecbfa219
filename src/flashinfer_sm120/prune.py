"""``flashinfer-sm120 cache prune``: what in the two caches is no longer used, and removing it.

The two cache roots:

* ours, :func:`flashinfer_sm120.cache.cache_root`: ``cuda-home/<view>`` directories;
* FlashInfer's, ``$FLASHINFER_WORKSPACE_BASE/.cache/flashinfer`` (else ``~/.cache/flashinfer``;
  ``flashinfer/jit/env.py`` 0.7.4 ``FLASHINFER_CACHE_DIR``), and SGLang's, which sets
  ``FLASHINFER_WORKSPACE_BASE`` to ``$SGLANG_CACHE_DIR`` (``~/.cache/sglang``) unless set
  (``sglang/srt/environ.py`` ``third_party_cache_defaults``, SGLang 0.5.23).  JIT
  workspaces are the directories holding ``cached_ops`` (``<version>/<arch>[/<nvcc tag>]``).

What is stale (listed with the reason; removed with ``--yes``):

* a view whose toolkit is gone (its nvcc no longer exists) or changed (nvcc replaced,
  the curand headers gone), of an older layout, or whose metadata is damaged: no process
  adopts such a view again (:func:`flashinfer_sm120.view.check_view`);
* a JIT workspace whose toolkit is gone (the ``cuda_home`` its ``build.ninja`` names has no
  ``bin/nvcc``) or changed (the nvcc tag no longer matches that toolkit), or whose
  FlashInfer release is no longer installed where it was built from (the
  ``.../flashinfer/data/include`` its ``build.ninja`` names is gone or holds another release);
* with ``--older-than DAYS``, also anything not used for that long (last use: the newest
  access or change of a module's ``.so``, or of a view's link stub).

Never removed: what a running process holds (a builder's lock: ``cuda-home/.lock`` as
:mod:`flashinfer_sm120.view.build` takes it, FlashInfer's per-module
``cached_ops/tmp/<module>.lock``, ``flashinfer/jit/core.py`` ``JitSpec.lock_path``; a file
mapped, a working directory, or a ``CUDA_HOME`` of a process of this user), another user's
directory, a symlink, anything not under a root by its real path.  Removal renames the
directory to a hidden name beside it, then deletes it with :func:`shutil.rmtree`, which
does not follow symlinks (and is used only where it is safe against symlink races).
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import os
import re
import shutil
import stat
import time
import uuid

from . import formats

__all__ = ["Entry", "fi_roots", "scan", "remove", "held_paths", "doctor_section", "doctor_lines", "size_of"]

_TAG_RE = re.compile(r"^nvcc[0-9][0-9.]*-[0-9a-f]{8}$")
_FI_INCLUDE_RE = re.compile(r"-isystem (\S+/flashinfer)/data/include(?:\s|$)")
_DAY = 86400.0


@dataclasses.dataclass
class Entry:
    """One view or JIT workspace: ``reason`` says why it may go (``None``: in use),
    ``kept`` why it stays although it may go."""

    kind: str
    path: str
    root: str
    remove: list[str]
    bytes: int = 0
    last_used: float | None = None
    reason: str | None = None
    kept: str | None = None
    locks: list[str] = dataclasses.field(default_factory=list)
    cuda_home: str | None = None
    removed: bool = False
    error: str | None = None


def size_of(path: str) -> int:
    """Bytes on disk under ``path`` (blocks, links not followed)."""
    total = 0
    for root, dirs, files in os.walk(path):
        for n in dirs + files:
            try:
                total += os.lstat(os.path.join(root, n)).st_blocks * 512
            except OSError:
                pass
    try:
        total += os.lstat(path).st_blocks * 512
    except OSError:
        pass
    return total


def _home() -> str:
    from .cache import _home as home

    return home() or "/"


def fi_roots() -> list[str]:
    """FlashInfer's cache roots that exist, real paths, without repeats."""
    base = os.environ.get("FLASHINFER_WORKSPACE_BASE") or _home()
    sg = (os.environ.get("SGLANG_CACHE_DIR")
          or os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.join(_home(), ".cache"), "sglang"))
    out = []
    for r in (os.path.join(base, ".cache", "flashinfer"), os.path.join(sg, ".cache", "flashinfer")):
        if os.path.isdir(r) and os.path.realpath(r) not in out:
            out.append(os.path.realpath(r))
    return out


def _views_dir() -> str | None:
    from .cache import cache_root

    try:
        d = os.path.join(cache_root(), "cuda-home")
    except Exception:
        return None
    return d if os.path.isdir(d) and not os.path.islink(d) else None


def _under(root: str, path: str) -> bool:
    """``path`` is below ``root`` by its real path and no component between is a symlink."""
    rel = os.path.relpath(path, root)
    if rel.startswith("..") or rel == ".":
        return False
    cur = root
    for part in rel.split(os.sep):
        cur = os.path.join(cur, part)
        try:
            if stat.S_ISLNK(os.lstat(cur).st_mode):
                return False
        except OSError:
            return False
    return os.path.realpath(path) == os.path.join(os.path.realpath(root), rel)


def _times(paths) -> float | None:
    best = None
    for p in paths:
        try:
            st = os.lstat(p)
        except OSError:
            continue
        t = max(st.st_atime, st.st_mtime)
        best = t if best is None else max(best, t)
    return best


# ----------------------------------------------------------------------------- views


def _scan_views(views: str) -> list[Entry]:
    from .view.meta import META_NAME, STUB, VIEW_LAYOUT, ViewMeta, fingerprint

    out = []
    for e in sorted(os.scandir(views), key=lambda e: e.name):
        if e.name.startswith("."):
            continue  # the lock and builders' .tmp-* directories (the builder cleans those)
        ent = Entry("view", e.path, views, [e.path])
        out.append(ent)
        if e.is_symlink() or not e.is_dir(follow_symlinks=False):
            ent.kept = "not a directory of ours (a symlink or a file): never followed or removed"
            continue
        ent.last_used = _times([os.path.join(e.path, STUB), e.path])
        try:
            meta, problem = ViewMeta.from_json(formats.read_json_file(os.path.join(e.path, META_NAME), 64 << 10,
                                                                      follow=False))
        except formats.FormatError as exc:
            meta, problem = None, str(exc)
        if meta is None:
            ent.reason = f"damaged ({problem}): never adopted again"
        elif meta.layout != VIEW_LAYOUT:
            ent.reason = f"layout {meta.layout} of an older flashinfer-sm120: never adopted again"
        elif not os.path.isfile(meta.nvcc):
            ent.reason = f"its toolkit is gone ({meta.nvcc} no longer exists)"
        elif fingerprint(meta.nvcc) != meta.nvcc_fingerprint:
            ent.reason = f"its toolkit changed ({meta.nvcc} was replaced since the view was built)"
        elif meta.curand_include and not os.path.isdir(meta.curand_include):
            ent.reason = f"its curand headers are gone ({meta.curand_include})"
    return out


# ----------------------------------------------------------------------------- JIT workspaces


def _workspaces(root: str, depth: int = 5) -> list[str]:
    """Directories under ``root`` that hold ``cached_ops`` (links not followed)."""
    found, todo = [], [(root, 0)]
    while todo:
        d, level = todo.pop()
        try:
            entries = list(os.scandir(d))
        except OSError:
            continue
        for e in entries:
            if not e.is_dir(follow_symlinks=False) or e.name in ("generated", "tmp"):
                continue
            if e.name == "cached_ops":
                if d != root:
                    found.append(d)
            elif level < depth:
                todo.append((e.path, level + 1))
    return sorted(found)


def _installed_flashinfer(pkg: str) -> str | None:
    """Version of the FlashInfer distribution installed in ``pkg``'s site directory."""
    import importlib.metadata as md

    for dist in md.distributions(path=[os.path.dirname(pkg)]):
        if (dist.metadata.get("Name") or "").lower().replace("_", "-") == "flashinfer-python":
            return dist.version
    return None


def _workspace_reason(ws: str, ops: str, rel: list[str], ent: Entry) -> str | None:
    ninja_vars = None
    for e in sorted(os.scandir(ops), key=lambda e: e.name):
        f = os.path.join(e.path, "build.ninja")
        if e.name != "tmp" and e.is_dir(follow_symlinks=False) and os.path.isfile(f):
            try:
                ninja_vars = formats.ninja_variables(formats.read_text(f, 4 << 20, follow=False), f)
                break
            except formats.FormatError:
                continue
    version = None
    if "." in rel[0]:  # a release (0.7.4); arch directories (90a, 120f) of older layouts have no dot
        try:
            version = formats.parse_version(rel[0], ws)
        except formats.FormatError:
            pass
    if ninja_vars is None:
        here = _current_flashinfer()
        if version and (here is None or _version(here) != version):
            return f"no module built, and FlashInfer {version} is not installed here ({here or 'none'})"
        return None
    home = ninja_vars.get("cuda_home") or ""
    ent.cuda_home = home or None
    m = _FI_INCLUDE_RE.search(ninja_vars.get("common_cflags", ""))
    if m:
        pkg = m.group(1)
        if not os.path.isdir(pkg):
            return f"the FlashInfer that built it is gone ({pkg})"
        now = _installed_flashinfer(pkg)
        if version and now and _version(now) != version:
            return f"FlashInfer {version} is no longer installed ({pkg} now holds {now})"
    if home and not os.path.isfile(os.path.join(home, "bin", "nvcc")):
        return f"its toolkit is gone ({home}/bin/nvcc no longer exists)"
    tag = rel[-1]
    if home and _TAG_RE.match(tag):
        from .patch.steps import tag_for
        from .toolkit import inspect

        real = os.path.realpath(os.path.join(home, "bin", "nvcc"))
        tk = inspect(os.path.dirname(os.path.dirname(real)))
        if tk.nvcc and tag_for(tk) != tag:
            return f"its toolkit changed ({tag} was built by an nvcc that is now {tag_for(tk)})"
    return None


def _version(text: str):
    try:
        return formats.parse_version(text, "the installed FlashInfer's metadata")
    except formats.FormatError:
        return None


def _current_flashinfer() -> str | None:
    import importlib.metadata as md

    try:
        return md.version("flashinfer-python")
    except md.PackageNotFoundError:
        return None


def _scan_jit(root: str) -> list[Entry]:
    out = []
    for ws in _workspaces(root):
        ops = os.path.join(ws, "cached_ops")
        names = set(os.listdir(ws))
        remove = [ws] if names <= {"cached_ops", "generated"} else [
            os.path.join(ws, n) for n in ("cached_ops", "generated") if n in names]
        ent = Entry("jit", ws, root, remove)
        out.append(ent)
        sos, locks = [], []
        for e in os.scandir(ops):
            if e.name == "tmp" and e.is_dir(follow_symlinks=False):
                locks = sorted(os.path.join(e.path, n) for n in os.listdir(e.path) if n.endswith(".lock"))
            elif e.is_dir(follow_symlinks=False):
                sos.append(os.path.join(e.path, f"{e.name}.so"))
        ent.locks = locks
        ent.last_used = _times(sos + locks) or _times([ops])
        ent.reason = _workspace_reason(ws, ops, os.path.relpath(ws, root).split(os.sep), ent)
    return out


# ----------------------------------------------------------------------------- who holds what


def held_paths() -> dict[str, int]:
    """``{path: pid}`` of files mapped, working directories and ``CUDA_HOME``/``CUDA_PATH``
    of this user's other processes (``/proc``; every process's when run as root)."""
    out: dict[str, int] = {}
    me, uid = os.getpid(), os.geteuid()
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return out
    for pid in pids:
        if pid == me:
            continue
        base = f"/proc/{pid}"
        try:
            if uid != 0 and os.stat(base).st_uid != uid:
                continue
            for p in formats.proc_maps_paths(formats.read_text(f"{base}/maps", 64 << 20), f"{base}/maps"):
                out.setdefault(p, pid)
            out.setdefault(os.readlink(f"{base}/cwd"), pid)
            env = formats.read_bytes(f"{base}/environ", 1 << 20).split(b"\0")
        except (OSError, formats.FormatError):
            continue
        for item in env:
            k, _, v = item.partition(b"=")
            if k in (b"CUDA_HOME", b"CUDA_PATH") and v.startswith(b"/"):
                out.setdefault(os.path.realpath(v.decode("utf-8", "replace")), pid)
    return out


def _holder(ent: Entry, held: dict[str, int]) -> str | None:
    for target in ent.remove:
        real = os.path.realpath(target)
        for p, pid in held.items():
            if p == real or p.startswith(real + "/"):
                return f"process {pid} uses {p}"
    return None


def _lock_free(path: str) -> bool:
    """Whether nobody holds ``path``'s flock: probed on a read-only descriptor, so nothing is
    created, truncated or changed."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return True
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        return True
    finally:
        os.close(fd)


# ----------------------------------------------------------------------------- scan and remove


def scan(older_than_days: float | None = None, *, now: float | None = None) -> dict:
    """Every view and JIT workspace under the roots, each with why it may go or must stay."""
    now = time.time() if now is None else now
    views = _views_dir()
    roots = [{"what": "flashinfer-sm120", "path": os.path.dirname(views) if views else None}]
    roots += [{"what": "FlashInfer", "path": r} for r in fi_roots()]
    entries = []
    for r in fi_roots():
        entries += _scan_jit(r)
    used_homes = {os.path.realpath(e.cuda_home) for e in entries if e.cuda_home and not e.reason}
    view_entries = _scan_views(views) if views else []
    if older_than_days is not None:
        cut = now - older_than_days * _DAY
        for e in entries + view_entries:
            if e.reason is None and e.kept is None and e.last_used is not None and e.last_used < cut:
                if e.kind == "view" and os.path.realpath(e.path) in used_homes:
                    continue  # a kept JIT workspace builds with it
                e.reason = f"not used for {(now - e.last_used) / _DAY:.0f} days (--older-than {older_than_days:g})"
    entries += view_entries
    held = held_paths() if any(e.reason for e in entries) else {}
    view_lock = os.path.join(views, ".lock") if views else None
    uid = os.geteuid()
    for e in entries:
        e.bytes = sum(size_of(p) for p in e.remove) if e.kept is None else 0
        if e.reason is None or e.kept:
            continue
        try:
            owner = os.lstat(e.path).st_uid
        except OSError:
            owner = uid
        if owner != uid:
            e.kept = f"owned by uid {owner}, not you"
        elif not all(_under(e.root, p) for p in e.remove):
            e.kept = "not under the cache root by its real path (a symlink on the way): never removed"
        elif (held_by := _holder(e, held)):
            e.kept = f"in use: {held_by}"
        else:
            busy = [lk for lk in (e.locks if e.kind == "jit" else [view_lock]) if lk and not _lock_free(lk)]
            if busy:
                e.kept = f"a running process holds {busy[0]} (building or loading it)"
    for r in roots:
        r["bytes"] = size_of(r["path"]) if r["path"] else 0
    stale = [e for e in entries if e.reason and not e.kept]
    return {"roots": roots, "entries": entries, "stale": len(stale), "stale_bytes": sum(e.bytes for e in stale),
            "older_than_days": older_than_days}


def _take_locks(paths: list[str]):
    import filelock

    held = []
    try:
        for p in paths:
            lk = filelock.FileLock(p, timeout=0, mode=0o600)
            lk.acquire()
            held.append(lk)
    except (filelock.Timeout, OSError):
        for lk in held:
            lk.release()
        return None
    return held


def remove(report: dict) -> dict:
    """Remove every stale entry of a :func:`scan` report not kept, under the builders' locks."""
    if not getattr(shutil.rmtree, "avoids_symlink_attacks", False):
        for e in report["entries"]:
            if e.reason and not e.kept:
                e.kept, e.error = "not removed", "shutil.rmtree is not safe against symlink races on this platform"
        return report
    views = [e for e in report["entries"] if e.kind == "view" and e.reason and not e.kept]
    view_locks = _take_locks([os.path.join(os.path.dirname(views[0].path), ".lock")]) if views else []
    if views and view_locks is None:
        for e in views:
            e.kept = "a running process holds the CUDA_HOME view lock (building a view)"
    try:
        for e in report["entries"]:
            if not e.reason or e.kept:
                continue
            locks = _take_locks(e.locks) if e.kind == "jit" else []
            if locks is None:
                e.kept = "a running process took a module lock meanwhile"
                continue
            try:
                _remove_entry(e)
            finally:
                for lk in locks:
                    lk.release()
    finally:
        for lk in view_locks or []:
            lk.release()
    return report


def _remove_entry(e: Entry) -> None:
    for target in e.remove:
        if not _under(e.root, target) or not stat.S_ISDIR(os.lstat(target).st_mode):
            e.error = f"{target} changed since the scan; left alone"
            return
        hidden = os.path.join(os.path.dirname(target), f".flashinfer-sm120-prune-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        try:
            os.rename(target, hidden)
            shutil.rmtree(hidden)
        except OSError as exc:
            e.error = f"{target}: {exc.strerror or exc}"
            return
    parent = os.path.dirname(e.remove[0])
    while parent != e.root and _under(e.root, parent):
        try:
            os.rmdir(parent)  # only when empty
        except OSError:
            break
        parent = os.path.dirname(parent)
    e.removed = True


# ----------------------------------------------------------------------------- doctor


def doctor_section(report: dict) -> dict:
    """``doctor``'s ``caches`` section: the size of both caches and what ``cache prune`` would remove."""
    res = scan()
    return {"roots": res["roots"], "stale": res["stale"], "stale_bytes": res["stale_bytes"]}


def human(n: int) -> str:
    """``1.5 GiB``."""
    v = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if v < 1024 or unit == "TiB":
            return f"{v:.0f} {unit}" if unit == "B" else f"{v:.1f} {unit}"
        v /= 1024
    return f"{n} B"


def doctor_lines(section: dict) -> list[str]:
    """The ``caches`` section as ``doctor`` prints it."""
    lines = ["\nCaches:"]
    for r in section["roots"]:
        if r["path"]:
            lines.append(f"  {r['what']}: {r['path']} ({human(r['bytes'])})")
    if section["stale"]:
        lines.append(f"  {section['stale']} stale entries, {human(section['stale_bytes'])}: "
                     f"'flashinfer-sm120 cache prune' lists them, '... --yes' removes them")
    return lines
