"""What every JIT build runs by bare name and where its compilers write, checked where ``PATH`` and
``TMPDIR`` point (threat-model: P2); and each build's own temporary directory (P5): nvcc 13.0 opens its
``tmpxft_<pid>_<n>-<k>_<name>`` files with ``O_TRUNC`` and without ``O_EXCL`` (strace)."""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import os
import tempfile
import threading
from collections.abc import Iterator

from flashinfer_sm120.safety.fs.tmpdirs import Private, make_private
from flashinfer_sm120.safety.compilers import FLAG_VARIABLES, ccbin_values
from flashinfer_sm120.safety.ownership import trust_reason
from flashinfer_sm120.safety.trust import trace, which

__all__ = ["BY_NAME", "ByName", "PathProblem", "TEMP_VARIABLES", "path_problem", "temp_problem",
           "BUILD_TMP_PREFIX", "build_tmp", "build_env", "exported_build_tmp"]


@dataclasses.dataclass(frozen=True)
class ByName:
    """A program a build runs by bare ``name`` (``role``) unless a variable of ``unless`` is set
    (``"-ccbin"``: a ``-ccbin`` in :data:`FLAG_VARIABLES`); ``fix``."""

    name: str
    role: str
    unless: tuple[str, ...]
    fix: str


#: What every JIT build runs by bare name (nvcc 13.0 ``--dryrun``; FlashInfer 0.7.4 ``cpp_ext.py``).
BY_NAME: tuple[ByName, ...] = (
    ByName("gcc", "nvcc's host compiler", ("CC", "NVCC_CCBIN", "-ccbin"),
           "or set NVCC_CCBIN to a trusted host compiler (e.g. NVCC_CCBIN=/usr/bin/g++)"),
    ByName("c++", "FlashInfer's C++ compiler and linker (CXX unset)", ("CXX",),
           "or set CXX to a trusted compiler (e.g. CXX=/usr/bin/c++)"),
    ByName("rm", "nvcc's clean-up of its temporary files", (), ""),
    ByName("as", "gcc's assembler", (), ""),
    ByName("ld", "gcc's linker", (), ""),
)


@dataclasses.dataclass(frozen=True)
class PathProblem:
    """A program or directory a build would use that fails the trust rule."""

    program: str
    role: str
    why: str
    fix: str
    found: str = "found on PATH"

    def __str__(self) -> str:
        return f"{self.role} {self.program} ({self.found}) fails the trust rule: {self.why}. Fix: {self.fix}"


#: Where nvcc, gcc and Python's ``tempfile`` write intermediate files, in the order they read them.
TEMP_VARIABLES = ("TMPDIR", "TMP", "TEMP")


def temp_problem(env) -> PathProblem | None:
    """The first directory of :data:`TEMP_VARIABLES` set in ``env`` that fails the trust rule (another
    uid could swap a file between two steps of a compile)."""
    for var in TEMP_VARIABLES:
        value = env.get(var) or ""
        if not os.path.isabs(value):
            continue  # unset or relative: nvcc and gcc then use /tmp
        why = trust_reason(os.path.join(value, "flashinfer-sm120"))  # what a compile makes in it
        if why:
            return PathProblem(value, "the temporary directory", why,
                               f"set {var} to a directory of your own (mkdir -m 700 ~/tmp; {var}=~/tmp) or unset it",
                               f"{var}, where nvcc and the host compiler write intermediate files")
    return None


def path_problem(env) -> PathProblem | None:
    """Why a JIT build may not run with ``env``: the first program of :data:`BY_NAME` no variable
    replaces that ``PATH`` finds failing the trust rule, else :func:`temp_problem`; ``None`` when none."""
    # relative entries name the module's build directory, which the JIT directory's own check covers
    path = os.pathsep.join(d for d in (env.get("PATH") or os.defpath).split(os.pathsep) if os.path.isabs(d))
    flags = " ".join(env.get(v) or "" for v in FLAG_VARIABLES[:2]).split()
    for prog in BY_NAME:
        if any((u == "-ccbin" and ccbin_values(flags)) or (u != "-ccbin" and env.get(u)) for u in prog.unless):
            continue
        found, _ = which(prog.name, path)
        problem = trace(found).problem if found else None
        if problem:
            return PathProblem(found, prog.role, problem,
                               f"take {os.path.dirname(found)} off PATH{', ' + prog.fix if prog.fix else ''}")
    return temp_problem(env)


# threat-model: P5 (never clobber: a compiler's predictable temporary names only in a directory of ours)
#: The prefix of a process's build temporary directory under ``$TMPDIR``.
BUILD_TMP_PREFIX = "fi-sm120-build-"
_BUILD: dict[int, Private] = {}  # pid -> its directory: a forked child makes its own
_LOCK = threading.Lock()
_EXPORTED = {"depth": 0, "saved": {}}


def _close_own() -> None:
    d = _BUILD.pop(os.getpid(), None)
    if d is not None:
        d.close()


def build_tmp() -> str:
    """This process's private build temporary directory, made on first use and removed at exit.
    Raises :class:`PlaceError` when ``$TMPDIR`` is not a place of our own."""
    pid = os.getpid()
    with _LOCK:
        d = _BUILD.get(pid)
        if d is None or not os.path.isdir(d.path):
            first = not _BUILD
            d = _BUILD[pid] = make_private(BUILD_TMP_PREFIX)
            if first:
                atexit.register(_close_own)
        return d.path


def build_env(env) -> dict:
    """A copy of ``env`` whose :data:`TEMP_VARIABLES` name :func:`build_tmp`, for a compiler we start."""
    path = build_tmp()
    return dict(env, **{var: path for var in TEMP_VARIABLES})


@contextlib.contextmanager
def exported_build_tmp(environ=None) -> Iterator[str]:
    """Point :data:`TEMP_VARIABLES` of the process at :func:`build_tmp` while the block runs (FlashInfer's
    ``run_ninja`` passes no ``env``); the last block to leave restores what nobody changed meanwhile."""
    environ = os.environ if environ is None else environ
    tempfile.gettempdir()  # chosen (and cached) from the user's setting, never from ours
    path = build_tmp()
    with _LOCK:
        if _EXPORTED["depth"] == 0:
            _EXPORTED["saved"] = {var: environ.get(var) for var in TEMP_VARIABLES}
            environ.update({var: path for var in TEMP_VARIABLES})
        _EXPORTED["depth"] += 1
    try:
        yield path
    finally:
        with _LOCK:
            _EXPORTED["depth"] -= 1
            if _EXPORTED["depth"] == 0:
                for var, old in _EXPORTED["saved"].items():
                    if environ.get(var) != path:
                        continue  # changed by someone else while we built: theirs now
                    if old is None:
                        environ.pop(var, None)
                    else:
                        environ[var] = old
