"""What a JIT build runs, held to the trust rule (threat-model: P2): the variables that choose it (FlashInfer 0.7.4
``jit/cpp_ext.py``; nvcc 13.0 runs ``-ccbin $CC``, else ``NVCC_CCBIN``, else ``gcc``) and what it runs by bare name."""

from __future__ import annotations

import os
import re
from collections import namedtuple

from flashinfer_sm120.errors import FormatError
from flashinfer_sm120.safety.formats import base, fields, grammar
from flashinfer_sm120.safety.fs.atomic import TEMP_VARIABLES
from flashinfer_sm120.safety.ownership import PathProblem, trust_reason
from flashinfer_sm120.safety.trust import SHELL_OPTIONS, hands_on, named_path_problem, named_paths, trace, which

__all__ = ["DIR_VARIABLES", "FLAG_VARIABLES", "VARIABLES", "BY_NAME", "Verdict",
           "check", "program_of", "trust_problem", "ccbin_values", "path_problem", "temp_problem"]

#: Variables whose words are options for nvcc or the host compiler: nvcc reads the first two itself,
#: FlashInfer appends the others to its compile and link lines.
FLAG_VARIABLES = ("NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS", "FLASHINFER_EXTRA_CFLAGS",
                  "FLASHINFER_EXTRA_CUDAFLAGS", "FLASHINFER_EXTRA_LDFLAGS")

#: Where gcc finds programs, libraries and headers (gcc 12 manual, "Environment Variables"), the RUNPATH
#: ``ld`` writes, what every program of a build loads (cc1plus loads libmpc, libisl, libgmp) and files gcc writes.
DIR_VARIABLES = ("GCC_EXEC_PREFIX", "COMPILER_PATH", "LIBRARY_PATH", "CPATH", "C_INCLUDE_PATH",
                 "CPLUS_INCLUDE_PATH", "LD_RUN_PATH", "LD_LIBRARY_PATH", "LD_PRELOAD", "DEPENDENCIES_OUTPUT",
                 "SUNPRO_DEPENDENCIES")

#: The compiler cache's opt-in variable; its one value besides off is ``sccache``.
CACHE_ENV = "FLASHINFER_SM120_COMPILER_CACHE"


def requested(env=None) -> tuple[str | None, str | None]:
    """``(kind, problem)``: ``("sccache", None)``, ``(None, None)`` when not asked for, ``(None, why and the fix)``."""
    try:
        raw = fields.env_text(CACHE_ENV, env, max_len=64)
    except FormatError as exc:
        return None, str(exc)
    value = (raw or "").strip().lower()
    if value in ("", "0", "off", "no", "none", "false"):
        return None, None
    if value == "sccache":
        return value, None
    return None, (f"{CACHE_ENV}={base.shown(raw, 40)} is not a compiler cache flashinfer-sm120 knows; set it to "
                  "sccache, or unset it")


_PROGRAM_FIX = "point {var} at a program owned by root or you and not writable by others, or unset it"
#: kind -> (what a variable of that kind chooses, the fix when it is refused).
_KINDS = {
    "launcher": ("a compiler launcher FlashInfer would run", _PROGRAM_FIX),
    "cxx": ("the host compiler and linker FlashInfer would run", _PROGRAM_FIX + " (FlashInfer then runs c++)"),
    "cc": ("nvcc's host compiler, -ccbin $CC", _PROGRAM_FIX),
    "ccbin": ("nvcc's host compiler", _PROGRAM_FIX),
    "flags": ("options", "drop the option naming it from {var}, or point it at files owned by root or you and "
                         "not writable by others"),
    "dirs": ("where gcc finds programs, libraries or headers", "drop that directory from {var}, or unset it"),
}

#: The variables that choose what a JIT build runs, in the order they are checked, and their kind.
VARIABLES: dict[str, str] = {"FLASHINFER_NVCC": "nvcc", "FLASHINFER_NVCC_LAUNCHER": "launcher",
                             "FLASHINFER_CXX_LAUNCHER": "launcher", "CXX": "cxx", "CC": "cc", "NVCC_CCBIN": "ccbin",
                             **dict.fromkeys(FLAG_VARIABLES, "flags"), **dict.fromkeys(DIR_VARIABLES, "dirs")}

#: What every JIT build runs by bare name unless a variable replaces it (``-ccbin``: one in the first two
#: :data:`FLAG_VARIABLES`): (name, role, replaced by, fix); nvcc 13.0 ``--dryrun``, FlashInfer 0.7.4 ``cpp_ext.py``.
BY_NAME: tuple[tuple[str, str, tuple[str, ...], str], ...] = (
    ("gcc", "nvcc's host compiler", ("CC", "NVCC_CCBIN", "-ccbin"),
     ", or set NVCC_CCBIN to a trusted host compiler (e.g. NVCC_CCBIN=/usr/bin/g++)"),
    ("c++", "FlashInfer's C++ compiler and linker (CXX unset)", ("CXX",),
     ", or set CXX to a trusted compiler (e.g. CXX=/usr/bin/c++)"),
    ("rm", "nvcc's clean-up of its temporary files", (), ""),
    ("as", "gcc's assembler", (), ""),
    ("ld", "gcc's linker", (), ""),
)

