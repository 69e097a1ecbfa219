"""Who may own what flashinfer-sm120 executes or adopts.

The rule (OpenSSH ``StrictModes`` applied to every step of a path): a file we
execute, and every directory in which any component of its path is looked up,
must be owned by root or by the current uid and must not be writable by group
or others (group-writable is fine when the group is the user's private group,
see :func:`flashinfer_sm120.cache.writable_by_others`).  A world-writable
directory with the sticky bit (``/tmp``) is accepted only when root owns it
*and* the entry looked up in it is owned by root or by you: the sticky bit
stops others from renaming or replacing those entries; another user's entry
there is not taken on trust.

"What we execute" is followed all the way, without running anything:

* every symlink hop (``$CUDA_HOME/bin/nvcc -> /usr/local/cuda-13.0/bin/nvcc``):
  the directory holding each link counts, not only the final file, so a
  ``CUDA_HOME`` owned by another user cannot borrow a trusted nvcc;
* a script (``#!``): its interpreter (and, for ``#!/usr/bin/env prog``, the
  ``prog`` found on ``PATH``), every absolute ``.../nvcc`` path it names
  (``exec /usr/local/cuda-13.0/bin/nvcc "$@"``) and every absolute path it
  runs as a command (``/usr/bin/ccache ...``), recursively, at most
  :data:`MAX_WRAPPER_DEPTH` deep, loops detected; a file its ``#!`` line hands
  the interpreter (``#!/bin/sh /opt/x/run``, ``env -S``) is followed the same
  way, and every other existing file it names (``sh /opt/x/run``) must pass
  the rule; the whole script is read (up to :data:`MAX_SCRIPT_BYTES`; a larger
  one is refused);
* a script whose command is computed (``exec "$(dirname "$0")/real" "$@"``,
  ``$NVCC "$@"``, ``eval``, ``source``) is refused: we cannot tell what it
  would run.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
from dataclasses import dataclass

from ..cache import writable_by_others

__all__ = ["MAX_WRAPPER_DEPTH", "Trace", "trace", "check_executable", "check_path"]

#: Wrapper scripts followed at most this deep (``/usr/bin/nvcc`` ->
#: ``/usr/lib/nvidia-cuda-toolkit/bin/nvcc`` is one level).
MAX_WRAPPER_DEPTH = 8
_MAX_LINKS = 40  # as Linux MAXSYMLINKS
_HEAD_BYTES = 8192
#: A wrapper script is read whole to find what it runs; one larger than this
#: (bytes) is refused: a line past what was read could run anything.
MAX_SCRIPT_BYTES = 256 << 10

_NVCC_PATH_RE = re.compile(r"(/[^\s\"'`;|&()<>$]*?/nvcc)(?![\w.-])")
#: An absolute path in command position: ``exec /opt/x/bin/tool "$@"``, ``/usr/bin/ccache ...``.
_CMD_PATH_RE = re.compile(
    r"""^\s*(?:(?:exec|command|then|else|do)\s+|&&\s*|\|\|\s*)*["']?(/[^\s"'`;|&()<>$]+)""",
    re.MULTILINE,
)
#: Any absolute path a script names (``sh /opt/x/run``, ``python3 /opt/x/y.py``): an
#: existing file among them may be run as an argument, so it must pass the rule too.
_ANY_PATH_RE = re.compile(r"""(?<![\w.$/-])(/[^\s"'`;|&()<>$=]+)""")
_COMPUTED_RE = re.compile(
    r"""^\s*(?:exec\s+|command\s+|then\s+|else\s+|do\s+|&&\s*|\|\|\s*)*["']?(?:\$|`)"""
    r"""|^\s*(?:eval|source|\.)\s""",
    re.MULTILINE,
)


@dataclass(frozen=True)
class Trace:
    """Everything that running ``path`` would execute, as far as can be read.

    Attributes:
        path: the path as given.
        target: real path of the program that finally runs (wrappers and links
            followed), or ``None`` when it cannot be told.
        files: real paths of every file executed on the way (wrappers,
            interpreters, the target), in order.
        problem: why it must not be run (untrusted owner or mode, a wrapper loop,
            a computed command, missing file), or ``None`` when trusted.
    """

    path: str
    target: str | None
    files: tuple[str, ...]
    problem: str | None

    @property
    def trusted(self) -> bool:
        return self.problem is None


