"""FlashInfer's own compiler variables, under our trust rule.

FlashInfer 0.7.x writes four environment variables into every ``build.ninja`` it
generates (``flashinfer/jit/cpp_ext.py`` ``generate_ninja_build_for_op``, 0.7.4):

``FLASHINFER_NVCC``
    used instead of ``$cuda_home/bin/nvcc``: nvcc with the chosen toolkit's headers.
``FLASHINFER_NVCC_LAUNCHER`` / ``FLASHINFER_CXX_LAUNCHER``
    a command put before nvcc / the host compiler (``sccache``, ``ccache``).
``CXX``
    the host compiler and linker (default ``c++``).

Every program they name is run by every JIT build, so each must pass the trust rule
(:func:`flashinfer_sm120.toolkit.trust.check_executable`: owned by root or you,
not writable by others, all the way, wrappers followed); one that does not is
*refused*: removed from this process's environment (undone by ``revert()``) with a
message naming the value, the reason and the fix.

``FLASHINFER_NVCC`` must also be the chosen toolkit's nvcc.  It is a candidate
like any other (the ``FLASHINFER_NVCC`` find step in
:data:`flashinfer_sm120.toolkit.sources.FIND_STEPS` offers its toolkit first), so
it is kept exactly when its toolkit was chosen; otherwise FlashInfer would compile
with one toolkit's nvcc and another's headers, and it is refused.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import shutil

from .. import formats
from ..errors import FormatError
from ..toolkit.trust import trace

__all__ = ["VARIABLES", "Verdict", "check", "program_of"]

#: FlashInfer's compiler variables, in the order they are checked.
VARIABLES = ("FLASHINFER_NVCC", "FLASHINFER_NVCC_LAUNCHER", "FLASHINFER_CXX_LAUNCHER", "CXX")


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What happens to one variable the user set.

    Attributes:
        var: the variable.
        value: its value (cut for display).
        keep: whether it stays in the environment.
        note: one sentence for the log and ``doctor``: why kept, or why refused and the fix.
    """

    var: str
    value: str
    keep: bool
    note: str


def program_of(value: str, path: str | None) -> tuple[str | None, list[str], str | None]:
    """``(program, other existing absolute files named, problem)`` of a command value as
    FlashInfer's ninja line runs it (``/bin/sh -c``): the first word, found on ``path``."""
    try:
        words = shlex.split(value)
    except ValueError as exc:
        return None, [], f"cannot be split into words like a shell would ({exc})"
    if not words:
        return None, [], "is empty"
    prog = words[0]
    if "=" in prog and not prog.startswith("/"):
        return None, [], "starts with a variable assignment, so what it runs cannot be checked"
    found = prog if os.path.isabs(prog) else shutil.which(prog, path=path if path is not None else os.defpath)
    if not found:
        return None, [], f"names {formats.shown(prog, 60)}, which is not on PATH"
    others = [w for w in words[1:] if w.startswith("/") and os.path.isfile(w)]
    return found, others, None


def _trust_problem(value: str, path: str | None) -> str | None:
    prog, others, problem = program_of(value, path)
    if problem:
        return problem
    for p in [prog, *others]:
        why = trace(p).problem
        if why:
            return why
    return None


def _same_program(a: str, b: str) -> bool:
    ta, tb = trace(a), trace(b)
    real_a = ta.target or os.path.realpath(a)
    real_b = tb.target or os.path.realpath(b)
    return os.path.realpath(real_a) == os.path.realpath(real_b)


def check(env, chosen_nvcc: str, home: str) -> list[Verdict]:
    """A verdict for each of :data:`VARIABLES` set in ``env``.

    Args:
        env: the environment (``os.environ``).
        chosen_nvcc: the chosen toolkit's nvcc.
        home: the ``CUDA_HOME`` FlashInfer builds with (named in messages).
    """
    out = []
    path = env.get("PATH")
    for var in VARIABLES:
        try:
            value = formats.env_text(var, env, max_len=4096)
        except FormatError as exc:
            out.append(Verdict(var, "(unreadable)", False, f"{exc}; not used"))
            continue
        if value is None or (value == "" and var != "FLASHINFER_NVCC"):
            continue
        shown = formats.shown(value, 120)
        if var == "FLASHINFER_NVCC":
            out.append(_check_nvcc(value, shown, chosen_nvcc, home, path))
            continue
        problem = _trust_problem(value, path)
        if problem:
            what = "the host compiler and linker" if var == "CXX" else "a compiler launcher"
            out.append(Verdict(var, shown, False,
                               f"{var}={shown} ({what} FlashInfer would run in every JIT build) is refused: "
                               f"{problem}. Fix: point {var} at a program owned by root or you and not "
                               f"writable by others, or unset it"))
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
    problem = _trust_problem(words[0], path)
    if problem:
        return Verdict(var, shown, False, f"{var}={shown} is refused: {problem}. Fix: unset {var} (the "
                                          f"chosen toolkit's nvcc is {chosen_nvcc})")
    if _same_program(words[0], chosen_nvcc):
        return Verdict(var, shown, True, f"{var}={shown}: the chosen toolkit's nvcc, used as set")
    return Verdict(var, shown, False,
                   f"{var}={shown} is refused: it is not the chosen toolkit's nvcc ({chosen_nvcc}), so FlashInfer "
                   f"would compile with it against the headers of {home}. Its toolkit was a candidate and "
                   f"was not chosen (see 'flashinfer-sm120 doctor' for why). Fix: unset {var}, or set "
                   f"CUDA_HOME to the toolkit it belongs to if that toolkit can build your GPUs' targets")
