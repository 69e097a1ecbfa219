"""The trust rule applied to what runs (threat-model: P2, docs/safety.md section 2): a program, every level of its
path, and for a ``#!`` script (read, never run) its shell and every program and path its words name."""

from __future__ import annotations

import os
import re
import stat
from collections import namedtuple

from flashinfer_sm120.errors import FormatError
from flashinfer_sm120.safety.formats import base, reads
from flashinfer_sm120.safety.ownership import Untrusted, file_ok, resolve, trust_reason

MAX_WRAPPER_DEPTH = 8
#: A script is read whole (a line past what was read could run anything); a larger one is refused.
MAX_SCRIPT_BYTES = 256 << 10

#: Shells a ``#!`` line may name (by the real file's name: ``/bin/sh`` -> ``dash``).
SHELLS = frozenset({"sh", "dash", "bash"})
#: Options a ``#!`` line may give the shell: errexit, noglob, nounset, verbose, xtrace.
SHELL_OPTIONS = frozenset("efuvx")
#: Programs that run the program named by their first non-option argument.
LAUNCHERS = frozenset({"env", "nice", "nohup", "stdbuf", "setsid", "ccache", "sccache", "time", "timeout",
                       "taskset", "ionice", "chrt", "flock", "xargs", "sudo", "doas", "runuser",
                       "strace", "ltrace", "valgrind", "unshare", "chroot", "nsenter", "busybox"})
#: Interpreters whose programs cannot be read here.
OPAQUE = frozenset({"python", "python2", "python3", "perl", "ruby", "node", "lua", "php", "tclsh", "awk",
                    "gawk", "mawk", "nawk", "sed", "find", "make", "ninja", "su", "script", "watch"})
#: Programs a script may not name: they run code it does not hold.
_READS_CODE = SHELLS | OPAQUE | {"xargs", "parallel"}
#: Where the shell computes a word when it runs: a substitution, a variable (but the parameters
#: ``$@ $1 $?``...), a glob, ``~``, an escape, braces, a ``[ ]`` that is not ``test``, and outside
#: quotes ``( )`` (subshells, functions, ``case`` patterns).
_COMPUTES = re.compile(r"[\0`\\~*?{}]|\$(?![@*#?!$\-1-9])|(?<=[^\s;&|])[\[\]]|[\[\]](?=[^\s;&|])")
_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")
#: A file a script writes (``2>>/x/log``): not run, not checked; one read with ``<`` or ``<>`` is.
_WRITES = re.compile(r"(?<![0-9])[0-9]*(?<!<)>[>|&]?\s*[^\s;&|<>]*")
#: Builtins that run a file found on ``PATH`` or set or unset a variable a word names.
_ASSIGNS = frozenset({".", "source", "read", "mapfile", "readarray", "getopts", "printf", "declare",
                      "typeset", "local", "for", "select", "unset"})
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
_FIX = ("set CUDA_HOME=<the real toolkit prefix> (the directory above the real bin/nvcc) instead of "
        "this wrapper, or replace the wrapper with a symlink")
_RULE = ("a wrapper script is used only when it computes no path, assigns no variable, and every "
         "program it names by absolute path or finds on PATH passes the trust rule")


def named_path_problem(path: str) -> str | None:
    """Why a path a value or script names may not reach a build: untrusted, or absent where others may create it."""
    why = trust_reason(path, sticky_ok=False)
    if why is None or os.path.lexists(path):
        return why
    return f"names {base.shown(path, 200)}, which does not exist yet where another user may create it ({why})"


def _base(path: str) -> str:
    """The program's name, ``python3.11`` counted as ``python3``."""
    name = os.path.basename(path)
    return name.rstrip("0123456789.") if name.rstrip("0123456789.") in OPAQUE else name


def hands_on(path: str) -> str | None:
    """What ``path`` does with its first non-option argument: ``shell``, ``launcher``, ``opaque`` or ``None``."""
    name = _base(os.path.realpath(path))
    return ("opaque" if name in OPAQUE else "shell" if name in SHELLS else "launcher" if name in LAUNCHERS
            else None)


#: What running a path would run: ``target`` (real path; ``None``: untold) and ``problem`` (``None``: none).
Trace = namedtuple("Trace", "target problem")


def _read_script(real: str) -> str | None:
    """The text of ``real`` when it is a ``#!`` script, else ``None``; too large or not UTF-8: refused."""
    try:
        if not reads.read_bytes(real, 2, prefix=True).startswith(b"#!"):
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


def _words(body: str, script: str) -> list[tuple[int, str]]:
    """``(line, word)`` of a script body as ``eval`` reads it again; a :data:`_COMPUTES` character is refused."""
    lines = list(enumerate(body.split("\n"), start=2))
    for line, text in lines:
        m = None if text.lstrip().startswith("#") else (_COMPUTES.search(text)
                                                         or re.search("[()]", _QUOTED.sub("", text)))
        if m:
            shown = text[m.start():m.start() + 2] if m.group() == "$" else m.group()
            raise _refuse(script, f"line {line} holds {shown!r}, with which the shell computes the path of "
                                  f"what it runs when it runs")
    return [(line, w) for line, text in lines if not text.lstrip().startswith("#")
            for w in re.split(r"[\s;&|<>]+", _WRITES.sub(" ", re.sub("['\"]", "", text))) if w]


