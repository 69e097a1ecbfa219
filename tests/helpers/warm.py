"""Builds with fake compilers: a JIT cache warmed by FlashInfer's own build (the ``warmed`` fixture in
tests/conftest.py; every compile and link is :data:`FAKE_CC`) and a pool job of fake steps
(:func:`fake_job`)."""

from __future__ import annotations

from pathlib import Path

from helpers.toolkits import compiled

#: A fake nvcc launcher and host compiler (C, see ``helpers.toolkits.compiled``): logs its arguments to
#: ``$FAKE_CC_LOG`` and writes the ``-o`` file (and the ``-MF`` depfile).
FAKE_CC = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int main(int argc, char **argv) {
    const char *log = getenv("FAKE_CC_LOG"), *out = 0, *dep = 0, *src = "";
    FILE *f = log ? fopen(log, "a") : 0;
    if (f) { for (int i = 1; i < argc; i++) fprintf(f, i > 1 ? " %s" : "%s", argv[i]); fputc('\n', f); fclose(f); }
    for (int i = 1; i + 1 < argc; i++) {
        if (!strcmp(argv[i], "-o")) out = argv[++i];
        else if (!strcmp(argv[i], "-MF")) dep = argv[++i];
        else if (!strcmp(argv[i], "-c")) src = argv[++i];
    }
    if (out && (f = fopen(out, "w"))) { fprintf(f, "object of %s\n", src); fclose(f); }
    if (out && dep && (f = fopen(dep, "w"))) { fprintf(f, "%s: %s\n", out, src); fclose(f); }
    return 0;
}
"""

#: Records two modules (silu activation, one decode) into ``FLASHINFER_SM120_RECORD`` without building.
RECORD = """
import json, helpers.fakegpu, flashinfer_sm120, torch
from flashinfer.jit.core import MissingJITCacheError
from flashinfer.activation import get_act_and_mul_module
from flashinfer.decode import get_batch_decode_module
for call in (lambda: get_act_and_mul_module("silu"),
             lambda: get_batch_decode_module(torch.float16, torch.float16, torch.float16, torch.int32,
                                             64, 64, 0, False, False)):
    try:
        call()
    except MissingJITCacheError:
        pass
print("@@{}")
"""

#: Loads the activation module through FlashInfer's own build_and_load; prints ``{"err": ...}``.
LOAD_AGAIN = """
import json, helpers.fakegpu, flashinfer_sm120, torch
from flashinfer.activation import get_act_and_mul_module
try:
    get_act_and_mul_module("silu")   # FlashInfer's own build_and_load: ninja, then load
except Exception as e:
    err = repr(e)
print("@@" + json.dumps({"err": err}))
"""


def fake_compiler_env(env: dict, tmp_path: Path) -> tuple[dict, Path]:
    """``env`` with :data:`FAKE_CC` as nvcc launcher and host compiler and no GPU; returns it and
    the compiler's log."""
    cc = compiled(tmp_path / "fakecc", FAKE_CC)
    log = tmp_path / "cc.log"
    return dict(env, FLASHINFER_NVCC_LAUNCHER=str(cc), CXX=str(cc), FAKE_CC_LOG=str(log), FAKE_GPU_CAPS=""), log


def fake_job(root, name, n_src=2, fail=None, sleep=0.3, hold=None, after=""):
    """A :class:`pool.Job` ``name`` under ``root``: ``n_src`` compile steps of ``sleep`` seconds each (the
    one of source ``fail`` fails), then a link.  Every step appends to ``root/order.log``: a compile step
    ``start SRC`` as it begins and ``end SRC`` just before it exits (so the log's order is a record of
    which steps ran at once), a link ``link OUT``.  ``hold=(src, regex)``: the step compiling ``src``
    also waits (up to 120 s) until a whole line of the log matches ``regex`` (grep -x; no ``$``: ninja's escape): a readiness signal, not a race.
    ``after``: shell text appended to each compile step's command (``; ...`` or ``&& ...``)."""
    from flashinfer_sm120.warmup import pool

    d = root / name
    d.mkdir(parents=True)
    for i in range(n_src):
        (d / f"s{i}.cu").write_text("// src\n")
    nvcc = root / "fake_nvcc.sh"
    if not nvcc.exists():  # argv like nvcc's: ... -c SRC -o OBJ
        nvcc.write_text('log="$(dirname "$0")/order.log"; echo "start $2" >> "$log"; sleep "$SLEEP"; src="$2"; '
                        'if [ "$src" = "$HOLD" ]; then i=0; until grep -qx -- "$UNTIL" "$log" || [ $i -ge 1200 ]; do '
                        'sleep 0.1; i=$((i+1)); done; fi; echo "end $2" >> "$log"; if [ "$src" = "$FAIL" ]; then '
                        'echo "$src(3): error: identifier boom is undefined"; exit 2; fi; cp "$2" "$4"\n')
        (root / "fake_link.sh").write_text('echo "link $3" >> "$(dirname "$0")/order.log"; '
                                           'out="$3"; shift 3; cat "$@" > "$out"\n')
    held, until = hold or ("", "")
    lines = ["ninja_required_version = 1.3", "rule cuda_compile",
             f"  command = SLEEP={sleep} FAIL={d}/{fail} HOLD='{d}/{held}' UNTIL='{until}' sh {nvcc} -c $in -o $out{after}",
             "rule link", f"  command = sh {root}/fake_link.sh -shared -o $out $in", ""]
    objs = []
    for i in range(n_src):
        obj = d / f"s{i}.cuda.o"
        objs.append(str(obj))
        lines.append(f"build {obj}: cuda_compile {d}/s{i}.cu")
    lines.append(f"build {d}/{name}.so: link {' '.join(objs)}")
    lines.append(f"default {d}/{name}.so")
    (d / "build.ninja").write_text("\n".join(lines) + "\n")
    return pool.Job(name, d, d / "build.ninja", root / f"{name}.lock")


def most_at_once(log_lines: list[str]) -> int:
    """The most compile steps that ran at once, from :func:`fake_job`'s log: a step writes ``start``
    after its slot was taken and ``end`` before it exits (before its slot can be freed), so each
    [start, end] lies inside the time the step held its slot, whatever the machine's load."""
    now = most = 0
    for line in log_lines:
        if line.startswith("start "):
            now += 1
            most = max(most, now)
        elif line.startswith("end "):
            now -= 1
    return most