class _Untrusted(Exception):
    pass


def _uid() -> int:
    return os.geteuid() if hasattr(os, "geteuid") else 0


def _dir_ok(directory: str, entry: str | None, uid: int) -> None:
    st = os.stat(directory)
    if st.st_uid not in (0, uid):
        raise _Untrusted(f"{directory} is owned by uid {st.st_uid}, not root or you (uid {uid})")
    if writable_by_others(st):
        if st.st_mode & stat.S_ISVTX and st.st_uid == 0 and entry is not None:
            try:
                owner = os.lstat(entry).st_uid
            except OSError:
                owner = -1
            if owner in (0, uid):  # the sticky bit stops others replacing it
                return
            raise _Untrusted(
                f"{entry} is owned by uid {owner} in {directory}, a directory everyone can write "
                f"(mode {stat.filemode(st.st_mode)}); only entries of root or you are trusted there: "
                f"move the toolkit out of {directory}")
        raise _Untrusted(
            f"{directory} is writable by other users (mode {stat.filemode(st.st_mode)}); "
            f"run 'chmod go-w {directory}' or use a path outside it")


def _resolve(path: str, uid: int) -> str:
    """Resolve ``path`` component by component (like :func:`os.path.realpath`),
    checking every directory in which a component is looked up."""
    if not os.path.isabs(path):
        path = os.path.abspath(path)
    todo = [c for c in path.split("/") if c]
    cur = "/"
    links = 0
    _dir_ok("/", None, uid)
    while todo:
        c = todo.pop(0)
        if c == ".":
            continue
        if c == "..":
            cur = os.path.dirname(cur)
            continue
        nxt = os.path.join(cur, c)
        _dir_ok(cur, nxt, uid)
        st = os.lstat(nxt)
        if stat.S_ISLNK(st.st_mode):
            links += 1
            if links > _MAX_LINKS:
                raise _Untrusted(f"{path}: too many levels of symbolic links (a link loop)")
            target = os.readlink(nxt)
            if target.startswith("/"):
                cur = "/"
            todo = [t for t in target.split("/") if t] + todo
        else:
            cur = nxt
    return cur


def _file_ok(real: str, uid: int) -> os.stat_result:
    st = os.stat(real)
    if st.st_uid not in (0, uid):
        raise _Untrusted(f"{real} is owned by uid {st.st_uid}, not root or you (uid {uid})")
    if writable_by_others(st):
        raise _Untrusted(f"{real} is writable by other users (mode {stat.filemode(st.st_mode)}); "
                         f"run 'chmod go-w {real}'")
    return st


def check_path(path: str) -> str | None:
    """Check a file or directory we adopt (headers, libraries, a toolkit root):
    every directory on the way and the entry itself, links followed.

    Returns:
        ``None`` when trusted, else a sentence naming the offending path and the fix.
    """
    uid = _uid()
    try:
        real = _resolve(path, uid)
        _file_ok(real, uid)
    except _Untrusted as exc:
        return str(exc)
    except OSError as exc:
        return f"cannot check {path}: {exc.strerror or exc}"
    return None


def _read_head(real: str, limit: int = _HEAD_BYTES) -> bytes:
    try:
        with open(real, "rb") as fh:
            return fh.read(limit)
    except OSError:
        return b""


def _existing(paths) -> list[str]:
    out: list[str] = []
    for p in paths:
        if p not in out and os.path.isfile(p):
            out.append(p)
    return out[:32]


