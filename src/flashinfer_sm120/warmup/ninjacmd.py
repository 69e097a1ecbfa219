"""One module's ninja as FlashInfer runs it: its binary, command line and environment, a dry run,
what its ``-gencode`` flags put in the binary, and the steps it runs (``/proc``).  A *job* is
anything with ``label``, ``build_dir`` and ``ninja_path`` (:class:`.pool.Job`)."""

from __future__ import annotations

import dataclasses
import os
import re

#: A ninja status line under ``NINJA_STATUS="[%f/%t] "``: finished, total, the step.  At most 9 ASCII
#: digits: ninja passes the compilers' output through, and ``int()`` refuses over 4300 digits.
STATUS_RE = re.compile(r"^\[([0-9]{1,9})/([0-9]{1,9})\] (.*)$")
_SRC_RE = re.compile(r" -c (\S+)")
_DRY_RUN_MAX = 16 << 20  # ninja -n of a FlashInfer module: a few KB per step


def ninja_binary() -> str:
    """The ninja the server will run (another release's ``.ninja_log`` would make it rebuild); :raises
    NinjaError: none usable."""
    from flashinfer_sm120.core.toolkit import ninja

    return ninja.choose().path


def command(job, *extra: str) -> list[str]:
    return [ninja_binary(), "-C", str(job.build_dir.resolve()), "-f", str(job.ninja_path.resolve()), *extra]


def ninja_env() -> dict:
    """The environment with ninja's status format and a private temporary directory (P5)."""
    from flashinfer_sm120.safety.fs.atomic import build_env

    return build_env(dict(os.environ, NINJA_STATUS="[%f/%t] "))


def dry_run(job) -> list[str]:
    """Commands ``ninja -n`` says it would run for ``job`` (empty: up to date); :raises NinjaError."""
    from flashinfer_sm120.safety import proc
    from flashinfer_sm120.core.toolkit.ninja import NinjaError

    res = proc.run(command(job, "-n"), timeout=120, max_output=_DRY_RUN_MAX, env=ninja_env())
    if not res.ok:
        why = ("timed out" if res.timed_out else f"printed more than {_DRY_RUN_MAX} bytes" if res.truncated
               else res.error or f"exit {res.returncode}")
        raise NinjaError(f"ninja -n failed for {job.label} ({why}): {res.text()[-2000:]}")
    return [m.group(3) for m in map(STATUS_RE.match, res.text().splitlines()) if m]


def gencode_summary(ninja_text: str) -> list[str]:
    """What the binary holds per ``-gencode``: ``SASS sm_120f`` for ``code=sm_*``, ``PTX compute_120f``
    for ``code=compute_*`` (nvcc documentation, "--generate-code")."""
    out = []
    for arch, codes in sorted(set(re.findall(r"-gencode=arch=(compute_\w+),code=\[?([\w,]+)\]?", ninja_text))):
        for code in codes.split(","):
            kind = "SASS" if code.startswith("sm_") else "PTX"
            out.append(f"{kind} {code}")
    return sorted(set(out))


@dataclasses.dataclass(frozen=True)
class Step:
    """A step's process; ``exited``: a zombie (ninja reaps only at EOF, which a leftover child can hold off)."""

    pid: int
    command: str
    exited: bool


def steps(pid: int) -> list[Step]:
    """Children of ``pid`` running ``/bin/sh -c COMMAND`` (or exited), from Linux ``/proc``."""
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
