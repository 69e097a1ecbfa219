"""Creating directories of ours (P4: check, then create): the deepest level that exists, another uid's tree
it would be made in (``sudo -E``), and every new level ``0700`` whatever the umask."""

from __future__ import annotations

import os
from collections import namedtuple

from flashinfer_sm120.safety.ownership import deepest_existing

__all__ = ["make_private_dirs", "ForeignTree", "foreign_tree", "foreign_tree_message"]


def make_private_dirs(path: str | os.PathLike, *, mode: int = 0o700) -> None:
    """Create ``path`` and its missing parents with exactly ``mode`` whatever the umask.  Raises ``OSError``."""
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
        os.chmod(d, mode)


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


def foreign_tree_message(what: str, ft, variable: str = "FLASHINFER_SM120_CACHE_DIR") -> str:
    """The sentence for a :class:`ForeignTree`, with the fix."""
    return (f"{what}={ft.path!r} does not exist, and it would be created inside {ft.top}, owned by uid "
            f"{ft.owner}, as uid {ft.uid}: that user's own tools could not write it (pip, FlashInfer "
            f"and others use ~/.cache). Run as uid {ft.owner} (sudo -u), keep your own home "
            f"(sudo -H instead of sudo -E), or set {variable} to a directory of your own")
