"""``cache prune``: the stale views and JIT workspaces (:mod:`.find`), and removing them.  threat-model: P3 --
the lease decides (taken exclusively without waiting, kept when it cannot be taken); a module lock held or
``/proc`` can only keep.  P2/P4 -- another uid's entry, a link, anything not under its root by real path stays."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import secrets
import stat
import time

from flashinfer_sm120.errors import FormatError
from flashinfer_sm120.safety.formats.reads import read_bytes, read_text
from flashinfer_sm120.safety.formats.binary import proc_maps_paths
from flashinfer_sm120.safety.fs import inuse, lease
from flashinfer_sm120.core.jitenv.memory import mountinfo
from flashinfer_sm120.diagnose.prune.find import (DAY, HIDDEN_RE, Entry, fi_roots, mount_in, scan_jit, scan_views,
                                                tree_of, views_dir)
from flashinfer_sm120.diagnose.tree import remove_tree

__all__ = ["Entry", "fi_roots", "scan", "remove", "held_paths", "holder", "lock_free", "doctor_section", "tree_of"]


def scan(older_than_days: float | None = None, *, now: float | None = None) -> dict:
    """Every view and JIT workspace under the roots, each with why it may go or must stay."""
    now = time.time() if now is None else now
    views, fi = views_dir(), fi_roots()
    roots = [{"what": "flashinfer-sm120", "path": os.path.dirname(views) if views else None}]
    roots += [{"what": "FlashInfer", "path": r} for r in fi]
    entries = [e for r in fi for e in scan_jit(r)]
    view_entries = scan_views(views) if views else []

    if older_than_days is not None:
        def age(group: list[Entry]) -> None:
            for e in group:
                if e.reason is None and e.kept is None and e.last_used is not None and e.last_used < cut:
                    e.reason = f"not used for {(now - e.last_used) / DAY:.0f} days (--older-than {older_than_days:g})"

        cut = now - older_than_days * DAY
        age(entries)  # the workspaces first: a view stays while one that stays builds with it
        used_homes = {os.path.realpath(e.cuda_home) for e in entries if e.cuda_home and not e.reason}
        age([v for v in view_entries if os.path.realpath(v.path) not in used_homes])
    entries += view_entries
    held = held_paths() if any(e.reason for e in entries) else {}
    view_lock = os.path.join(views, ".lock") if views else None
    uid, mounts = os.geteuid(), [point for _root, point, _fs, _opts in mountinfo()]
    for e in entries:
        trees = [tree_of(p, uid, mounts) for p in e.remove] if e.kept is None else []
        e.bytes = sum(n for n, _why in trees)
        if e.reason is None or e.kept:
            continue
        try:
            owner = os.lstat(e.path).st_uid
        except OSError:
            owner = uid
        if owner != uid:
            e.kept = f"owned by uid {owner}, not you"
        elif (inside := next((why for _n, why in trees if why), None)):  # a mount point, another uid's file
            e.kept = f"{inside}: never removed"
        elif (why := lease.place_problem(e.path)) is not None:  # threat-model: P3 -- no process leases it there
            e.kept = f"no process takes a lease on it where it lies ({why}): never removed"
        elif not all(os.path.lexists(p) for p in e.remove):
            e.kept = "gone since it was listed (another prune removing it?)"
        elif not all(under(e.root, p) for p in e.remove):
            e.kept = "not under the cache root by its real path (a symlink on the way): never removed"
        elif (leased := inuse.lease_state(e.path)):  # threat-model: P3 -- the lease is the answer; /proc only adds
            e.kept = leased
        elif (held_by := holder(e.remove, held)):
            e.kept = held_by if held is None else f"in use: {held_by}"
        else:
            busy = [lk for lk in (e.locks if e.kind == "jit" else [view_lock]) if lk and not lock_free(lk)]
            if busy:
                e.kept = f"a running process holds {busy[0]} (building or loading it)"
    for e in entries:  # P8: --json says why every entry stays, as the text does, and only what was checked
        if e.reason is None and e.kept is None:
            e.kept = ("still usable: its toolkit is installed" if e.kind == "view" else
                      "still usable: its toolkit (and FlashInfer release) are installed" if e.cuda_home else
                      "no module in it names its toolkit (no readable build.ninja with a cuda_home), so it cannot "
                      "be shown unused")
    for r in roots:
        r["bytes"] = tree_of(r["path"], mounts=mounts)[0] if r["path"] else 0
    stale = [e for e in entries if e.reason and not e.kept]
    return {"roots": roots, "entries": entries, "stale": len(stale), "stale_bytes": sum(e.bytes for e in stale),
            "older_than_days": older_than_days, "interrupted": None}


def remove(report: dict) -> dict:
    """Remove every stale entry of a :func:`scan` report not kept, under the builders' locks."""
    views = [e for e in report["entries"] if e.kind == "view" and e.reason and not e.kept]
    with contextlib.ExitStack() as view_locks:
        views_free = not views or take_locks(view_locks, [os.path.join(os.path.dirname(views[0].path), ".lock")])
        for e in () if views_free else views:
            e.kept = "a running process holds the CUDA_HOME view lock (building a view)"
        for e in report["entries"]:
            if not e.reason or e.kept:
                continue
            # a lock whose directory is gone (another prune removed the workspace) is not taken:
            # taking it would create the directories again
            paths = [p for p in current_locks(e) if os.path.isdir(os.path.dirname(p))]
            # threat-model: P3 -- the lease taken exclusively, without waiting, and held while the
            # entry goes: a process starting now waits, then finds it gone and builds anew
            # (a parent gone: another prune removed it, and remove_entry says so)
            fd = inuse.take_exclusive(e.path) if os.path.isdir(os.path.dirname(e.path)) else -1
            if fd is None:
                e.kept = f"in use: a running process holds its lease ({lease.lease_path(e.path)})"
                continue
            try:
                with contextlib.ExitStack() as locks:
                    if e.kind == "jit" and not take_locks(locks, paths):
                        e.kept = "a running process took a module lock meanwhile"
                        continue
                    remove_entry(e)
            finally:
                if fd >= 0:
                    inuse.end_exclusive(e.path, fd, not os.path.lexists(e.path))  # its name is gone: the lease too
            if e.removed:
                remove_empty_parents(e)
        if views_free and (vdir := views_dir()):
            sweep_leases(vdir)
    return report


