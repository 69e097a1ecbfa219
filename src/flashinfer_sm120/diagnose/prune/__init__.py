"""``flashinfer-sm120 cache prune``: which views and JIT workspaces are stale, and removing them.

Roots: ours (``cache_root()/cuda-home``), FlashInfer's (``$FLASHINFER_WORKSPACE_BASE/.cache/flashinfer``,
``flashinfer/jit/env.py`` 0.7.4) and SGLang's (it sets ``FLASHINFER_WORKSPACE_BASE`` to ``$SGLANG_CACHE_DIR``,
``sglang/srt/environ.py`` 0.5.23).  Why an entry may go: :mod:`.find`.

threat-model: P3 -- in use is what a process's lease says (:mod:`flashinfer_sm120.safety.fs.lease`): removal
takes it exclusively without waiting and keeps what it cannot take; a builder's lock held and ``/proc``
(a second opinion) can only keep.  P2/P4 -- another uid's entry, a symlink, anything not under its root by
its real path is kept.  Removal renames the directory aside, checks again, then deletes it without
following links (:mod:`flashinfer_sm120.diagnose.tree`).
"""

from __future__ import annotations

import os
import time

from flashinfer_sm120.diagnose.prune.find import DAY, Entry, fi_roots, scan_jit, scan_views, size_of, views_dir
from flashinfer_sm120.safety.fs import lease
from flashinfer_sm120.diagnose.prune.hold import (current_locks, held_paths, holder, lock_free, remove_empty_parents, remove_entry,
                   sweep_leases, take_locks, under)

__all__ = ["Entry", "fi_roots", "scan", "remove", "held_paths", "doctor_section", "size_of"]


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
        elif (held_by := holder(e.remove, held)):
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
