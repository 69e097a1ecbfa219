"""Warm-up build wall time: N modules in one pool vs one after the other vs the ideal.

    python benchmarks/bench_build.py [--modules activation:silu rope page] [--arch 12.0] [-j N]

Both runs compile from scratch (separate empty FlashInfer workspaces) with the same
``-j`` in the same session.  Wall times are those of the job pool inside ``build``
(``pool_wall_s`` in its JSON: from the up-to-date check to the last link), so Python
and FlashInfer start-up (once per ``build`` process) count in neither.

The ideal is the compile CPU time of the modules (each
measured in the sequential run as child CPU of the build minus that of an up-to-date
re-run, i.e. without Python start-up) divided by the cores used.  Goal: pooled wall
time <= 1.1x the ideal.  Rounds alternate the order (sequential first, then pool first) so
that each pair sees a similar machine; ``pool_occupancy`` (the share of slot-seconds the
pool kept busy, from ``build --json``) says how well the pool itself did even when other
work on the machine stretches both wall times.  Needs a CUDA 13 nvcc (the pip one or /usr/local/cuda-13.x);
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


def _sequential(mods, arch, jobs) -> tuple[float, dict]:
    wall_sum, cpu = 0.0, {}
    with tempfile.TemporaryDirectory() as ws:
        for m in mods:  # one after the other, each a fresh build
            wall, c, _ = _build([m], arch, jobs, ws)
            _, noop, rep = _build([m], arch, jobs, ws)  # the same, up to date: start-up CPU only
            assert rep["modules"][0]["status"] == "up to date", rep
            wall_sum += wall
            cpu[m] = c - noop
    return wall_sum, cpu


def _pooled(mods, arch, jobs) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as ws:
        wall, _, rep = _build(mods, arch, jobs, ws)
    assert all(r["status"] == "built" for r in rep["modules"]), rep
    return wall, rep["pool_occupancy"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--modules", nargs="+", default=["activation:silu", "activation:gelu", "activation:gelu_tanh"],
                    help="NAME or activation:ACT, e.g. rope page activation:silu")
    ap.add_argument("--arch", default="12.0")
    ap.add_argument("-j", "--jobs", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--rounds", type=int, default=2, help="paired rounds, order alternating (default 2)")
    args = ap.parse_args()
    rounds = []
    for n in range(args.rounds):
        load0 = os.getloadavg()[0]
        if n % 2 == 0:
            seq_wall, cpu = _sequential(args.modules, args.arch, args.jobs)
            pool_wall, occ = _pooled(args.modules, args.arch, args.jobs)
        else:
            pool_wall, occ = _pooled(args.modules, args.arch, args.jobs)
            seq_wall, cpu = _sequential(args.modules, args.arch, args.jobs)
        ideal = sum(cpu.values()) / args.jobs
        rounds.append({"compile_cpu_s": {k: round(v, 1) for k, v in cpu.items()}, "ideal_s": round(ideal, 1),
                       "sequential_wall_s": round(seq_wall, 1), "pool_wall_s": round(pool_wall, 1),
                       "pool_vs_ideal": round(pool_wall / ideal, 3), "sequential_vs_ideal": round(seq_wall / ideal, 3),
                       "pool_vs_sequential": round(pool_wall / seq_wall, 3), "pool_occupancy": occ,
                       "loadavg_1m": [round(load0, 2), round(os.getloadavg()[0], 2)]})
    print(json.dumps({"modules": args.modules, "jobs": args.jobs, "arch": args.arch, "rounds": rounds}))
    print(f"{'round':<6}{'ideal s':>9}{'seq s':>9}{'pool s':>9}{'pool/ideal':>12}{'seq/ideal':>11}"
          f"{'pool/seq':>10}{'occupancy':>11}{'load 1m':>14}")
    for i, r in enumerate(rounds, 1):
        print(f"{i:<6}{r['ideal_s']:>9}{r['sequential_wall_s']:>9}{r['pool_wall_s']:>9}{r['pool_vs_ideal']:>12}"
              f"{r['sequential_vs_ideal']:>11}{r['pool_vs_sequential']:>10}{str(r['pool_occupancy']):>11}"
              f"{str(r['loadavg_1m']):>14}")


if __name__ == "__main__":
    main()