# ----------------------------------------------------------------------------- who holds what


def under(root: str, path: str) -> bool:
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


#: Why nothing may be removed when ``/proc`` cannot show who uses what.
BLIND = ("cannot tell which processes use it: /proc does not show this process (no /proc mounted, or "
         "another PID namespace, such as a sidecar container); run cache prune where the servers run")


def held_paths() -> dict[str, int] | None:
    """``{path: pid}`` mapped, cwd, or ``CUDA_HOME``/``CUDA_PATH`` at exec of this user's other processes (all as
    root): can only keep (P3); ``None`` when ``/proc`` does not list this process (another PID namespace)."""
    out: dict[str, int] = {}
    me, uid = os.getpid(), os.geteuid()
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return None
    if me not in pids:
        return None
    for pid in pids:
        if pid == me:
            continue
        base = f"/proc/{pid}"
        try:
            if uid != 0 and os.stat(base).st_uid != uid:
                continue
            for p in proc_maps_paths(read_text(f"{base}/maps", 64 << 20), f"{base}/maps"):
                out.setdefault(p, pid)
            out.setdefault(os.readlink(f"{base}/cwd"), pid)
            env = read_bytes(f"{base}/environ", 1 << 20).split(b"\0")
        except (OSError, FormatError):
            continue
        for item in env:
            k, _, v = item.partition(b"=")
            if k in (b"CUDA_HOME", b"CUDA_PATH") and v.startswith(b"/"):
                out.setdefault(os.path.realpath(v.decode("utf-8", "replace")), pid)
    return out


def holder(paths: list[str], held: dict[str, int] | None) -> str | None:
    """Which process of ``held`` (:func:`held_paths`) uses something under one of ``paths``."""
    if held is None:
        return BLIND
    for target in paths:
        real = os.path.realpath(target)
        for p, pid in held.items():
            if p == real or p.startswith(real + "/"):
                return f"process {pid} uses {p}"
    return None


