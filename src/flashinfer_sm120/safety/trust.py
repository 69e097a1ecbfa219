"""Who may own what flashinfer-sm120 executes or adopts.

The rule (OpenSSH ``StrictModes`` applied to every step of a path): a file we
execute, and every directory in which any component of its path is looked up,
must be owned by root or by the current uid and must not be writable by group
or others (group-writable is fine when the group is the user's private group,
see :func:`flashinfer_sm120.safety.ownership.writable_by_others`).  A world-writable
directory with the sticky bit (``/tmp``) is accepted only when root owns it
*and* the entry looked up in it is owned by root or by you: the sticky bit
stops others from renaming or replacing those entries; another user's entry
there is not taken on trust.

"What we execute" is followed all the way, without running anything:

* every symlink hop (``$CUDA_HOME/bin/nvcc -> /usr/local/cuda-13.0/bin/nvcc``):
  the directory holding each link counts, not only the final file, so a
  ``CUDA_HOME`` owned by another user cannot borrow a trusted nvcc;
* a script (``#!``, read whole up to :data:`MAX_SCRIPT_BYTES`, UTF-8) is judged on
  its words, with no grammar (docs/safety.md section 2 has the table): its ``#!``
  names a trusted shell binary of :data:`SHELLS`; it holds no character of
  :data:`COMPUTES` where the shell computes with it, no assignment and no word of
  :data:`ASSIGNS`; every absolute path it names passes the rule (scripts followed,
  at most :data:`MAX_WRAPPER_DEPTH` deep) or lies where no other user can create
  it; no word is a relative path, a path through ``/proc``, or a program of
  :data:`READS_CODE`; every word found on ``PATH``, and every ``PATH`` entry,
  passes the rule.  A file it writes with ``>`` is not run, and not checked.

What nvcc itself runs (its host compiler, ``rm`` from ``PATH``) is checked apart from any
wrapper, by :mod:`flashinfer_sm120.safety.compilers`.
"""
# threat-model: P2 (nothing run or adopted unless every level of its path is trusted)

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass

from flashinfer_sm120.safety.formats import base, reads
from flashinfer_sm120.errors import FormatError
from flashinfer_sm120.safety.ownership import Untrusted, current_uid, file_ok, resolve, trust_reason

__all__ = ["MAX_WRAPPER_DEPTH", "MAX_SCRIPT_BYTES", "SHELLS", "SHELL_OPTIONS", "LAUNCHERS", "OPAQUE",
           "READS_CODE", "COMPUTES", "ASSIGNS", "Trace", "trace", "check_executable", "follow_wrappers",
           "hands_on"]

#: Wrapper scripts followed at most this deep (``/usr/bin/nvcc`` ->
#: ``/usr/lib/nvidia-cuda-toolkit/bin/nvcc`` is one level).
MAX_WRAPPER_DEPTH = 8
#: A wrapper script is read whole to find what it runs; one larger than this
#: (bytes) is refused: a line past what was read could run anything.
MAX_SCRIPT_BYTES = 256 << 10

#: Shells a ``#!`` line may name (by the real file's name: ``/bin/sh`` -> ``dash``).
SHELLS = frozenset({"sh", "dash", "bash"})
#: Option letters a ``#!`` line may give the shell (``#!/bin/sh -e``): errexit,
#: noglob, nounset, verbose, xtrace.  ``-c``, ``-s``, ``-i``, ``-l`` are not here.
SHELL_OPTIONS = frozenset("efuvx")
#: Programs that run the program named by their first non-option argument (a build variable's
#: command, :mod:`.compilers`).
LAUNCHERS = frozenset({"env", "nice", "nohup", "stdbuf", "setsid", "ccache", "sccache", "time", "timeout",
                       "taskset", "ionice", "chrt", "flock", "xargs", "sudo", "doas", "runuser",
                       "strace", "ltrace", "valgrind", "unshare", "chroot", "nsenter", "busybox"})
#: Interpreters whose programs cannot be read here.
OPAQUE = frozenset({"python", "python2", "python3", "perl", "ruby", "node", "lua", "php", "tclsh", "awk",
                    "gawk", "mawk", "nawk", "sed", "find", "make", "ninja", "su", "script", "watch"})
