"""Walking and removing trees of any depth, following no symlink (threat-model: P6): ``os.walk`` (before
Python 3.12) and ``shutil.rmtree`` (before 3.13) recurse per level, a ``RecursionError`` on a deep tree."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator

__all__ = ["walk_tree", "remove_tree"]

_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


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


def remove_tree(path: str) -> None:
    """``shutil.rmtree``'s fd-relative variant for any depth, one descriptor open at a time (up via ``..``, by inode)."""
    parent = os.open(os.path.dirname(path) or ".", _DIR_FLAGS & ~getattr(os, "O_NOFOLLOW", 0))
    fd = None
    try:
        fd = os.open(os.path.basename(path), _DIR_FLAGS, dir_fd=parent)
        depth, dev = 0, os.fstat(fd).st_dev
        while True:
            child = None
            with os.scandir(fd) as it:
                for e in it:
                    if e.is_dir(follow_symlinks=False):
                        child = e.name
                        break
                    os.unlink(e.name, dir_fd=fd)
            if child is not None:
                new = os.open(child, _DIR_FLAGS, dir_fd=fd)
                if os.fstat(new).st_dev != dev:  # threat-model: P3 -- another filesystem is never entered
                    os.close(new)
                    raise OSError(errno.EXDEV, f"{child} under it is a mount point (another filesystem): left")
                os.close(fd)
                fd, depth = new, depth + 1
                continue
            if depth == 0:
                break
            ino = os.fstat(fd).st_ino
            up = os.open("..", _DIR_FLAGS & ~getattr(os, "O_NOFOLLOW", 0), dir_fd=fd)
            os.close(fd)
            fd, depth = up, depth - 1
            with os.scandir(fd) as it:
                name = next((e.name for e in it if e.inode() == ino and e.is_dir(follow_symlinks=False)), None)
            if name is None:
                raise OSError(f"{path}: a directory under it is not found again by its inode (moved, or a mount point)")
            os.rmdir(name, dir_fd=fd)
        st = os.fstat(fd)
        os.close(fd)
        fd = None
        if not stat.S_ISDIR(st.st_mode):
            raise OSError(f"{path} is not a directory")
        os.rmdir(os.path.basename(path), dir_fd=parent)
    finally:
        if fd is not None:
            os.close(fd)
        os.close(parent)
