"""Creating directories of ours (P4: check, then create): the deepest level that exists, another uid's tree
it would be made in (``sudo -E``), and every new level ``0700`` whatever the umask."""

from __future__ import annotations

import os
from collections import namedtuple

from flashinfer_sm120.safety.ownership import deepest_existing

__all__ = ["make_private_dirs", "ForeignTree", "foreign_tree", "foreign_tree_parts", "foreign_tree_message"]


def make_private_dirs(path: str | os.PathLike, mode: int = 0o700) -> None:
    """Create ``path`` and its missing parents ``0700`` whatever the umask, or ``mode`` less the umask (``0o755``:
    FlashInfer's workspace, which a root-built cache's readers need, never writable by others).  Raises ``OSError``."""
    path = os.path.abspath(os.fspath(path))
    top = deepest_existing(path)
    missing = []
    while path != top:
        missing.append(path)
        path = os.path.dirname(path)
    for d in reversed(missing):
        try:
            os.mkdir(d, mode)
        except FileExistsError:
            continue
        if mode == 0o700:
            os.chmod(d, 0o700)


#: Creating ``path`` would put ``uid``'s directory inside ``top``, which ``owner`` owns (``sudo -E``).
ForeignTree = namedtuple("ForeignTree", "path top owner uid")


def foreign_tree(path: str) -> ForeignTree | None:
    """A :class:`ForeignTree` when the absent ``path`` would be made in another uid's tree; creates nothing (P4)."""
    if os.path.lexists(path):
        return None
    top = os.path.realpath(deepest_existing(path))
    try:
        owner = os.stat(top).st_uid
    except OSError:
        return None  # the caller's own checks name what cannot be read
    uid = os.geteuid()
    return None if owner in (0, uid) else ForeignTree(os.path.abspath(path), top, owner, uid)


def foreign_tree_parts(ft: ForeignTree, variable: str) -> tuple[str, str]:
    """``(why, fix)`` for a :class:`ForeignTree` (P8): "run as its owner" only in the home this process was
    given (``sudo -E``), never for another uid's directory named on purpose."""
    where = f"it would be created inside {ft.top}, owned by uid {ft.owner}, as uid {ft.uid}"
    home = os.path.realpath(os.environ.get("HOME") or "/")
    try:
        theirs = home != "/" and os.stat(home).st_uid == ft.owner and os.path.commonpath([home, ft.top]) == home
    except OSError:
        theirs = False
    if theirs:
        return (f"{where}: that user's own tools could not write it (pip, FlashInfer and others use ~/.cache)",
                f"keep your own home (sudo -H instead of sudo -E), run as uid {ft.owner} (sudo -u), or set HOME "
                f"to a directory of your own (setting only {variable} leaves other caches under HOME)")
    return f"{where}, who could replace it", f"set {variable} to a directory of your own"


def foreign_tree_message(what: str, ft: ForeignTree, variable: str = "FLASHINFER_SM120_CACHE_DIR") -> str:
    """The sentence for a :class:`ForeignTree`: ``what``, its value, why and the fix."""
    why, fix = foreign_tree_parts(ft, variable)
    return f"{what}={ft.path!r} does not exist, and {why}. Fix: {fix}"