#: Programs a wrapper script may not name: they run code it does not hold (a script named relative to
#: the working directory, a program built from their input).
READS_CODE = SHELLS | OPAQUE | {"xargs", "parallel"}
#: Characters with which the shell computes a word when it runs (a command substitution, a variable,
#: a glob, ``~``, an escape, a brace expansion); ``(`` and ``)`` (subshells, functions) count only
#: outside quotes, ``[`` and ``]`` only inside a word (alone they are the ``test`` builtin).
COMPUTES = frozenset("`\\$~*?{}[]()")
#: Parameters a script may expand (``$@``, ``$1``, ``$?`` ...): its arguments and the shell's status.
_PARAMS = frozenset("@*#?!$-123456789")
#: Builtins that run a file found on ``PATH`` or in the working directory (``.``, ``source``), or
#: set or unset a variable named by a word (``read PATH``, ``for PATH in``, ``unset PATH``).
ASSIGNS = frozenset({".", "source", "read", "mapfile", "readarray", "getopts", "printf", "declare",
                     "typeset", "local", "for", "select", "unset"})
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
_FIX = ("set CUDA_HOME=<the real toolkit prefix> (the directory above the real bin/nvcc) instead of "
        "this wrapper, or replace the wrapper with a symlink")
_RULE = ("a wrapper script is used only when it computes no path, assigns no variable, and every "
         "program it names by absolute path or finds on PATH passes the trust rule")


def _base(path: str) -> str:
    """The program's name, ``python3.11`` counted as ``python3``."""
    name = os.path.basename(path)
    return name.rstrip("0123456789.") if name.rstrip("0123456789.") in OPAQUE else name


def hands_on(path: str) -> str | None:
    """What the program at ``path`` (its real file's name) does with its first non-option
    argument: ``"shell"`` (runs it as a script), ``"launcher"`` (runs it as a program,
    :data:`LAUNCHERS`), ``"opaque"`` (an interpreter whose program cannot be read here,
    :data:`OPAQUE`), else ``None``."""
    name = _base(os.path.realpath(path))
    return ("opaque" if name in OPAQUE else "shell" if name in SHELLS else "launcher" if name in LAUNCHERS
            else None)


@dataclass(frozen=True)
class Trace:
    """Everything that running ``path`` would execute, as far as can be read.

    Attributes:
        path: the path as given.
        target: real path of the program that finally runs (wrappers and links
            followed), or ``None`` when it cannot be told.
        files: real paths of every file checked on the way (wrappers,
            interpreters, what they name, the target), in order.
        problem: why it must not be run (untrusted owner or mode, a wrapper loop,
            a computed path, missing file), or ``None`` when trusted.
    """

    path: str
    target: str | None
    files: tuple[str, ...]
    problem: str | None

    @property
    def trusted(self) -> bool:
        return self.problem is None


def _read_script(real: str) -> str | None:
    """The text of ``real`` when it is a ``#!`` script, else ``None``; refused when
    larger than :data:`MAX_SCRIPT_BYTES` (a line past what was read could run
    anything) or not UTF-8 text."""
    try:
        if not reads.read_prefix(real, 2).startswith(b"#!"):
            return None
        raw = reads.read_bytes(real, MAX_SCRIPT_BYTES)
    except FormatError as exc:
        raise Untrusted(f"{exc}; a script is read whole to check what it runs, so it is too large to "
                         f"check; {_FIX}") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise Untrusted(f"{real} is a script that is not UTF-8 text, so what it runs cannot be checked; "
                         f"{_FIX}") from None


def _refuse(script: str, what: str, fix: str = _FIX) -> Untrusted:
    return Untrusted(f"{script}: {what}, so what it runs cannot be checked; {_RULE}; {fix}")


