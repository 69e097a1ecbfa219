"""Helpers for the patch-layer tests: fake toolkits whose nvcc logs its arguments."""

from __future__ import annotations

import json
from pathlib import Path

from helpers.toolkits import compiled, make_toolkit

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
    # the targets this release cannot build, decided here (the fake compares no versions at run time)
    refuse = [k for k, v in sorted(_MIN.items(), key=lambda kv: -len(kv[0]))
              if tuple(int(x) for x in v.split(".")) > have]
    c_source = (r"""
#include <stdio.h>
#include <string.h>
static const char *refuse[] = {%s 0};
int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) if (strstr(argv[i], "--version")) {
        puts("nvcc: NVIDIA (R) Cuda compiler driver");
        puts("Cuda compilation tools, release %s, V%s");
        return 0;
    }
    FILE *f = fopen(%s, "a");
    if (f) { for (int i = 1; i < argc; i++) fprintf(f, i > 1 ? " %%s" : "%%s", argv[i]); fputc('\n', f); fclose(f); }
    for (int i = 1; i < argc; i++) for (const char **k = refuse; *k; k++) {
        char want[64];
        snprintf(want, sizeof want, "compute_%%s", *k);
        const char *at = strstr(argv[i], want);
        for (; at; at = strstr(at + 1, want)) {
            char end = at[strlen(want)];
            if (end == ',' || end == 0) {
                fprintf(stderr, "nvcc fatal   : Unsupported gpu architecture in '%%s'\n", argv[i]);
                return 1;
            }
        }
    }
    return 1;
}
""" % ("".join(json.dumps(k) + ", " for k in refuse), mm, version, json.dumps(str(log))))
    root = make_toolkit(root, version)
    compiled(root / "bin" / "nvcc", c_source)
    return root