def lock_free(path: str) -> bool:
    """Whether nobody holds ``path``'s flock (a read-only probe: creates nothing)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:  # no lock: nobody holds it
        return True
    except OSError:  # cannot tell (no descriptor left, a link, unreadable): not free
        return False
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


def take_locks(stack: contextlib.ExitStack, paths: list[str]) -> bool:
    """Every one of ``paths``' flocks taken without waiting, held by ``stack``; ``False`` (none held) when one is busy."""
    import filelock

    try:
        for p in paths:
            stack.enter_context(filelock.FileLock(p, timeout=0, mode=0o600))
    except (filelock.Timeout, OSError):
        stack.close()
        return False
    return True


def current_locks(e: Entry) -> list[str]:
    """The module locks of a JIT workspace *now*: a module first built after the scan has one too."""
    if e.kind != "jit":
        return []
    tmp = os.path.join(e.path, "cached_ops", "tmp")
    try:
        names = os.listdir(tmp)
    except OSError:
        names = []
    return sorted(set(e.locks) | {os.path.join(tmp, n) for n in names if n.endswith(".lock")})


def remove_entry(e: Entry) -> None:
    """Remove each directory of ``e``, checked again first (it may have moved, a mount or a process without a lease
    may have come since the scan: ``/proc`` keeps it, P3); the caller holds its lease and module locks."""
    gone = 0
    for target in e.remove:
        if not os.path.lexists(target):  # another prune (or the user) removed it since the scan
            gone += 1
            continue
        if not under(e.root, target) or not stat.S_ISDIR(os.lstat(target).st_mode):
            e.error = f"{target} changed since the scan; left alone"
            return
        busy = holder([target], held_paths())
        point = mount_in(target, [point for _root, point, _fs, _opts in mountinfo()])
        if busy or point:
            e.kept = f"in use: {busy}" if busy else f"{point} in it is a mount point: never removed"
            return
        name = os.path.basename(target)
        hidden = target if HIDDEN_RE.match(name) else os.path.join(
            os.path.dirname(target), f".{name[:200]}.pruning-{secrets.token_hex(4)}")
        try:
            # threat-model: P5 -- its name goes at once: a half-removed directory is never taken for a usable one
            os.rename(target, hidden)
            remove_tree(hidden)
        except OSError as exc:
            e.error = f"{target}: {exc.strerror or exc}"
            return
        except BaseException:  # a signal (P8): what is left lies hidden, and the next prune removes it
            if os.path.lexists(hidden):
                e.error = f"stopped while removing it: the rest is left as {hidden}, which the next prune removes"
            e.removed = not any(os.path.lexists(p) for p in (hidden, *e.remove))
            raise
    if gone == len(e.remove):
        e.bytes = 0  # freed by whoever removed it
        e.reason = f"{e.reason}; another process removed it first"
    e.removed = True


def sweep_leases(directory: str) -> None:
    """Remove the lease files in ``directory`` whose directory is gone and that nobody holds."""
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for n in names:
        target = inuse.target_of(os.path.join(directory, n))
        if target is None or os.path.lexists(target):
            continue
        fd = inuse.take_exclusive(target)  # threat-model: P3 -- a holder keeps it
        if fd is not None:
            inuse.end_exclusive(target, fd, removed=not os.path.lexists(target))


def remove_empty_parents(e: Entry) -> None:
    """Remove the directories above a removed entry that are empty now, up to its root."""
    parent = os.path.dirname(e.remove[0])
    while parent != e.root and under(e.root, parent):
        try:
            os.rmdir(parent)  # only when empty
        except OSError:
            break
        parent = os.path.dirname(parent)


def doctor_section(report: dict) -> dict:
    """``doctor``'s ``caches`` section: the size of both caches and what ``cache prune`` would remove."""
    res = scan()
    return {"roots": res["roots"], "stale": res["stale"], "stale_bytes": res["stale_bytes"]}
