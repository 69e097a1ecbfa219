"""Warm-up build wall time: N modules in one pool vs one after the other vs the ideal.

    python benchmarks/bench_build.py [--modules activation:silu rope page] [--arch 12.0] [-j N]

Both runs compile from scratch (separate empty FlashInfer workspaces) with the same
``-j`` in the same session.  Wall times are those of the job pool inside ``build``
(``pool_wall_s`` in its JSON: from the up-to-date check to the last link), so Python
and FlashInfer start-up (once per ``build`` process) count in neither.

The ideal is the compile CPU time of the modules (each
measured in the sequential run as child CPU of the build minus that of an up-to-date
re-run, i.e. without Python start-up) divided by the cores used.  Goal: pooled wall
time <= 1.1x the ideal.  Needs a CUDA 13 nvcc (the pip one or /usr/local/cuda-13.x);
no GPU.  Prints a JSON line and a table.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time


def _child_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _build(mods: list[str], arch: str, jobs: int, ws: str) -> tuple[float, float, dict]:
    """Run one ``build``; returns (wall s of the pool inside it, child CPU s, report)."""
    env = dict(os.environ, FLASHINFER_WORKSPACE_BASE=ws, FLASHINFER_SM120_QUIET="1")
    env.pop("FLASHINFER_CUDA_ARCH_LIST", None)
    cpu0 = _child_cpu()
    names, acts = [], []
    for m in mods:  # NAME or NAME:ACT (activation variants)
        name, _, act = m.partition(":")
        names += [name] if name not in names else []
        acts += [act] if act else []
    args = names + (["--act", ",".join(acts)] if acts else [])
    proc = subprocess.run([sys.executable, "-m", "flashinfer_sm120", "build", "--arch", arch, "-j", str(jobs),
                           "--json", *args], env=env, capture_output=True, text=True)
    cpu = _child_cpu() - cpu0
    if proc.returncode != 0:
        sys.exit(f"build {mods} failed:\n{proc.stderr[-4000:]}")
    rep = json.loads(proc.stdout)
    return rep["pool_wall_s"], cpu, rep


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--modules", nargs="+", default=["activation:silu", "activation:gelu", "activation:gelu_tanh"],
                    help="NAME or activation:ACT, e.g. rope page activation:silu")
    ap.add_argument("--arch", default="12.0")
    ap.add_argument("-j", "--jobs", type=int, default=len(os.sched_getaffinity(0)))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as seq_ws, tempfile.TemporaryDirectory() as pool_ws:
        seq_wall, compile_cpu = 0.0, {}
        for m in args.modules:  # one after the other, each a fresh build
            wall, cpu, _ = _build([m], args.arch, args.jobs, seq_ws)
            _, noop_cpu, rep = _build([m], args.arch, args.jobs, seq_ws)
            assert rep["modules"][0]["status"] == "up to date", rep
            seq_wall += wall
            compile_cpu[m] = cpu - noop_cpu
        pool_wall, pool_cpu, rep = _build(args.modules, args.arch, args.jobs, pool_ws)
        assert all(r["status"] == "built" for r in rep["modules"]), rep
    ideal = sum(compile_cpu.values()) / args.jobs
    out = {"modules": args.modules, "jobs": args.jobs, "arch": args.arch,
           "compile_cpu_s": {k: round(v, 1) for k, v in compile_cpu.items()},
           "ideal_s": round(ideal, 1), "sequential_wall_s": round(seq_wall, 1),
           "pool_wall_s": round(pool_wall, 1),
           "pool_vs_ideal": round(pool_wall / ideal, 3), "sequential_vs_ideal": round(seq_wall / ideal, 3),
           "loadavg_1m": os.getloadavg()[0]}
    print(json.dumps(out))
    print(f"{'run':<28}{'wall s':>10}{'x ideal':>10}")
    print(f"{'ideal (CPU s / cores)':<28}{ideal:>10.1f}{1.0:>10.2f}")
    print(f"{'one after the other':<28}{seq_wall:>10.1f}{seq_wall / ideal:>10.2f}")
    print(f"{'one pool':<28}{pool_wall:>10.1f}{pool_wall / ideal:>10.2f}")


if __name__ == "__main__":
    main()