def _computes(c: str, nxt: str, quote: str, started: bool) -> bool:
    """Whether the shell computes with ``c`` (followed by ``nxt``, inside ``quote``, in a word
    already ``started``): see :data:`COMPUTES`."""
    if c == "\0":
        return True
    if c not in COMPUTES or (quote and c in "()"):
        return False
    return not (c in "[]" and not quote and not started and nxt in ("", " ", "\t", "\n", ";", "&", "|"))


def _words(body: str, script: str) -> list[tuple[int, str, bool]]:
    """``(line, word, redirected)`` for every word of a script body (the text after its ``#!``
    line), quotes removed, comments left out; ``redirected``: the word follows ``>`` (a file
    written, never run; one read with ``<`` is checked like any other).  Only the shell's quoting, comments and operators are read, no
    grammar.  Refused: a character of :data:`COMPUTES` where the shell computes with it (inside
    quotes too, where ``eval`` would read it again), an unclosed quote, a NUL."""
    out: list[tuple[int, str, bool]] = []
    word: list[str] = []
    line, start, quote, started, redirect, i = 2, 2, "", False, False, 0
    while i < len(body):
        c, nxt = body[i], body[i + 1:i + 2]
        if c == "$" and nxt and nxt in _PARAMS:
            start, started = start if started else line, True
            word.append(c + nxt)
            i += 1
        elif _computes(c, nxt, quote, started):
            shown = c + nxt if c == "$" else c
            raise _refuse(script, f"line {line} holds {shown!r}, with which the shell computes the path of "
                                  f"what it runs when it runs")
        elif quote:
            quote = "" if c == quote else quote
            word.append(c if quote else "")
        elif c in "'\"" or c not in " \t\n;&|<>#" or (c == "#" and started):
            start = start if started else line
            quote = c if c in "'\"" else ""
            word.append("" if quote else c)
            started = True
        elif c == "#":  # a comment runs to the end of the line
            i = (body.find("\n", i) % (len(body) + 1)) - 1  # at the newline, or past the end
        else:
            if started:
                out.append((start, "".join(word), redirect))
                word, started, redirect = [], False, False
            redirect = (c == ">" and body[i - 1] != "<") or (redirect and c not in ";\n<")
        line += c == "\n"
        i += 1
    if quote:
        raise _refuse(script, f"a {quote} quote opened by line {line} is not closed")
    if started:
        out.append((start, "".join(word), redirect))
    return out


def _paths(word: str) -> tuple[list[str], bool]:
    """The absolute paths in ``word`` (at its start or after ``=``, ``:`` or ``,``; the first ``/``
    of an option such as ``-I/opt/x``), and whether it holds a relative path (any other ``/``)."""
    paths, relative = [], False
    for part in re.split("[=:,]", word):
        at = part.find("/")
        if at == 0 or (at > 0 and part.startswith("-") and " " not in part):
            paths.append(part[at:])
        elif at > 0:
            relative = True
    return paths, relative


def _via_proc(path: str, hops: int = 40) -> bool:
    """Whether ``path`` leads through ``/proc`` (``/dev/fd/3``, ``/dev/stdin``): it names whatever
    the running shell has open there, not what is on disk now."""
    where = os.path.realpath(os.path.dirname(path))
    if where == "/proc" or where.startswith("/proc/"):
        return True
    return hops > 0 and os.path.islink(path) and _via_proc(os.path.join(where, os.readlink(path)), hops - 1)


def _on_path(name: str, dirs: list[str]) -> str | None:
    for d in dirs:
        p = os.path.join(d, name)
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    return None


