"""``flashinfer-sm120 cache prune``: what in the two caches is no longer used, and removing it.

The two cache roots:

* ours, :func:`flashinfer_sm120.safety.fs.statedir.cache_root`: ``cuda-home/<view>`` directories;
* FlashInfer's, ``$FLASHINFER_WORKSPACE_BASE/.cache/flashinfer`` (else ``~/.cache/flashinfer``;
  ``flashinfer/jit/env.py`` 0.7.4 ``FLASHINFER_CACHE_DIR``), and SGLang's, which sets
  ``FLASHINFER_WORKSPACE_BASE`` to ``$SGLANG_CACHE_DIR`` (``~/.cache/sglang``) unless set
  (``sglang/srt/environ.py`` ``third_party_cache_defaults``, SGLang 0.5.23).  JIT
  workspaces are the directories holding ``cached_ops`` (``<version>/<arch>[/<nvcc tag>]``).

What is stale (listed with the reason; removed with ``--yes``):

* a view whose toolkit is gone (its nvcc no longer exists) or changed (nvcc replaced,
  the curand headers gone), of an older layout, or whose metadata is damaged: no process
  adopts such a view again (:func:`flashinfer_sm120.core.view.check_view`);
* a JIT workspace whose toolkit is gone (the ``cuda_home`` its ``build.ninja`` names has no
  ``bin/nvcc``) or changed (the nvcc tag no longer matches that toolkit), or whose
  FlashInfer release is no longer installed where it was built from (the
  ``.../flashinfer/data/include`` its ``build.ninja`` names is gone or holds another release);
* with ``--older-than DAYS``, also anything not used for that long (last use: the newest
  access or change of a module's ``.so``, or of a view's link stub).

Never removed (``threat-model: P3``): what a running process uses.  Each process that uses a
view or a JIT workspace holds its lease (:mod:`flashinfer_sm120.safety.fs.lease`); an entry whose lease
cannot be taken exclusively without waiting is kept, and the lease is held while the entry goes.
Also kept: a builder's lock held (``cuda-home/.lock`` as :mod:`flashinfer_sm120.core.view.build` takes
it, FlashInfer's per-module ``cached_ops/tmp/<module>.lock``, ``flashinfer/jit/core.py``
``JitSpec.lock_path``), and, as a second opinion from ``/proc`` that can only keep, never remove,
a file mapped, a working directory, or a ``CUDA_HOME`` at exec of a process of this user; another user's
directory, a symlink, anything not under a root by its real path.  Removal renames the
directory to a hidden name beside it, then deletes it with :func:`shutil.rmtree`, which
does not follow symlinks (and is used only where it is safe against symlink races).
"""

from __future__ import annotations

import os
import shutil
import time

from flashinfer_sm120.diagnose.prune.find import DAY, Entry, fi_roots, scan_jit, scan_views, size_of, views_dir
from flashinfer_sm120.safety.fs import lease
from flashinfer_sm120.diagnose.prune.hold import (current_locks, held_paths, holder, lock_free, remove_empty_parents, remove_entry,
                   sweep_leases, take_locks, under)
from flashinfer_sm120.safety.formats import plural

__all__ = ["Entry", "fi_roots", "scan", "remove", "held_paths", "doctor_section", "doctor_lines", "size_of", "human"]