#: nvcc's option that names the host compiler (a program, or a directory holding ``gcc``).
_CCBIN_RE = re.compile(r"(?<!\S)(?:-ccbin|--compiler-bindir)(?:=(\S*)|\s+(\S+))")


#: Whether to ``keep`` the variable ``var`` (``value`` cut for display), and ``note``: why, and the fix.
Verdict = namedtuple("Verdict", "var value keep note")


def program_of(value: str, path: str | None) -> tuple[str | None, list[str], str | None]:
    """``(program, other files it runs or names, problem)`` of a command value as ninja runs it (``/bin/sh -c``)."""
    try:
        words = grammar.parse_command_words(value, "the value")
    except FormatError as exc:
        return None, [], _what_is_wrong(exc)
    if "=" in words[0] and not words[0].startswith("/"):
        return None, [], "starts with a variable assignment, so what it runs cannot be checked"
    programs: list[str] = []
    i = 0
    while True:
        found, problem = which(words[i], path)
        if problem:
            return None, [], problem
        programs.append(found)
        kind = hands_on(found)
        if kind == "opaque":
            return None, [], f"runs {found}, an interpreter whose program cannot be read here"
        if kind is None:
            break
        j = i + 1
        while j < len(words) and words[j].startswith("-") and words[j] != "-":
            if kind == "shell" and not set(words[j][1:]) <= SHELL_OPTIONS:
                return None, [], f"runs the shell {found} with {words[j]!r}, which runs code from elsewhere"
            if kind == "launcher":  # P2, P5: `env -S/x`, `time -o/x`, `env -u TMPDIR` run, write or unset unchecked
                return None, [], (f"runs {found} with the option {base.shown(words[j], 60)}: a program that runs "
                                  f"another is used without options (they can name what it runs or writes, or "
                                  f"change the environment a compile relies on)")
            j += 1
        if j >= len(words):
            if kind == "shell":
                return None, [], f"runs the shell {found} on the words FlashInfer appends"
            break  # a launcher of the compiler FlashInfer puts after it
        if kind == "shell" and not words[j].startswith("/"):
            return None, [], (f"runs the shell {found} on {base.shown(words[j], 60)}, which is not an "
                              f"absolute path")
        i = j
    others = [w for w in words if w.startswith("/") and os.path.isfile(w) and w not in programs]
    if kind is None:  # the compiler's own options: those FlashInfer uses, never one that picks programs
        opts = [w for w in words[i + 1:] if w not in others]
        if opts:
            from flashinfer_sm120.safety.formats.params import parse_compile_flag  # only for a value with options

            try:  # (-B/dir, -wrapper, -fplugin=, -specs=, -Wl,... made g++ run or load another user's code)
                _, dirs = parse_compile_flag(" ".join(opts), "the value")
            except FormatError as exc:
                return None, [], _what_is_wrong(exc)
            others += dirs
    return programs[0], programs[1:] + others, None


def _what_is_wrong(exc: FormatError) -> str:
    """A refusal of the value's words (the caller names the variable)."""
    return f"{exc.problem}; {exc.fix}" if exc.fix else exc.problem


def trust_problem(value: str, path: str | None) -> str | None:
    """Why the command ``value`` (found on ``path``) may not run, or ``None``."""
    prog, others, problem = program_of(value, path)
    if problem:
        return problem
    for p in [prog, *others]:
        why = trace(p).problem
        if why:
            return why
    return None


def _ccbin_problem(value: str, path: str | None) -> str | None:
    """Why nvcc may not run the host compiler ``-ccbin value`` (a directory means its ``gcc``), or ``None``."""
    if os.path.isabs(value) and os.path.isdir(value):
        return trace(os.path.join(value, "gcc")).problem
    prog, problem = which(value, path)
    return problem or trace(prog).problem


def ccbin_values(words: list[str]) -> list[str]:
    """What each ``-ccbin X``, ``-ccbin=X`` (or ``--compiler-bindir``) of the option ``words`` names."""
    return [attached or apart for attached, apart in _CCBIN_RE.findall(" ".join(words))]


def _dirs_problem(value: str, var: str) -> str | None:
    """Why gcc's variable ``var`` (:data:`DIR_VARIABLES`) may not reach a build, or ``None``."""
    # LD_PRELOAD takes spaces too, *_DEPENDENCIES are "FILE [TARGET]"; a prefix or absent file: the level above
    blank = var in ("LD_PRELOAD", "DEPENDENCIES_OUTPUT", "SUNPRO_DEPENDENCIES")
    entries = re.split(r"[:\s]" if blank else re.escape(os.pathsep), value)
    return next(filter(None, (named_path_problem(d) for d in entries if os.path.isabs(d))), None)