class _Check:
    """One :func:`trace`: what was checked so far, so that a script naming the same programs many
    times is read once per program."""

    def __init__(self, uid: int) -> None:
        self.uid = uid
        self.files: list[str] = []
        self.checked: dict[str, str] = {}  # real path -> the program it finally runs
        self.found: dict[str, str | None] = {}  # word -> where PATH finds it
        self.path_ok = False
        self.dirs = os.environ.get("PATH", "").split(os.pathsep)

    def follow(self, path: str, chain: list[str], body: bool = True) -> str:
        """Check ``path`` and whatever it runs; the final target's real path."""
        real = resolve(path, self.uid)
        st = file_ok(real, self.uid)
        if not stat.S_ISREG(st.st_mode):
            raise Untrusted(f"{real} is not a regular file")
        if real in chain:
            raise Untrusted("wrapper loop: " + " -> ".join(chain + [real]) + "; it would never finish; "
                             "set CUDA_HOME to the real toolkit prefix instead")
        if len(chain) >= MAX_WRAPPER_DEPTH:
            raise Untrusted(f"wrappers nested more than {MAX_WRAPPER_DEPTH} deep at {real}; "
                             "set CUDA_HOME to the real toolkit prefix instead")
        if real in self.checked and body:
            return self.checked[real]
        chain = chain + [real]
        self.files.append(real)
        text = _read_script(real)
        if text is None:
            self.checked[real] = real
            return real
        head, _, rest = text.partition("\n")
        arg = self.shebang(real, head, chain, body)
        if not body:
            return real
        # '#!/bin/sh /opt/x/real-nvcc': the shell runs that script, not this body
        final = self.checked[real] = self.follow(arg, chain) if arg else self.body(real, rest, chain)
        return final

    def shebang(self, real: str, head: str, chain: list[str], body: bool) -> str:
        """Check the ``#!`` line ``head`` of the script ``real``; the absolute script path it hands
        the shell, or ``""``."""
        interp, _, arg = head[2:].strip(" \t").replace("\t", " ").partition(" ")
        arg = arg.strip()
        if not interp.startswith("/"):
            raise _refuse(real, f"its '#!' line names {base.shown(interp, 60)}, not an absolute path")
        shell_real = self.follow(interp, chain, body=False)
        if _read_script(shell_real) is not None:
            raise _refuse(real, f"its interpreter {interp} is itself a script (name the shell binary instead)")
        if not body:
            return ""
        if os.path.basename(shell_real) not in SHELLS:
            raise _refuse(real, f"its '#!' line runs {shell_real}, not a shell of {', '.join(sorted(SHELLS))}")
        if arg and not (arg.startswith("/") or (arg.startswith("-") and set(arg[1:]) <= SHELL_OPTIONS)):
            raise _refuse(real, f"its '#!' line passes {base.shown(arg, 60)} to the shell (only an absolute "
                                f"script path or options -{''.join(sorted(SHELL_OPTIONS))} can be checked)")
        return arg if arg.startswith("/") else ""

    def body(self, real: str, rest: str, chain: list[str]) -> str:
        """Check every word of the body ``rest`` of the script ``real`` and the ``PATH`` it runs
        under; the program it wraps (the first ``.../nvcc`` it names), else ``real``."""
        final = real
        for line, word, redirected in _words(rest, real):
            if redirected:
                continue
            if _paths(word)[1]:
                raise _refuse(real, f"line {line} holds {base.shown(word, 60)}, a relative path: what it "
                                    f"names depends on the working directory")
            for w in filter(None, re.split(r"[\s;&|<>()]+", word)):  # as 'eval' would read it again
                try:
                    found = self.word(w, line, real, chain)
                except Untrusted as exc:
                    why = str(exc) if "CUDA_HOME" in str(exc) else f"{exc}; or {_FIX}"
                    raise (exc if why.startswith(real) else Untrusted(f"{real}: line {line} names "
                                                                        f"{base.shown(w, 200)}: {why}")) from None
                if final == real and found and os.path.basename(w) == "nvcc" and w.startswith("/"):
                    final = found
        self.path_entries(real)
        return final

    def word(self, w: str, line: int, script: str, chain: list[str]) -> str | None:
        """Check one word of a script; the final target of the program it names, if any."""
        if w in ASSIGNS or _ASSIGNMENT.match(w):
            raise _refuse(script, f"line {line} holds {base.shown(w, 60)}, which sets or unsets a variable "
                                  f"or runs a file found on PATH or in the working directory")
        paths = _paths(w)[0]  # (a relative path was refused with the whole word)
        if not paths and not w.startswith(("-", "$")):
            if w not in self.found:
                self.found[w] = _on_path(w, [d for d in self.dirs if d.startswith("/")])
            found = self.found[w]
            if found is None:
                return None
            if _base(os.path.realpath(found)) in READS_CODE:
                raise _refuse(script, f"line {line} runs {base.shown(w, 60)} ({found}), which runs code the "
                                      f"script does not hold")
            try:
                return self.follow(found, chain)
            except Untrusted as exc:
                raise Untrusted(f"{script}: line {line} runs {w!r}, found on PATH as {found}: {exc}; remove "
                                f"{os.path.dirname(found)} from PATH, or {_FIX}") from None
        target = None
        for p in paths:
            if _via_proc(p):
                raise _refuse(script, f"line {line} names {base.shown(p, 200)}, which leads through /proc: "
                                      f"what it names is decided when the script runs")
            if not os.path.lexists(p):
                why = trust_reason(p, sticky_ok=False)
                if why:
                    raise _refuse(script, f"line {line} names {base.shown(p, 200)}, which does not exist "
                                          f"where another user may create it ({why})")
            elif os.path.isdir(p):
                file_ok(resolve(p, self.uid), self.uid)
            elif not os.path.isfile(p):  # /dev/null: the directories on the way
                resolve(p, self.uid)
            elif _base(os.path.realpath(p)) in READS_CODE:
                raise _refuse(script, f"line {line} runs {base.shown(p, 60)}, which runs code the script "
                                      f"does not hold")
            else:
                target = target or self.follow(p, chain)
        return target

    def path_entries(self, script: str) -> None:
        """Every ``PATH`` entry: an absolute directory that passes the rule (what a script runs by
        name is found there)."""
        if self.path_ok:
            return
        for d in self.dirs:
            why = ("a relative entry: the working directory" if not d.startswith("/") else
                   trust_reason(d, sticky_ok=False))
            if why:
                raise _refuse(script, f"it runs programs by name, and PATH holds {base.shown(d, 200)} "
                                      f"({why})", f"remove {base.shown(d, 200)} from PATH, or {_FIX}")
        self.path_ok = True


