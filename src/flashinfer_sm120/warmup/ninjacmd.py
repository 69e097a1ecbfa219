"""One module's ninja, as FlashInfer runs it: the binary (the one the server will run), its
command line and environment, a dry run (what it would still do), what the module's binary
holds by its ``-gencode`` flags, and which steps it runs (from ``/proc``).  A *job* is
anything with ``label``, ``build_dir`` and ``ninja_path`` (:class:`.pool.Job`)."""

from __future__ import annotations

import dataclasses
import os
import re

__all__ = ["STATUS_RE", "ninja_binary", "command", "ninja_env", "dry_run", "gencode_summary", "Step", "steps",
           "step_name"]

#: A ninja status line under ``NINJA_STATUS="[%f/%t] "``: finished, total, the step.  At most 9 ASCII
#: digits: ninja passes the compilers' output through, and ``int()`` refuses over 4300 digits.
STATUS_RE = re.compile(r"^\[([0-9]{1,9})/([0-9]{1,9})\] (.*)$")
_SRC_RE = re.compile(r" -c (\S+)")
_DRY_RUN_MAX = 16 << 20  # ninja -n of a FlashInfer module: a few KB per step


def ninja_binary() -> str:
    """The ninja the server will run (:func:`flashinfer_sm120.core.toolkit.ninja.choose`: the
    ``ninja`` wheel next to FlashInfer first, trusted like any binary), which the export puts
    first on ``PATH`` for FlashInfer's ``run_ninja``: a cache built by another ninja release
    (another ``.ninja_log`` format) would be rebuilt by the server.

    :raises flashinfer_sm120.core.toolkit.ninja.NinjaError: no usable ninja (the message names the fix)."""
    from flashinfer_sm120.core.toolkit import ninja

    return ninja.choose().path


def command(job, *extra: str) -> list[str]:
    return [ninja_binary(), "-C", str(job.build_dir.resolve()), "-f", str(job.ninja_path.resolve()), *extra]


def ninja_env() -> dict:
    """The process environment with ninja's status format and a temporary directory of this
    process's own (:func:`flashinfer_sm120.safety.buildenv.build_env`: nvcc's temporary names are
    predictable).

    :raises flashinfer_sm120.errors.PlaceError: ``$TMPDIR`` is another uid's to change."""
    from flashinfer_sm120.safety.buildenv import build_env

    return build_env(dict(os.environ, NINJA_STATUS="[%f/%t] "))


def dry_run(job) -> list[str]:
    """Commands ninja would run for ``job`` now (empty: up to date).  Runs ``ninja -n``.

    :raises flashinfer_sm120.core.toolkit.ninja.NinjaError: ninja itself failed (bad build file)."""
    from flashinfer_sm120.safety import proc
    from flashinfer_sm120.core.toolkit.ninja import NinjaError

    res = proc.run(command(job, "-n"), timeout=120, max_output=_DRY_RUN_MAX, env=ninja_env())
    if not res.ok:
        why = ("timed out" if res.timed_out else f"printed more than {_DRY_RUN_MAX} bytes" if res.truncated
               else res.error or f"exit {res.returncode}")
        raise NinjaError(f"ninja -n failed for {job.label} ({why}): {res.text()[-2000:]}")
    return [m.group(3) for m in map(STATUS_RE.match, res.text().splitlines()) if m]


def gencode_summary(ninja_text: str) -> list[str]:
    """What the module's binary holds, per ``-gencode``: ``SASS sm_120f`` for ``code=sm_*``
    (machine code), ``PTX compute_120f`` only for ``code=compute_*`` (embedded PTX).
    Source: nvcc documentation, "--generate-code" (code=sm_XY is a cubin, code=compute_XY is PTX)."""
    out = []
    for arch, codes in sorted(set(re.findall(r"-gencode=arch=(compute_\w+),code=\[?([\w,]+)\]?", ninja_text))):
        for code in codes.split(","):
            kind = "SASS" if code.startswith("sm_") else "PTX"
            out.append(f"{kind} {code}")
    return sorted(set(out))


@dataclasses.dataclass(frozen=True)
class Step:
    """A process ninja started for a step: ``exited`` (a zombie ninja has not reaped: ninja reaps a
    step only at EOF on its output, which a leftover child of the step can hold open for ever)."""

    pid: int
    command: str
    exited: bool


def steps(pid: int) -> list[Step]:
    """The direct children of ``pid`` (Linux /proc; empty elsewhere) that are steps: ``command`` is the one
    ninja runs as ``/bin/sh -c COMMAND`` (empty once exited); a child not yet exec'd is not listed."""
    out = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return out
    for name in filter(str.isdigit, names):
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().decode(errors="replace").rsplit(")", 1)[1].split()
            if int(fields[1]) != pid:
                continue
            with open(f"/proc/{name}/cmdline", "rb") as f:
                argv = f.read().decode(errors="replace").split("\0")
        except (OSError, ValueError, IndexError):
            continue
        exited = fields[0] in ("Z", "X")
        if len(argv) > 2 and argv[1] == "-c":
            command = argv[2]
        elif exited:
            command = ""
        else:  # forked by ninja, not yet /bin/sh -c: its argv is still ninja's own
            continue
        out.append(Step(int(name), command, exited))
    return out


def step_name(command: str) -> str:
    """``sampling.cu`` for a compile step, ``link x.so`` for a link, else the command's start."""
    m = _SRC_RE.search(command)
    if m:
        return os.path.basename(m.group(1))
    so = re.search(r"-o (\S+\.so)\b", command)
    return f"link {os.path.basename(so.group(1))}" if so else command[:60]
