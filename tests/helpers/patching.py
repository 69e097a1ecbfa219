"""Helpers for the patch-layer tests: fake toolkits whose nvcc logs its arguments."""

from __future__ import annotations

from pathlib import Path

from helpers.toolkits import make_toolkit

#: Oldest nvcc release that accepts each sm_ number (a subset of arch.MIN_NVCC,
#: written out again so the fake does not trust the code under test).
_MIN = {"75": "10.0", "80": "11.0", "86": "11.1", "89": "11.8", "90": "11.8", "90a": "12.0",
        "100a": "12.8", "120a": "12.8", "120f": "12.9", "121a": "12.9", "110a": "13.0", "120": "12.8",
        "121": "12.9", "100": "12.8"}


def logging_toolkit(root: Path, version: str, log: Path) -> Path:
    """A fake toolkit whose ``bin/nvcc`` answers ``--version`` like ``version``,
    appends every other command line to ``log``, and exits 1 naming each
    ``compute_XX`` target its release cannot build (as a real nvcc would:
    "Unsupported gpu architecture")."""
    mm = ".".join(version.split(".")[:2])
    have = tuple(int(x) for x in mm.split("."))
    # a case arm per target this release cannot build (decided here: the wrapper grammar of
    # issue 11 allows no command substitution, so the fake compares no versions at run time)
    refuse = [k for k, v in sorted(_MIN.items(), key=lambda kv: -len(kv[0]))
              if tuple(int(x) for x in v.split(".")) > have]
    cases = "".join(f'    *compute_{k},*|*compute_{k})\n'
                    f'      echo "nvcc fatal   : Unsupported gpu architecture in \'$a\'" >&2; exit 1 ;;\n'
                    for k in refuse)
    script = (
        "#!/bin/sh\n"
        'case "$*" in *--version*)\n'
        '  echo "nvcc: NVIDIA (R) Cuda compiler driver"\n'
        f'  echo "Cuda compilation tools, release {mm}, V{version}"\n'
        "  exit 0 ;;\n"
        "esac\n"
        f'echo "$*" >> "{log}"\n'
        'for a in "$@"; do\n'
        '  case "$a" in\n' + cases + "  esac\n"
        "done\n"
        "exit 1\n")
    return make_toolkit(root, version, nvcc_script=script)
