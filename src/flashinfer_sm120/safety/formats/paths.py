"""Paths we write: joined under a root with the grammar of names, created private; and the one
rule for the characters of a path FlashInfer's ``build.ninja`` and ``/bin/sh`` carry (cache root,
``CUDA_HOME``, JIT workspace: :func:`path_problem`, :func:`jit_dir_problem`)."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


from flashinfer_sm120.safety.formats.grammar import parse_relpath
from flashinfer_sm120.safety.formats.base import _fail, shown, some

#: The ASCII characters besides letters and digits a path may hold unquoted in FlashInfer's
#: ``build.ninja`` and the ``/bin/sh -c`` lines ninja runs: syntax to neither.
PATH_ASCII_EXTRA = "_./+@%=,~-"

#: The path rule in words (messages, docs/safety.md).  Non-ASCII is accepted: FlashInfer 0.7.4 builds
#: and loads a module under such a path with nvcc 13.0 (tests/unit/safety/fs/test_state_dir.py).
PATH_RULE = (f"letters (of any alphabet), digits, '{PATH_ASCII_EXTRA}' and other printable non-ASCII "
             f"characters; no blank, no control character, none of $ : ; & | < > ( ) ' \" \\ ` * ? [ ] "
             f"# {{ }} ! (ninja or /bin/sh syntax)")


def _plain_char(c: str) -> bool:
    if c.isascii():
        return c.isalnum() or c in PATH_ASCII_EXTRA
    return c.isprintable() and not c.isspace()  # not U+00A0, U+2028, nor a surrogate (undecodable byte)


def path_chars_problem(path: str) -> list[str] | None:
    """The characters of ``path`` that break :data:`PATH_RULE`, sorted, or ``None``.  P8"""
    bad = sorted({c for c in path if not _plain_char(c)})
    return bad or None


def path_problem(path: str, what: str) -> str | None:
    """Why ``path`` (named ``what``) cannot be used unquoted as a cache or ``CUDA_HOME`` path, or ``None``."""
    if not os.path.isabs(path):
        return (f"{what}={shown(path)} is a relative path: builds and child processes run in other "
                f"directories; set it to an absolute path")
    bad = path_chars_problem(path)
    if bad:
        return (f"{what}={shown(path)} contains {some(bad, 8)}, which FlashInfer's generated build.ninja "
                f"and the shell lines it runs do not quote (the compile would fail); set it to a path of "
                f"{PATH_RULE}")
    return None


def jit_dir_problem(jit_dir: str) -> str | None:
    """Why FlashInfer's JIT directory cannot be used: FlashInfer 0.7.x writes it unquoted into every
    ``build.ninja`` (``generate_ninja_build_for_op``)."""
    fix = ("Fix: set FLASHINFER_WORKSPACE_BASE (or SGLANG_CACHE_DIR, which SGLang copies into it) to an "
           f"absolute directory whose path has only {PATH_RULE}")
    if not os.path.isabs(jit_dir):
        return (f"FlashInfer's JIT directory {shown(jit_dir)} is a relative path: each working directory "
                f"gets a JIT cache of its own. {fix}")
    bad = path_chars_problem(jit_dir)
    if not bad:
        return None
    return (f"FlashInfer's JIT directory {shown(jit_dir)} contains {some(bad, 8)}: FlashInfer writes it "
            f"unquoted into every build.ninja, where a blank or ':' breaks the line, '$x' is a ninja "
            f"variable and the shell reads its own syntax (the build would fail, or land in another "
            f"directory). {fix}")


def safe_join(root: str | os.PathLike, rel: str | Iterable[str], source: str, *, fix: str = "") -> Path:
    """``root/rel``, refused unless it stays under ``root``: every part of ``rel`` a name (no absolute
    part or ``..``), no existing part a symlink, every existing part but the last a directory."""
    parts = parse_relpath(rel if isinstance(rel, str) else "/".join(rel), source, fix=fix)
    base = Path(root)
    cur = base
    for i, part in enumerate(parts):
        cur = cur / part
        try:
            st = os.lstat(cur)
        except FileNotFoundError:
            break
        except OSError as exc:
            raise _fail(source, f"cannot check {cur} ({exc.strerror or exc})", fix) from None
        if stat.S_ISLNK(st.st_mode):
            raise _fail(source, f"{cur} is a symlink; nothing is written through links", fix)
        if i < len(parts) - 1 and not stat.S_ISDIR(st.st_mode):
            raise _fail(source, f"{cur} is not a directory", fix)
    return base.joinpath(*parts)


def make_private_dirs(path: str | os.PathLike, *, mode: int = 0o700) -> None:
    """Create ``path`` and its missing parents with exactly ``mode`` whatever the umask.  Raises ``OSError``."""
    path = os.path.abspath(os.fspath(path))
    missing = []
    p = path
    while not os.path.lexists(p):
        missing.append(p)
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    for d in reversed(missing):
        try:
            os.mkdir(d, mode)
        except FileExistsError:
            continue
        os.chmod(d, mode)


@dataclass(frozen=True)
class ForeignTree:
    """Creating ``path`` would put a directory of ``uid`` inside ``top``, which ``owner`` owns:
    root with a user's ``HOME`` (``sudo -E``) would leave a ``~/.cache`` the user cannot write."""

    path: str
    top: str
    owner: int
    uid: int


def deepest_existing(path: str) -> str:
    """The deepest level of ``path`` (made absolute) that exists; ``/`` at worst."""
    p = os.path.abspath(path)
    while not os.path.lexists(p) and os.path.dirname(p) != p:
        p = os.path.dirname(p)
    return p


def foreign_tree(path: str) -> ForeignTree | None:
    """A :class:`ForeignTree` when ``path`` is absent and its deepest existing level (links resolved)
    is neither this uid's nor root's; creates nothing.  threat-model: P4"""
    if os.path.lexists(path):
        return None
    top = os.path.realpath(deepest_existing(path))
    try:
        owner = os.stat(top).st_uid
    except OSError:
        return None  # the caller's own checks name what cannot be read
    uid = os.geteuid()
    return None if owner in (0, uid) else ForeignTree(os.path.abspath(path), top, owner, uid)