def _follow(path: str, uid: int, chain: list[str], files: list[str], env_path: str | None,
            checked: dict[str, str]) -> str:
    """Check ``path`` and whatever it execs; returns the final target's real path.
    ``checked`` maps files already found trusted to their final target, so a
    script naming the same programs many times is checked once per program."""
    real = _resolve(path, uid)
    st = _file_ok(real, uid)
    if not stat.S_ISREG(st.st_mode):
        raise _Untrusted(f"{real} is not a regular file")
    if real in chain:
        raise _Untrusted("wrapper loop: " + " -> ".join(chain + [real]) + "; it would never finish; "
                         "set CUDA_HOME to the real toolkit prefix instead")
    if len(chain) >= MAX_WRAPPER_DEPTH:
        raise _Untrusted(f"wrappers nested more than {MAX_WRAPPER_DEPTH} deep at {real}; "
                         "set CUDA_HOME to the real toolkit prefix instead")
    chain.append(real)
    files.append(real)
    head = _read_head(real, MAX_SCRIPT_BYTES + 1)
    if not head.startswith(b"#!"):
        return real
    if len(head) > MAX_SCRIPT_BYTES:  # what it runs may be named past what was read
        raise _Untrusted(f"{real} is a script larger than {MAX_SCRIPT_BYTES} bytes, too large to check "
                         f"what it runs; set CUDA_HOME to the toolkit prefix that holds the real nvcc "
                         f"binary (or replace the script with a symlink)")
    text = head.decode("utf-8", "replace")
    shebang, _, body = text.partition("\n")
    words = shebang[2:].split()
    if not words:
        raise _Untrusted(f"{real} has an empty '#!' line")
    _follow_interpreter(words, uid, files, env_path, real)
    for arg in _shebang_scripts(words, real):  # '#!/bin/sh /other/script': that script runs too
        if os.path.realpath(arg) not in chain:
            _follow(arg, uid, list(chain), files, env_path, checked)
    if _COMPUTED_RE.search(body):
        raise _Untrusted(
            f"{real} is a script that computes the path of the program it runs, so what it "
            f"would execute cannot be checked; set CUDA_HOME to the toolkit prefix that holds "
            f"the real nvcc binary (or replace the script with a symlink)")
    nvccs = _existing(m.group(1) for m in _NVCC_PATH_RE.finditer(body))
    others = _existing(m.group(1) for m in _CMD_PATH_RE.finditer(body))
    final = real
    for t in nvccs + [o for o in others if o not in nvccs]:
        if os.path.realpath(t) in chain:
            if _runs_literally(body, t):  # it execs a script already on the way: a loop
                raise _Untrusted("wrapper loop: " + " -> ".join(chain + [os.path.realpath(t)])
                                 + "; it would never finish; set CUDA_HOME to the real toolkit "
                                 "prefix instead")
            continue  # only mentioned (a comment, a test), not run
        if os.path.realpath(t) in checked:
            got = checked[os.path.realpath(t)]
        else:
            got = _follow(t, uid, list(chain), files, env_path, checked)
        if final == real and t in nvccs:  # the first nvcc it names is what it runs
            final = got
    for t in dict.fromkeys(m.group(1) for m in _ANY_PATH_RE.finditer(body)):  # all, not the first 32
        if t not in nvccs and t not in others and os.path.isfile(t):  # 'sh /x/y': run as an argument
            _file_ok(_resolve(t, uid), uid)
    checked[real] = final
    return final


def _runs_literally(body: str, path: str) -> bool:
    """Whether a line of ``body`` runs ``path`` as its command."""
    return re.search(r"^\s*(?:(?:exec|command|then|else|do)\s+|&&\s*|\|\|\s*)*[\"']?" + re.escape(path)
                     + r"(?![\w.-])", body, re.MULTILINE) is not None


def _env_words(words: list[str], script: str) -> list[str]:
    """The arguments ``/usr/bin/env`` sees after splitting ``-S``/``--split-string``
    (coreutils ``env -S``: the rest of the ``#!`` line is split like a shell would)."""
    import shlex

    out: list[str] = []
    for i, w in enumerate(words):
        split = w.startswith("--split-string") or (w.startswith("-") and not w.startswith("--") and "S" in w)
        if not split:
            out.append(w)
            continue
        rest = w.partition("=")[2] if w.startswith("--split-string=") else w[w.index("S") + 1:] if "S" in w else ""
        try:
            return out + shlex.split(" ".join(([rest] if rest else []) + words[i + 1:]))
        except ValueError as exc:
            raise _Untrusted(f"{script}: its '#!' line cannot be split ({exc})") from None
    return out