def named_paths(word: str) -> tuple[list[str], bool]:
    """The absolute paths a word names (``-I/x``, ``-Wl,/z``, ``A:/b``, ``@/rsp``), and whether it holds a relative one."""
    paths, relative = [], False
    for part in re.split("[=:,]", word):
        part = part[1:] if part.startswith("@/") else part
        at = part.find("/")
        if at == 0 or (at > 0 and part.startswith("-")):
            paths.append(part[at:])
        elif at > 0:
            relative = True
    return paths, relative


def _via_proc(path: str, hops: int = 40) -> bool:
    """Whether ``path`` leads through ``/proc`` (``/dev/fd/3``): it names what the shell has open."""
    where = os.path.realpath(os.path.dirname(path))
    if where == "/proc" or where.startswith("/proc/"):
        return True
    return hops > 0 and os.path.islink(path) and _via_proc(os.path.join(where, os.readlink(path)), hops - 1)


def which(name: str, path: str | None) -> tuple[str | None, str | None]:
    """``(program, problem)``: ``name`` as ``/bin/sh`` runs it on ``path`` from a module's build directory."""
    if os.path.isabs(name):
        return name, None
    if "/" in name:
        return None, (f"names {base.shown(name, 60)}, a relative path: ninja runs it from each module's "
                      f"build directory, not from here")
    relative = None
    for d in (path if path is not None else os.defpath).split(os.pathsep):
        if not d or not os.path.isabs(d):
            relative = relative or (d or "(empty)")
            continue
        cand = os.path.join(d, name)
        if os.path.isfile(cand) and os.access(cand, os.X_OK):
            if relative:
                return None, (f"names {base.shown(name, 60)}, and PATH holds the relative entry "
                              f"{base.shown(relative, 40)} before {d}: ninja runs FlashInfer's compile lines "
                              f"in each module's build directory, where that entry names another place")
            return cand, None
    return None, f"names {base.shown(name, 60)}, which is not on PATH"


class _Check:
    """One :func:`trace`: what was checked so far, so each program is read once."""

    def __init__(self) -> None:
        self.checked: dict[str, str] = {}  # real path -> the program it finally runs
        self.found: dict[str, str | None] = {}  # word -> where PATH finds it
        self.path_ok = False
        self.dirs = os.environ.get("PATH", "").split(os.pathsep)

    def follow(self, path: str, chain: list[str], body: bool = True) -> str:
        """Check ``path`` and whatever it runs; the final target's real path."""
        real = resolve(path)
        st = file_ok(real)
        if not stat.S_ISREG(st.st_mode):
            raise Untrusted(f"{real} is not a regular file")
        if len(chain) >= MAX_WRAPPER_DEPTH:  # a loop of wrappers too
            raise Untrusted(f"wrappers nested more than {MAX_WRAPPER_DEPTH} deep (or in a loop) at {real}; "
                            "set CUDA_HOME to the real toolkit prefix instead")
        if real in self.checked and body:
            return self.checked[real]
        chain = chain + [real]
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
        """Check the ``#!`` line of ``real``; the absolute script path it hands the shell, or ``""``."""
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
        """Check a script's words and ``PATH``; the program it wraps (its first ``.../nvcc``), else ``real``."""
        final = real
        for line, w in _words(rest, real):
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
        if w in _ASSIGNS or _ASSIGNMENT.match(w):
            raise _refuse(script, f"line {line} holds {base.shown(w, 60)}, which sets or unsets a variable "
                                  f"or runs a file found on PATH or in the working directory")
        paths, relative = named_paths(w)
        if relative:
            raise _refuse(script, f"line {line} holds {base.shown(w, 60)}, a relative path: what it "
                                  f"names depends on the working directory")
        if not paths and not w.startswith(("-", "$")):
            if w not in self.found:
                self.found[w] = which(w, os.pathsep.join(d for d in self.dirs if d.startswith("/")))[0]
            found = self.found[w]
            if found is None:
                return None
            if _base(os.path.realpath(found)) in _READS_CODE:
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
                why = named_path_problem(p)
                if why:
                    raise _refuse(script, f"line {line} {why}")
            elif os.path.isdir(p):
                file_ok(resolve(p))
            elif not os.path.isfile(p):  # /dev/null: the directories on the way
                resolve(p)
            elif _base(os.path.realpath(p)) in _READS_CODE:
                raise _refuse(script, f"line {line} runs {base.shown(p, 60)}, which runs code the script "
                                      f"does not hold")
            else:
                target = target or self.follow(p, chain)
        return target

    def path_entries(self, script: str) -> None:
        """Every ``PATH`` entry: an absolute directory that passes the rule."""
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
    """Follow ``path`` through links and wrapper scripts by the trust rule, running nothing (``body=False``: no body)."""
    check = _Check()
    try:
        target = check.follow(path, [], body=body)
    except Untrusted as exc:
        return Trace(None, str(exc))
    except OSError as exc:
        return Trace(None, f"cannot check {exc.filename or path}: {exc.strerror or exc}")
    return Trace(target, None)
