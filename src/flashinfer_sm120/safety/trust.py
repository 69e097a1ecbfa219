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
* a script (``#!``) is accepted by an **allowlist**, never a list of bad
  patterns: its ``#!`` must name, by absolute path, a shell binary of
  :data:`SHELLS` (followed like any program; an interpreter that is itself a
  script, or ``/usr/bin/env prog``, is refused), with at most shell options of
  :data:`SHELL_OPTIONS` or one absolute script path after it; its body must be
  of the grammar :mod:`.shell` reads (simple commands, ``exec``, pipelines and
  lists, ``if``/``while``/``case``, redirections, lower-case assignments), and
  **every command word must be a builtin of** :data:`.shell.BUILTINS` **or a
  literal absolute path**, which is followed recursively (at most
  :data:`MAX_WRAPPER_DEPTH` deep, loops detected).  A command found by name on
  ``PATH`` (``nvcc-real "$@"``), named by a variable or a ``$(...)``, ``cd``,
  ``PATH=...``, ``eval``/``source``, a function, or any shape the grammar does
  not list makes the script refused, with the line, the word and the fix
  (``CUDA_HOME=<the real toolkit prefix>``);
* a program that runs its arguments (:data:`LAUNCHERS`: ``env``, ``nice``,
  ``ccache`` ...; a shell given a script) is accepted only when what it runs
  is a literal absolute path, followed the same way; interpreters whose
  scripts cannot be read here (:data:`OPAQUE`: Python, Perl ...) are refused;
  any other existing absolute file a script names as an argument
  (``/usr/bin/tool /opt/x/data``) must pass the rule too;
* the whole script is read (up to :data:`MAX_SCRIPT_BYTES`; a larger one is
  refused) and must be UTF-8 text without NUL.

What nvcc itself runs (its host compiler, ``rm`` from ``PATH``) is checked apart from any
wrapper, by :mod:`flashinfer_sm120.safety.compilers`.
"""
# threat-model: P2 (nothing run or adopted unless every level of its path is trusted)

from __future__ import annotations

import os
import stat
from dataclasses import dataclass

from flashinfer_sm120.safety import formats
from flashinfer_sm120.errors import FormatError
from flashinfer_sm120.safety import shell
from flashinfer_sm120.safety.ownership import Untrusted, current_uid, file_ok, resolve

__all__ = ["MAX_WRAPPER_DEPTH", "MAX_SCRIPT_BYTES", "SHELLS", "SHELL_OPTIONS", "LAUNCHERS", "OPAQUE", "Trace",
           "trace", "check_executable", "follow_wrappers", "hands_on"]

#: Wrapper scripts followed at most this deep (``/usr/bin/nvcc`` ->
#: ``/usr/lib/nvidia-cuda-toolkit/bin/nvcc`` is one level).
MAX_WRAPPER_DEPTH = 8
#: A wrapper script is read whole to find what it runs; one larger than this
#: (bytes) is refused: a line past what was read could run anything.
MAX_SCRIPT_BYTES = 256 << 10

#: Shells whose scripts :mod:`.shell` reads (by the real file's name: ``/bin/sh`` -> ``dash``).
SHELLS = frozenset({"sh", "dash", "bash"})
#: Option letters a ``#!`` line may give the shell (``#!/bin/sh -e``): errexit,
#: noglob, nounset, verbose, xtrace.  ``-c``, ``-s``, ``-i``, ``-l`` are not here.
SHELL_OPTIONS = frozenset("efuvx")
#: Programs that run the program named by their first non-option argument; it
#: must be a literal absolute path (followed), and no option may take a value.
LAUNCHERS = frozenset({"env", "nice", "nohup", "stdbuf", "setsid", "ccache", "sccache", "time", "timeout",
                       "taskset", "ionice", "chrt", "flock", "xargs", "sudo", "doas", "runuser",
                       "strace", "ltrace", "valgrind", "unshare", "chroot", "nsenter", "busybox"})
#: Interpreters whose programs cannot be read here: a wrapper running one is refused.
OPAQUE = frozenset({"python", "python2", "python3", "perl", "ruby", "node", "lua", "php", "tclsh", "awk",
                    "gawk", "mawk", "nawk", "sed", "find", "make", "ninja", "su", "script", "watch"})
_FIX = ("set CUDA_HOME=<the real toolkit prefix> (the directory above the real bin/nvcc) instead of "
        "this wrapper, or replace the wrapper with a symlink")
_ALLOWED = ("a wrapper is accepted only when every command it runs is a shell builtin ("
            + " ".join(sorted(shell.BUILTINS)) + ") or a literal absolute path to a trusted file")


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


def _read_script(real: str) -> str | None:
    """The text of ``real`` when it is a ``#!`` script, else ``None``; refused when
    larger than :data:`MAX_SCRIPT_BYTES` (a line past what was read could run
    anything) or not UTF-8 text."""
    try:
        if not formats.read_prefix(real, 2).startswith(b"#!"):
            return None
        raw = formats.read_bytes(real, MAX_SCRIPT_BYTES)
    except FormatError as exc:
        raise Untrusted(f"{exc}; a script is read whole to check what it runs, so it is too large to "
                         f"check; {_FIX}") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise Untrusted(f"{real} is a script that is not UTF-8 text, so what it runs cannot be checked; "
                         f"{_FIX}") from None


def _refuse(script: str, what: str) -> Untrusted:
    return Untrusted(f"{script}: {what}, so what it would run cannot be checked; {_ALLOWED}; {_FIX}")


def _shebang(text: str, script: str) -> tuple[str, str]:
    """``(interpreter, argument)`` as Linux reads a ``#!`` line: blanks after
    ``#!`` skipped, the interpreter up to the next blank, the rest (trimmed) as
    one argument (``binfmt_script``)."""
    line = text.partition("\n")[0][2:].strip(" \t")
    interp, _, arg = line.replace("\t", " ").partition(" ")
    if not interp:
        raise _refuse(script, "its '#!' line names no interpreter")
    return interp, arg.strip()


def _check_arg_files(cmd: shell.Command, uid: int, script: str) -> None:
    """An existing file named by absolute path as an argument may be run by the
    program (``/bin/tool /opt/x/run``): it must pass the rule too."""
    for w in cmd.words[1:]:
        if w.literal and w.text.startswith("/") and os.path.isfile(w.text):
            file_ok(resolve(w.text, uid), uid)


def _run_target(cmd: shell.Command, prog: str, script: str) -> shell.Word | None:
    """What a shell or launcher ``prog`` runs from its arguments, or ``None`` when
    it runs nothing more (a program that is neither)."""
    name = _base(prog)
    if name in OPAQUE:
        raise _refuse(script, f"line {cmd.line} runs {prog}, an interpreter whose program cannot be read here")
    if name not in SHELLS and name not in LAUNCHERS:
        return None
    args = list(cmd.words[1:])
    while args and args[0].literal and args[0].text.startswith("-") and args[0].text != "-":
        opt = args.pop(0).text
        if name in SHELLS and not set(opt[1:]) <= SHELL_OPTIONS:
            raise _refuse(script, f"line {cmd.line} runs the shell {prog} with {opt!r} (options other than "
                                  f"-{''.join(sorted(SHELL_OPTIONS))} run code from elsewhere)")
    if not args:
        raise _refuse(script, f"line {cmd.line} runs {prog} with nothing to run (it would read commands "
                              f"from elsewhere)")
    target = args[0]
    if not (target.literal and target.text.startswith("/")):
        raise _refuse(script, f"line {cmd.line}: {prog} runs {formats.shown(target.text, 60)}, which is not "
                              f"a literal absolute path")
    return target


def _follow(path: str, uid: int, chain: list[str], files: list[str], checked: dict[str, str],
            body: bool = True) -> str:
    """Check ``path`` and whatever it runs; returns the final target's real path.
    ``checked`` maps files already found trusted to their final target, so a
    script naming the same programs many times is checked once per program."""
    real = resolve(path, uid)
    st = file_ok(real, uid)
    if not stat.S_ISREG(st.st_mode):
        raise Untrusted(f"{real} is not a regular file")
    if real in chain:
        raise Untrusted("wrapper loop: " + " -> ".join(chain + [real]) + "; it would never finish; "
                         "set CUDA_HOME to the real toolkit prefix instead")
    if len(chain) >= MAX_WRAPPER_DEPTH:
        raise Untrusted(f"wrappers nested more than {MAX_WRAPPER_DEPTH} deep at {real}; "
                         "set CUDA_HOME to the real toolkit prefix instead")
    chain.append(real)
    files.append(real)
    text = _read_script(real)
    if text is None:
        return real
    interp, arg = _shebang(text, real)
    if not interp.startswith("/"):
        raise _refuse(real, f"its '#!' line names {formats.shown(interp, 60)}, not an absolute path")
    shell_real = _follow(interp, uid, list(chain), files, checked, body=False)
    if _read_script(shell_real) is not None:
        raise _refuse(real, f"its interpreter {interp} is itself a script (name the shell binary instead)")
    if not body:
        return real
    if os.path.basename(shell_real) not in SHELLS:
        what = ("/usr/bin/env, which finds the program on PATH when it runs"
                if os.path.basename(shell_real) == "env" else f"{shell_real}, not a shell of "
                + ", ".join(sorted(SHELLS)))
        raise _refuse(real, f"its '#!' line runs {what}")
    if arg.startswith("-"):
        if not set(arg[1:]) <= SHELL_OPTIONS:
            raise _refuse(real, f"its '#!' line passes {arg!r} to the shell (options other than "
                                f"-{''.join(sorted(SHELL_OPTIONS))} run code from elsewhere)")
    elif arg:  # '#!/bin/sh /opt/x/real-nvcc': the shell runs that script, not this file's body
        if not arg.startswith("/"):
            raise _refuse(real, f"its '#!' line passes {formats.shown(arg, 60)} to the interpreter, not an "
                                f"absolute path")
        final = _follow(arg, uid, list(chain), files, checked)
        checked[real] = final
        return final
    try:
        cmds = shell.commands(text.partition("\n")[2])
    except shell.Refused as exc:
        line, _, what = str(exc).partition(": ")
        n = int(line.split()[-1]) + 1 if line.split()[-1].isdigit() else 0  # body line -> file line
        raise _refuse(real, f"line {n}: {what}") from None
    final = real
    for cmd in cmds:
        first = cmd.words[0]
        n = cmd.line + 1
        if first.literal and first.text in shell.BUILTINS:
            _check_arg_files(cmd, uid, real)
            continue
        if first.expansions:
            raise _refuse(real, f"line {n} runs {formats.shown(first.text, 60)}: it computes the path of "
                                f"the program it runs")
        if not (first.literal and first.text.startswith("/")):
            word = first.text
            why = ("'cd' changes what relative paths name" if word == "cd" else
                   "'eval'/'source'/'.' run code the script does not hold" if word in ("eval", "source", ".")
                   else "a program found on PATH when it runs" if "/" not in word
                   else "a relative path, which depends on the working directory")
            raise _refuse(real, f"line {n} runs {formats.shown(word, 60)} ({why})")
        at = 0  # index in cmd.words of the program that runs; a launcher hands on to a later word
        while at is not None:
            w = cmd.words[at]
            t = os.path.realpath(w.text)
            if t in chain:
                raise Untrusted("wrapper loop: " + " -> ".join(chain + [t]) + "; it would never finish; "
                                 "set CUDA_HOME to the real toolkit prefix instead")
            got = checked[t] if t in checked else _follow(w.text, uid, list(chain), files, checked)
            more = _run_target(shell.Command(cmd.words[at:], cmd.line), t, real)
            if more is not None:
                at = at + 1 + cmd.words[at + 1:].index(more)
            else:
                if final == real and "nvcc" in (os.path.basename(w.text), os.path.basename(got)):
                    final = got  # the first nvcc it runs is what it wraps
                at = None
        _check_arg_files(cmd, uid, real)
    checked[real] = final
    return final


def trace(path: str, *, body: bool = True) -> Trace:
    """Follow ``path`` through links and wrapper scripts, checking trust at every step.

    Nothing is executed and nothing is looked up on ``PATH``: scripts are read
    as text (see the module docstring for the allowlist a script must meet).

    Args:
        path: the program, e.g. ``$CUDA_HOME/bin/nvcc``.
        body: ``False`` checks only the file, its links and its ``#!``
            interpreter, not what a script's body runs: for a program we run
            for its own sake (``which``), not as a wrapper of nvcc.

    Returns:
        A :class:`Trace`; ``problem`` is set when anything on the way is
        untrusted or cannot be told.
    """
    uid = current_uid()
    files: list[str] = []
    try:
        target = _follow(path, uid, [], files, {}, body=body)
    except Untrusted as exc:
        return Trace(path, None, tuple(files), str(exc))
    except OSError as exc:
        return Trace(path, None, tuple(files), f"cannot check {exc.filename or path}: {exc.strerror or exc}")
    return Trace(path, target, tuple(dict.fromkeys(files)), None)


def check_executable(path: str) -> str | None:
    """``None`` when ``path`` may be run (see :func:`trace`), else the reason."""
    return trace(path).problem


def follow_wrappers(path: str) -> str | None:
    """Real path of the program ``path`` finally runs, reading wrappers with the
    same grammar as :func:`trace` but with no trust verdict (used to place a
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
            cmds = shell.commands(text.partition("\n")[2]) if text is not None else []
        except (Untrusted, shell.Refused):
            return real
        nxt = next((c.words[0].text for c in cmds if c.words[0].literal and c.words[0].text.startswith("/")
                    and os.path.basename(c.words[0].text) == "nvcc"
                    and os.path.realpath(c.words[0].text) != real and os.path.isfile(c.words[0].text)), None)
        if nxt is None:
            return real
        cur = nxt
    return os.path.realpath(cur)