def trace(path: str, *, body: bool = True) -> Trace:
    """Follow ``path`` through links and wrapper scripts, checking trust at every step.

    Nothing is executed: scripts are read as text (see the module docstring for
    what a script must meet).

    Args:
        path: the program, e.g. ``$CUDA_HOME/bin/nvcc``.
        body: ``False`` checks only the file, its links and its ``#!``
            interpreter, not what a script's body runs: for a program we run
            for its own sake (``which``), not as a wrapper of nvcc.

    Returns:
        A :class:`Trace`; ``problem`` is set when anything on the way is
        untrusted or cannot be told.
    """
    check = _Check(current_uid())
    try:
        target = check.follow(path, [], body=body)
    except Untrusted as exc:
        return Trace(path, None, tuple(check.files), str(exc))
    except OSError as exc:
        return Trace(path, None, tuple(check.files), f"cannot check {exc.filename or path}: {exc.strerror or exc}")
    return Trace(path, target, tuple(dict.fromkeys(check.files)), None)


def check_executable(path: str) -> str | None:
    """``None`` when ``path`` may be run (see :func:`trace`), else the reason."""
    return trace(path).problem


def follow_wrappers(path: str) -> str | None:
    """Real path of the program ``path`` finally runs: the first absolute ``.../nvcc`` each
    wrapper names, read as :func:`trace` reads it but with no trust verdict (used to place a
    ``PATH`` nvcc); ``None`` if absent."""
    seen: list[str] = []
    cur = path
    for _ in range(MAX_WRAPPER_DEPTH + 1):
        real = os.path.realpath(cur)
        if not os.path.isfile(real):
            return None if not seen else seen[-1]
        if real in seen:
            return real
        seen.append(real)
        try:
            text = _read_script(real)
            words = _words(text.partition("\n")[2], real) if text is not None else []
        except Untrusted:
            return real
        nxt = next((w for _, word, _ in words for w in _paths(word)[0] if os.path.basename(w) == "nvcc"
                    and os.path.realpath(w) != real and os.path.isfile(w)), None)
        if nxt is None:
            return real
        cur = nxt
    return os.path.realpath(cur)
