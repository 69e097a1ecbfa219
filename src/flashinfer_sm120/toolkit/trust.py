"""Who may own what flashinfer-sm120 executes or adopts."""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = ["is_trusted"]


def is_trusted(path: str) -> str | None:
    """Check that ``path`` and every directory above it are safe to execute from.

    A file is trusted when it and each parent are owned by root or by the current
    user and are not writable by group or others (a world-writable directory with
    the sticky bit, like ``/tmp``, is allowed: others cannot replace entries in it).
    This is the rule OpenSSH applies to ``authorized_keys`` (``StrictModes``).

    Returns:
        ``None`` when trusted, else a sentence naming the offending path and mode.
    """
    uid = os.geteuid() if hasattr(os, "geteuid") else 0
    p = Path(os.path.realpath(path))
    for node in [p, *p.parents]:
        try:
            st = node.stat()
        except OSError as exc:
            return f"cannot stat {node}: {exc.strerror}"
        if st.st_uid not in (0, uid):
            return f"{node} is owned by uid {st.st_uid}, not root or you"
        writable_by_others = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        if writable_by_others and not (node.is_dir() and st.st_mode & stat.S_ISVTX):
            return (
                f"{node} is writable by other users (mode {stat.filemode(st.st_mode)}); "
                f"run 'chmod go-w {node}' or use another toolkit"
            )
    return None