def _shebang_scripts(words: list[str], script: str) -> list[str]:
    """Files the interpreter of a ``#!`` line is told to run besides the script itself.

    Linux passes everything after the interpreter as one argument; ``env -S``
    splits it.  An argument that is not an option names a script the interpreter
    runs (``#!/bin/sh /opt/x/real-nvcc``): it must be an absolute path (it is
    then checked like the wrapper), anything else cannot be checked.
    """
    if os.path.basename(words[0]) == "env":
        args = _env_words(words[1:], script)
        while args and (args[0].startswith("-") or "=" in args[0]):
            args.pop(0)
        args = args[1:]  # the program env runs: checked by _follow_interpreter
    else:
        args = [" ".join(words[1:])] if len(words) > 1 else []
    out = []
    for a in args:
        if a.startswith("-"):
            continue
        if not a.startswith("/") or not os.path.isfile(a):
            raise _Untrusted(f"{script}: its '#!' line passes {a!r} to the interpreter, so what it would "
                             f"run cannot be checked; set CUDA_HOME to the toolkit prefix that holds the "
                             f"real nvcc binary (or replace the script with a symlink)")
        out.append(a)
    return out


def _follow_interpreter(words: list[str], uid: int, files: list[str], env_path: str | None,
                        script: str) -> None:
    interp = words[0]
    real = _resolve(interp, uid)
    _file_ok(real, uid)
    files.append(real)
    if os.path.basename(real) == "env":
        prog = next((w for w in _env_words(words[1:], script) if not w.startswith("-") and "=" not in w), None)
        if prog:
            found = shutil.which(prog, path=env_path if env_path is not None else os.environ.get("PATH"))
            if not found:
                raise _Untrusted(f"{script} runs '{prog}' via /usr/bin/env and no {prog} is on PATH")
            files.append(_resolve(found, uid))
            _file_ok(files[-1], uid)


def trace(path: str, *, env_path: str | None = None) -> Trace:
    """Follow ``path`` through links and wrapper scripts, checking trust at every step.

    Nothing is executed: scripts are read as text (first 8 KiB).

    Args:
        path: the program, e.g. ``$CUDA_HOME/bin/nvcc``.
        env_path: ``PATH`` used for ``#!/usr/bin/env prog`` (default ``$PATH``).

    Returns:
        A :class:`Trace`; ``problem`` is set when anything on the way is
        untrusted or cannot be told (see the module docstring for the rule).
    """
    uid = _uid()
    files: list[str] = []
    try:
        target = _follow(path, uid, [], files, env_path, {})
    except _Untrusted as exc:
        return Trace(path, None, tuple(files), str(exc))
    except OSError as exc:
        return Trace(path, None, tuple(files), f"cannot check {exc.filename or path}: {exc.strerror or exc}")
    return Trace(path, target, tuple(dict.fromkeys(files)), None)


def check_executable(path: str) -> str | None:
    """``None`` when ``path`` may be run (see :func:`trace`), else the reason."""
    return trace(path).problem



def follow_wrappers(path: str) -> str | None:
    """Real path of the program ``path`` finally runs, reading wrappers as text,
    with no trust verdict (used to place a ``PATH`` nvcc); ``None`` if absent."""
    seen: list[str] = []
    cur = path
    for _ in range(MAX_WRAPPER_DEPTH + 1):
        real = os.path.realpath(cur)
        if not os.path.isfile(real):
            return None if not seen else seen[-1]
        if real in seen:
            return real
        seen.append(real)
        head = _read_head(real)
        if not head.startswith(b"#!"):
            return real
        body = head.decode("utf-8", "replace").partition("\n")[2]
        nxt = next((m.group(1) for m in _NVCC_PATH_RE.finditer(body)
                    if os.path.realpath(m.group(1)) != real and os.path.isfile(m.group(1))), None)
        if nxt is None:
            return real
        cur = nxt
    return os.path.realpath(cur)
