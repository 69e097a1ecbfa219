"""Walking a tree of any depth, following no symlink (threat-model: P6): ``os.walk`` (before Python 3.12)
recurses per level, a ``RecursionError`` on a deep tree."""

from __future__ import annotations

import os
from collections.abc import Iterator

__all__ = ["walk_tree"]


def walk_tree(top: str) -> Iterator[tuple[str, list[str], list[str]]]:
    """``os.walk(top)`` without recursion (clearing ``dirnames`` prunes); links are files, unreadable paths skipped."""
    stack = [top]
    while stack:
        path = stack.pop()
        dirs, files = [], []
        try:
            with os.scandir(path) as it:
                for e in it:
                    try:
                        (dirs if e.is_dir(follow_symlinks=False) else files).append(e.name)
                    except OSError:
                        files.append(e.name)
        except OSError:
            continue
        yield path, dirs, files
        stack.extend(os.path.join(path, d) for d in reversed(dirs))