def _flags_problem(value: str, path: str | None) -> str | None:
    """Why the option words ``value`` may not go to a build, or ``None``."""
    words = value.split()
    for cc in ccbin_values(words):
        problem = _ccbin_problem(cc, path)
        if problem:
            return f"its -ccbin {base.shown(cc, 60)}: {problem}"
    return next(filter(None, (named_path_problem(p) for w in words for p in named_paths(w)[0])), None)


def check(env, chosen_nvcc: str, home: str) -> list[Verdict]:
    """A verdict for each of :data:`VARIABLES` set in ``env``; ``home``: FlashInfer's ``CUDA_HOME``."""
    out = []
    path = env.get("PATH")
    for var, kind in VARIABLES.items():
        try:
            value = fields.env_text(var, env, max_len=4096)
        except FormatError as exc:
            out.append(Verdict(var, "(unreadable)", False, f"{exc}; not used"))
            continue
        if value is None or (value == "" and kind not in ("nvcc", "cxx")):
            continue  # an empty launcher is FlashInfer's own default; CXX='' is no command (its link rule ran $in)
        shown = base.shown(value, 120)
        if kind == "nvcc":
            out.append(_check_nvcc(value, shown, chosen_nvcc, home, path))
            continue
        problem = (_flags_problem(value, path) if kind == "flags" else _dirs_problem(value, var) if kind == "dirs"
                   else _ccbin_problem(value.strip(), path) if kind == "ccbin" else trust_problem(value, path))
        if problem:
            what, fix = _KINDS[kind]
            out.append(Verdict(var, shown, False, f"{var}={shown} ({what}, in every JIT build) is refused: "
                                                  f"{problem}. Fix: {fix.format(var=var)}"))
        else:
            out.append(Verdict(var, shown, True, f"{var}={shown}: trusted, used as set"))
    return out


def _check_nvcc(value: str, shown: str, chosen_nvcc: str, home: str, path: str | None) -> Verdict:
    var = "FLASHINFER_NVCC"
    words = value.split()
    if len(words) != 1 or not os.path.isabs(words[0]):
        return Verdict(var, shown, False,
                       f"{var}={shown} is refused: it must be the absolute path of one nvcc (FlashInfer puts "
                       f"it in its ninja files as the compiler). Fix: put a launcher such as sccache in "
                       f"FLASHINFER_NVCC_LAUNCHER and the nvcc path alone in {var}, or unset it")
    problem = trust_problem(words[0], path)
    if problem:
        return Verdict(var, shown, False, f"{var}={shown} is refused: {problem}. Fix: unset {var} (the "
                                          f"chosen toolkit's nvcc is {chosen_nvcc})")
    if len({os.path.realpath(trace(p).target or p) for p in (words[0], chosen_nvcc)}) == 1:
        return Verdict(var, shown, True, f"{var}={shown}: the chosen toolkit's nvcc, used as set")
    return Verdict(var, shown, False,
                   f"{var}={shown} is refused: it is not the chosen toolkit's nvcc ({chosen_nvcc}), so FlashInfer "
                   f"would compile with it against the headers of {home}. Its toolkit was a candidate and "
                   f"was not chosen (see 'flashinfer-sm120 doctor' for why). Fix: unset {var}, or set "
                   f"CUDA_HOME to the toolkit it belongs to if that toolkit can build your GPUs' targets")


def temp_problem(env) -> PathProblem | None:
    """The first of :data:`TEMP_VARIABLES` in ``env`` failing the trust rule (others could swap a compile's files)."""
    for var in TEMP_VARIABLES:
        value = env.get(var) or ""
        if not os.path.isabs(value):
            continue  # unset or relative: nvcc and gcc then use /tmp
        why = trust_reason(os.path.join(value, "flashinfer-sm120"))  # what a compile makes in it
        if why:
            return PathProblem(f"the temporary directory ({var}, where nvcc and the host compiler write intermediate "
                               f"files)", value, why,
                               f"set {var} to a directory of your own (mkdir -m 700 ~/tmp; {var}=~/tmp) or unset it")
    return None


def path_problem(env) -> PathProblem | None:
    """Why a build may not run with ``env``: an untrusted :data:`BY_NAME` program, else :func:`temp_problem`."""
    # relative entries name the module's build directory, which the JIT directory's own check covers
    path = os.pathsep.join(d for d in (env.get("PATH") or os.defpath).split(os.pathsep) if os.path.isabs(d))
    flags = " ".join(env.get(v) or "" for v in FLAG_VARIABLES[:2]).split()
    for name, role, unless, fix in BY_NAME:
        if any((u == "-ccbin" and ccbin_values(flags)) or (u != "-ccbin" and env.get(u)) for u in unless):
            continue
        found, _ = which(name, path)
        problem = trace(found).problem if found else None
        if problem:
            return PathProblem(f"{role}, found on PATH:", found, problem, f"take {os.path.dirname(found)} off PATH{fix}")
    return temp_problem(env)
