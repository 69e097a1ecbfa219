"""The views and JIT workspaces in the cache roots, and why each may go: a view no process adopts again, a
workspace whose toolkit or FlashInfer is gone or changed, or anything unused for ``--older-than``.  Writes nothing."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import re
import stat

from flashinfer_sm120.errors import FormatError
from flashinfer_sm120.safety.formats.grammar import parse_version
from flashinfer_sm120.safety.formats.reads import read_json_file, read_text
from flashinfer_sm120.safety.formats.binary import ninja_variables
from flashinfer_sm120.safety.fs.statedir import cache_root, home_dir
from flashinfer_sm120.core.facts.workspace import tag_for
from flashinfer_sm120.diagnose.tree import walk_tree

__all__ = ["Entry", "DAY", "HIDDEN_RE", "mount_in", "tree_of", "fi_roots", "views_dir", "times", "scan_views",
           "workspaces", "scan_jit", "unaccounted"]

_TAG_RE = re.compile(r"^nvcc[0-9][0-9.]*-[0-9a-f]{8}$")
_FI_INCLUDE_RE = re.compile(r"-isystem (\S+/flashinfer)/data/include(?:\s|$)")
DAY = 86400.0
#: The name a directory takes beside itself just before its files go (threat-model: P5 -- never half there under
#: its own name); one left by a stopped prune is removed by the next.
HIDDEN_RE = re.compile(r"^\..+\.pruning-[0-9a-f]{8}$")
LEFTOVER = "left hidden by a prune that was stopped while removing it: nothing uses it"
#: What FlashInfer 0.7.4 itself writes in a JIT workspace (``flashinfer/jit/core.py``: the log its import makes).
FI_NAMES = {"cached_ops", "generated", "flashinfer_jit.log"}
FI_LOG = "flashinfer_jit.log"


@dataclasses.dataclass
class Entry:
    """One view or JIT workspace: ``reason`` why it may go (``None``: current), ``kept`` why it stays anyway."""

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


def mount_in(path: str, mounts: list[str] | tuple) -> str | None:
    """The first of ``mounts`` (mount points, :func:`~flashinfer_sm120.core.jitenv.memory.mountinfo`) at or under
    ``path``."""
    real = os.path.realpath(path)
    return next((m for m in mounts if m == real or m.startswith(real + "/")), None)


def tree_of(path: str, uid: int | None = None, mounts: list[str] | tuple = ()) -> tuple[int, str | None]:
    """Bytes on disk under ``path`` on its own filesystem (links not followed), and why it must stay: a mount point
    in it (one of ``mounts``, or another ``st_dev``) or, with ``uid``, a path another uid owns; ``None``: neither."""
    try:
        top = os.lstat(path)
    except OSError:
        return 0, None
    point, points, real = mount_in(path, mounts), set(mounts), os.path.realpath(path)
    # threat-model: P3/P4 -- nothing outside the roots (another filesystem) and nothing of another user is removed
    why = f"{point} in it is a mount point (another filesystem)" if point else None
    if uid is not None and top.st_uid != uid:
        why = why or f"owned by uid {top.st_uid}, not you"
    total = top.st_blocks * 512
    for root, dirs, files in walk_tree(path) if stat.S_ISDIR(top.st_mode) else ():
        same = []
        for n, is_dir in itertools.chain(((d, True) for d in dirs), ((f, False) for f in files)):
            p = os.path.join(root, n)
            try:
                st = os.lstat(p)
            except OSError:
                continue
            if st.st_dev != top.st_dev or (is_dir and real + p[len(path):] in points):  # neither counted nor entered
                why = why or f"{p} in it is a mount point (another filesystem)"
                continue
            total += st.st_blocks * 512
            if uid is not None and st.st_uid != uid:
                why = why or f"{p} in it is owned by uid {st.st_uid}, not you"
            if is_dir:
                same.append(n)
        dirs[:] = same
    return total, why


def fi_roots() -> list[str]:
    """FlashInfer's and SGLang's cache roots that exist, real paths, each trusted (P2: a planted link is not one)."""
    from flashinfer_sm120.core.facts.workspace import workspace_base
    from flashinfer_sm120.safety.ownership import trust_reason

    base = workspace_base()[0]
    sg = (os.environ.get("SGLANG_CACHE_DIR")
          or os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.join(home_dir() or "/", ".cache"), "sglang"))
    out = []
    for r in (os.path.join(base, ".cache", "flashinfer"), os.path.join(sg, ".cache", "flashinfer")):
        if os.path.isdir(r) and os.path.realpath(r) not in out and trust_reason(r) is None:
            out.append(os.path.realpath(r))
    return out


def views_dir() -> str | None:
    try:
        d = os.path.join(cache_root(), "cuda-home")
    except Exception:
        return None
    return d if os.path.isdir(d) and not os.path.islink(d) else None


def times(paths) -> float | None:
    """The latest access or change of any of ``paths`` (``None``: none exists)."""
    found = []
    for p in paths:
        with contextlib.suppress(OSError):
            st = os.lstat(p)
            found.append(max(st.st_atime, st.st_mtime))
    return max(found, default=None)


# ----------------------------------------------------------------------------- views


def _entries(kind: str, root: str, paths: list[str], fill) -> list[Entry]:
    """One :class:`Entry` per path, ``fill(ent)`` says why it may go; one it cannot read is kept."""
    out = []
    for path in paths:
        ent = Entry(kind, path, root, [path])
        try:
            fill(ent)
        except OSError as exc:  # another user's, or removed meanwhile by another prune
            ent.kept = f"cannot be read ({exc.strerror or exc}): never removed"
        out.append(ent)
    return out


def scan_views(views: str) -> list[Entry]:
    try:
        # not the lock, nor builders' .tmp-*: only views and what a stopped prune left
        names = sorted(n for n in os.listdir(views) if not n.startswith(".") or HIDDEN_RE.match(n))
    except OSError:
        return []
    return _entries("view", views, [os.path.join(views, n) for n in names], _scan_view)


def _scan_view(ent: Entry) -> None:
    from flashinfer_sm120.safety.ownership import fingerprint
    from flashinfer_sm120.core.view.meta import META_NAME, STUB, VIEW_LAYOUT, VIEW_NAME_RE, ViewMeta

    if not stat.S_ISDIR(os.lstat(ent.path).st_mode):
        ent.kept = "not a directory of ours (a symlink or a file): never followed or removed"
        return
    if HIDDEN_RE.match(os.path.basename(ent.path)):
        ent.reason = LEFTOVER
        return
    if not VIEW_NAME_RE.fullmatch(os.path.basename(ent.path)):
        ent.kept = "not named as a view of ours: never removed"
        return
    ent.last_used = times([os.path.join(ent.path, STUB), ent.path])
    try:
        raw = read_json_file(os.path.join(ent.path, META_NAME), 64 << 10, follow=False)
        meta, problem = ViewMeta.from_json(raw)
    except FormatError as exc:
        raw, meta, problem = None, None, str(exc)
    layout = raw.get("layout") if isinstance(raw, dict) else None
    if type(layout) is int and layout != VIEW_LAYOUT:  # its other fields are another version's: not damage
        ent.reason = f"layout {layout} of another flashinfer-sm120 version: never adopted again"
    elif meta is None:
        ent.reason = f"damaged ({problem}): never adopted again"
    elif not os.path.isfile(meta.nvcc):
        ent.reason = f"its toolkit is gone ({meta.nvcc} no longer exists)"
    elif fingerprint(meta.nvcc) != meta.nvcc_fingerprint:
        ent.reason = f"its toolkit changed ({meta.nvcc} was replaced since the view was built)"
    elif meta.curand_include and not os.path.isdir(meta.curand_include):
        ent.reason = f"its curand headers are gone ({meta.curand_include})"


# ----------------------------------------------------------------------------- JIT workspaces


def workspaces(root: str, depth: int = 5) -> list[str]:
    """Directories under ``root`` that hold ``cached_ops``, and those a stopped prune left hidden (no link followed)."""
    found, base = [], root.rstrip(os.sep).count(os.sep)
    for d, dirs, _files in walk_tree(root):
        found += [os.path.join(d, n) for n in dirs if HIDDEN_RE.match(n)]
        if "cached_ops" in dirs and d != root:
            found.append(d)
        level = d.rstrip(os.sep).count(os.sep) - base
        skip = ("cached_ops", "generated", "tmp")
        dirs[:] = [n for n in dirs if n not in skip and not HIDDEN_RE.match(n)] if level < depth else []
    return sorted(found)


def _flashinfer_at(site: str | None):
    """``(text, parsed)`` of the flashinfer-python installed in ``site`` (``None``: here); ``None`` each when absent."""
    import importlib.metadata as md

    dists = md.distributions(path=[site]) if site else md.distributions()
    text = next((d.version for d in dists
                 if (d.metadata.get("Name") or "").lower().replace("_", "-") == "flashinfer-python"), None)
    try:
        return text, parse_version(text, "the installed FlashInfer's metadata") if text else None
    except FormatError:
        return text, None


def workspace_reason(ws: str, ops: str, rel: list[str], ent: Entry) -> str | None:
    ninja_vars = None
    for e in sorted(os.scandir(ops), key=lambda e: e.name):
        f = os.path.join(e.path, "build.ninja")
        if e.name != "tmp" and e.is_dir(follow_symlinks=False) and os.path.isfile(f):
            with contextlib.suppress(FormatError):
                ninja_vars = ninja_variables(read_text(f, 4 << 20, follow=False), f)
                break
    version = None
    if "." in rel[0]:  # a release (0.7.4); arch directories (90a, 120f) of older layouts have no dot
        with contextlib.suppress(FormatError):
            version = parse_version(rel[0], ws)
    if ninja_vars is None:
        here, parsed = _flashinfer_at(None)
        if version and parsed != version:
            return f"no module built, and FlashInfer {version} is not installed here ({here or 'none'})"
        return None
    home = ninja_vars.get("cuda_home") or ""
    ent.cuda_home = home or None
    m = _FI_INCLUDE_RE.search(ninja_vars.get("common_cflags", ""))
    if m:
        pkg = m.group(1)
        if not os.path.isdir(pkg):
            return f"the FlashInfer that built it is gone ({pkg})"
        now, parsed = _flashinfer_at(os.path.dirname(pkg))
        if version and now and parsed != version:
            return f"FlashInfer {version} is no longer installed ({pkg} now holds {now})"
    if home and not os.path.isfile(os.path.join(home, "bin", "nvcc")):
        return f"its toolkit is gone ({home}/bin/nvcc no longer exists)"
    tag = rel[-1]
    if home and _TAG_RE.match(tag):
        from flashinfer_sm120.core.toolkit.probe import inspect

        real = os.path.realpath(os.path.join(home, "bin", "nvcc"))
        tk = inspect(os.path.dirname(os.path.dirname(real)))
        if tk.nvcc and tag_for(tk) != tag:
            return f"its toolkit changed ({tag} was built by an nvcc that is now {tag_for(tk)})"
    return None


def scan_jit(root: str) -> list[Entry]:
    found = workspaces(root)
    return (_entries("jit", root, found, _scan_workspace)
            + _entries("jit", root, unaccounted(root, found), _scan_unaccounted))


def unaccounted(root: str, found: list[str]) -> list[str]:
    """The topmost directories under ``root`` neither a workspace of ``found``, in one, nor above one (P8: every
    directory is listed; a refused or target-less import leaves such as ``0.7.4/122a``)."""
    out, inside = [], tuple(f + os.sep for f in found)
    for d, dirs, _files in walk_tree(root):
        above = []
        for n in dirs:
            p = os.path.join(d, n)
            if p in found or p.startswith(inside):
                continue
            if any(f.startswith(p + os.sep) for f in found):
                above.append(n)
            else:
                out.append(p)
        dirs[:] = above
    return sorted(out)


def _scan_unaccounted(ent: Entry) -> None:
    """Gone when it holds only FlashInfer's empty log (an import that built nothing), else kept as unknown."""
    for d, _dirs, files in walk_tree(ent.path):
        if any(n != FI_LOG or os.lstat(os.path.join(d, n)).st_size for n in files):
            ent.kept = "no cached_ops in it and files other than FlashInfer's empty log: unknown, never removed"
            return
    ent.last_used = times([ent.path])
    ent.reason = "no module in it: empty, or only FlashInfer's empty log (an import that built nothing)"


def _scan_workspace(ent: Entry) -> None:
    ws = ent.path
    if HIDDEN_RE.match(os.path.basename(ws)):
        ent.reason = LEFTOVER
        return
    ops = os.path.join(ws, "cached_ops")
    names = set(os.listdir(ws))
    if not names <= FI_NAMES:  # a workspace holding more (another's below it): only FlashInfer's own go
        ent.remove = [os.path.join(ws, n) for n in ("cached_ops", "generated") if n in names]
    sos, locks = [], []
    for e in os.scandir(ops):
        if e.name == "tmp" and e.is_dir(follow_symlinks=False):
            locks = [os.path.join(e.path, n) for n in os.listdir(e.path) if n.endswith(".lock")]
        elif e.is_dir(follow_symlinks=False):
            sos.append(os.path.join(e.path, f"{e.name}.so"))
    ent.locks = locks
    ent.last_used = times(sos + locks) or times([ops])
    ent.reason = workspace_reason(ws, ops, os.path.relpath(ws, ent.root).split(os.sep), ent)