def scan(older_than_days: float | None = None, *, now: float | None = None) -> dict:
    """Every view and JIT workspace under the roots, each with why it may go or must stay."""
    now = time.time() if now is None else now
    views = views_dir()
    roots = [{"what": "flashinfer-sm120", "path": os.path.dirname(views) if views else None}]
    roots += [{"what": "FlashInfer", "path": r} for r in fi_roots()]
    entries = []
    for r in fi_roots():
        entries += scan_jit(r)
    used_homes = {os.path.realpath(e.cuda_home) for e in entries if e.cuda_home and not e.reason}
    view_entries = scan_views(views) if views else []
    if older_than_days is not None:
        cut = now - older_than_days * DAY
        for e in entries + view_entries:
            if e.reason is None and e.kept is None and e.last_used is not None and e.last_used < cut:
                if e.kind == "view" and os.path.realpath(e.path) in used_homes:
                    continue  # a kept JIT workspace builds with it
                e.reason = f"not used for {(now - e.last_used) / DAY:.0f} days (--older-than {older_than_days:g})"
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
        elif (why := lease.place_problem(e.path)) is not None:  # threat-model: P3 -- no process leases it there
            e.kept = f"no process takes a lease on it where it lies ({why}): never removed"
        elif not all(os.path.lexists(p) for p in e.remove):
            e.kept = "gone since it was listed (another prune removing it?)"
        elif not all(under(e.root, p) for p in e.remove):
            e.kept = "not under the cache root by its real path (a symlink on the way): never removed"
        elif (leased := lease.lease_state(e.path)):  # threat-model: P3 -- the lease is the answer; /proc only adds
            e.kept = leased
        elif (held_by := holder(e, held)):
            e.kept = held_by if held is None else f"in use: {held_by}"
        else:
            busy = [lk for lk in (e.locks if e.kind == "jit" else [view_lock]) if lk and not lock_free(lk)]
            if busy:
                e.kept = f"a running process holds {busy[0]} (building or loading it)"
    for r in roots:
        r["bytes"] = size_of(r["path"]) if r["path"] else 0
    stale = [e for e in entries if e.reason and not e.kept]
    return {"roots": roots, "entries": entries, "stale": len(stale), "stale_bytes": sum(e.bytes for e in stale),
            "older_than_days": older_than_days}


def remove(report: dict) -> dict:
    """Remove every stale entry of a :func:`scan` report not kept, under the builders' locks."""
    if not getattr(shutil.rmtree, "avoids_symlink_attacks", False):
        for e in report["entries"]:
            if e.reason and not e.kept:
                e.kept, e.error = "not removed", "shutil.rmtree is not safe against symlink races on this platform"
        return report
    views = [e for e in report["entries"] if e.kind == "view" and e.reason and not e.kept]
    view_locks = take_locks([os.path.join(os.path.dirname(views[0].path), ".lock")]) if views else []
    if views and view_locks is None:
        for e in views:
            e.kept = "a running process holds the CUDA_HOME view lock (building a view)"
    try:
        for e in report["entries"]:
            if not e.reason or e.kept:
                continue
            # a lock whose directory is gone (another prune removed the workspace) is not taken:
            # taking it would create the directories again
            paths = [p for p in current_locks(e) if os.path.isdir(os.path.dirname(p))]
            # threat-model: P3 -- the lease taken exclusively, without waiting, and held while the
            # entry goes: a process starting now waits, then finds it gone and builds anew
            # (a parent gone: another prune removed it, and remove_entry says so)
            fd = lease.take_exclusive(e.path) if os.path.isdir(os.path.dirname(e.path)) else -1
            if fd is None:
                e.kept = f"in use: a running process holds its lease ({lease.lease_path(e.path)})"
                continue
            try:
                locks = take_locks(paths) if e.kind == "jit" else []
                if locks is None:
                    e.kept = "a running process took a module lock meanwhile"
                    continue
                try:
                    remove_entry(e, frozenset(os.path.basename(p) for p in paths))
                finally:
                    for lk in locks:
                        lk.release()
            finally:
                if fd >= 0:
                    lease.end_exclusive(e.path, fd, e.removed)
            if e.removed:
                remove_empty_parents(e)
        if view_locks is not None and (vdir := views_dir()):
            sweep_leases(vdir)
    finally:
        for lk in view_locks or []:
            lk.release()
    return report


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
        lines.append(f"  {plural(section['stale'], 'stale entry', 'stale entries')}, {human(section['stale_bytes'])}: "
                     f"'flashinfer-sm120 cache prune' lists them, '... --yes' removes them")
    return lines
