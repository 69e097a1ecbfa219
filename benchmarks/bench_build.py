"""Warm-up build wall time: N modules in one pool vs one after the other vs the ideal, and
where the pool's time goes.

    python benchmarks/bench_build.py [--modules activation:silu rope page] [--arch 12.0] [-j N]
    python benchmarks/bench_build.py --synthetic [--n 4] [--compile-s 2] [--link-s 0.3] [-j 2]

Real mode: both runs compile from scratch (separate empty FlashInfer workspaces) with the
same ``-j`` in the same session; rounds alternate the order.  Wall times are those of the
job pool inside ``build`` (``pool_wall_s``), so Python and FlashInfer start-up count in
neither.  Two ideals:

* ``cpu ideal``: the compile CPU time (child CPU of the sequential builds less that of an
  up-to-date re-run) divided by ``-j``.  Not reachable when the steps are fewer than the
  slots allow to pack evenly: three one-step modules on two slots need two rounds
  (pool/cpu-ideal >= 1.33 for any scheduler);
* ``schedule bound``: a lower bound on any schedule of the steps as measured in the pooled
  run (their durations read from each module's ``.ninja_log``): the classic bounds for
  independent compiles on ``-j`` slots (sum/j, the largest, the j-th plus the (j+1)-th
  largest) plus the shortest link, which must follow the last compile.  ``pool/bound``
  is then the pool's own overhead.

Where the time goes, from the pooled run: ninja start-up (first step's start in its
``.ninja_log``: ms after that ninja began), hand-over (from the pool noticing a finished
step to starting the next module's ninja), link steps, and slot-seconds left idle while a
compile was ready.

Synthetic mode: fake steps that sleep (no compiler, no CPU), so the pool's overhead shows
whatever else the machine does: ``--n`` modules of ``--steps`` compiles of ``--compile-s``
and a link of ``--link-s``, on ``-j`` slots; the ideal is exact
(``ceil(n*steps/j) * compile_s + link_s``).  Prints a JSON line and a table.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


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


def _ninja_log(build_dir: Path) -> list[tuple[float, float, str]]:
    """``(start s, end s, output)`` per step from ``.ninja_log`` (v5 and v6/v7 share the first
    fields: start and end in ms since that ninja began, then mtime and the output)."""
    out = []
    try:
        lines = (build_dir / ".ninja_log").read_text().splitlines()
    except OSError:
        return out
    for line in lines[1:]:
        f = line.split("\t")
        if len(f) >= 4 and f[0].isdigit() and f[1].isdigit():
            out.append((int(f[0]) / 1000, int(f[1]) / 1000, f[3]))
    return out


def schedule_bound(compiles: list[float], links: list[float], jobs: int) -> float:
    """Lower bound on the makespan of independent compiles on ``jobs`` slots followed by a link."""
    p = sorted(compiles, reverse=True)
    lb = max(sum(p) / jobs, p[0] if p else 0.0, (p[jobs - 1] + p[jobs]) if len(p) > jobs else 0.0)
    return lb + (min(links) if links else 0.0)


def ninja_starts(build_dirs: dict[str, Path]) -> dict[str, float]:
    """When each module's ninja began, in seconds after the first one: its ``.ninja_log`` was last
    written as its last step ended (the pool keeps no timeline of its own)."""
    abs_t0 = {}
    for label, d in build_dirs.items():
        log = _ninja_log(d)
        if log:
            abs_t0[label] = (d / ".ninja_log").stat().st_mtime - max(e for _, e, _ in log)
    first = min(abs_t0.values(), default=0.0)
    return {label: t - first for label, t in abs_t0.items()}


def occupancy(build_dirs: list[Path], jobs: int, wall: float) -> float | None:
    """Step-seconds run / (slots x wall), from the ``.ninja_log`` files: how well the pool kept its
    slots busy."""
    busy = sum(e - s for d in build_dirs for s, e, _ in _ninja_log(d))
    return round(min(1.0, busy / (jobs * wall)), 3) if wall > 0 else None


def where_time_goes(rep: dict, jobs: int) -> dict:
    """From the pooled run's ``.ninja_log`` files (each module's ninja start/end)."""
    steps, startup, link_s = [], {}, 0.0
    starts = ninja_starts({m["module"]: Path(m["library"]).parent for m in rep["modules"]})
    for m in rep["modules"]:
        t0 = starts.get(m["module"], 0.0)
        log = _ninja_log(Path(m["library"]).parent)
        if log:
            startup[m["module"]] = round(min(s for s, _, _ in log), 3)
        for s, e, outp in log:
            kind = "link" if outp.endswith(".so") else "compile"
            steps.append((t0 + s, t0 + e, kind))
            link_s += (e - s) if kind == "link" else 0.0
    compiles = [e - s for s, e, k in steps if k == "compile"]
    links = [e - s for s, e, k in steps if k == "link"]
    # slot-seconds idle while some compile had not started yet (every compile is ready from t=0)
    idle, t_end = 0.0, max((e for _, e, _ in steps), default=0.0)
    edges = sorted({0.0, t_end, *[s for s, _, _ in steps], *[e for _, e, _ in steps]})
    for a, b in zip(edges, edges[1:]):
        mid = (a + b) / 2
        running = sum(1 for s, e, k in steps if s <= mid < e and k == "compile")
        waiting = sum(1 for s, _, k in steps if k == "compile" and s > mid)
        idle += min(max(0, jobs - running), waiting) * (b - a)
    return {"ninja_startup_s": startup, "link_s": round(link_s, 2), "idle_ready_slot_s": round(idle, 2),
            "schedule_bound_s": round(schedule_bound(compiles, links, jobs), 2),
            "steps": len(steps), "compile_s": [round(c, 2) for c in compiles]}


def _pooled(mods, arch, jobs) -> tuple[float, float, dict]:
    with tempfile.TemporaryDirectory() as ws:
        wall, _, rep = _build(mods, arch, jobs, ws)
        assert all(r["status"] == "built" for r in rep["modules"]), rep
        detail = where_time_goes(rep, jobs)
        occ = occupancy([Path(m["library"]).parent for m in rep["modules"]], jobs, wall)
    return wall, occ, detail


def real(args) -> None:
    rounds = []
    for n in range(args.rounds):
        load0 = os.getloadavg()[0]
        if n % 2 == 0:
            seq_wall, cpu = _sequential(args.modules, args.arch, args.jobs)
            pool_wall, occ, detail = _pooled(args.modules, args.arch, args.jobs)
        else:
            pool_wall, occ, detail = _pooled(args.modules, args.arch, args.jobs)
            seq_wall, cpu = _sequential(args.modules, args.arch, args.jobs)
        ideal = sum(cpu.values()) / args.jobs
        bound = detail["schedule_bound_s"]
        rounds.append({"compile_cpu_s": {k: round(v, 1) for k, v in cpu.items()}, "ideal_s": round(ideal, 1),
                       "sequential_wall_s": round(seq_wall, 1), "pool_wall_s": round(pool_wall, 1),
                       "pool_vs_ideal": round(pool_wall / ideal, 3), "sequential_vs_ideal": round(seq_wall / ideal, 3),
                       "pool_vs_sequential": round(pool_wall / seq_wall, 3), "pool_occupancy": occ,
                       "pool_vs_schedule_bound": round(pool_wall / bound, 3) if bound else None,
                       "where": detail, "loadavg_1m": [round(load0, 2), round(os.getloadavg()[0], 2)]})
    print(json.dumps({"modules": args.modules, "jobs": args.jobs, "arch": args.arch, "rounds": rounds}))
    print(f"{'round':<6}{'ideal s':>9}{'bound s':>9}{'seq s':>9}{'pool s':>9}{'pool/ideal':>12}{'pool/bound':>12}"
          f"{'pool/seq':>10}{'occupancy':>11}{'load 1m':>14}")
    for i, r in enumerate(rounds, 1):
        print(f"{i:<6}{r['ideal_s']:>9}{r['where']['schedule_bound_s']:>9}{r['sequential_wall_s']:>9}"
              f"{r['pool_wall_s']:>9}{r['pool_vs_ideal']:>12}{str(r['pool_vs_schedule_bound']):>12}"
              f"{r['pool_vs_sequential']:>10}{str(r['pool_occupancy']):>11}{str(r['loadavg_1m']):>14}")
        w = r["where"]
        print(f"      ninja start-up (ms to its first step): {w['ninja_startup_s']}; links {w['link_s']} s; "
              f"idle slot-s while a compile was ready: {w['idle_ready_slot_s']}")


def synthetic(args) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
    from flashinfer_sm120.warmup import pool

    out = []
    for r in range(args.rounds):
        with tempfile.TemporaryDirectory() as tmp:
            jobs_list = []
            for i in range(args.n):
                d = Path(tmp) / f"m{i}"
                d.mkdir()
                # command lines shaped like FlashInfer's (``-c SRC -o OBJ``, ``-shared ... -o X.so``),
                # which is how the pool tells a compile from a link
                lines = ["ninja_required_version = 1.3", "rule cc",
                         f"  command = sleep {args.compile_s} && touch $out && true -c $in -o $out",
                         "rule link", f"  command = sleep {args.link_s} && touch $out && true -shared $in -o $out", ""]
                objs = []
                for k in range(args.steps):
                    (d / f"s{k}.cu").write_text("//\n")
                    lines.append(f"build {d}/s{k}.o: cc {d}/s{k}.cu")
                    objs.append(f"{d}/s{k}.o")
                lines += [f"build {d}/m{i}.so: link {' '.join(objs)}", f"default {d}/m{i}.so", ""]
                (d / "build.ninja").write_text("\n".join(lines))
                jobs_list.append(pool.Job(f"m{i}", d, d / "build.ninja"))
            t0 = time.monotonic()
            res = pool.run_pool(jobs_list, args.jobs, io.StringIO())
            total = time.monotonic() - t0
            assert all(x.status == "built" for x in res), res
            ideal = math.ceil(args.n * args.steps / args.jobs) * args.compile_s + args.link_s
            startup = [min(s for s, _, _ in _ninja_log(j.build_dir)) for j in jobs_list]
            starts = ninja_starts({j.label: j.build_dir for j in jobs_list})
            wall = max(starts[j.label] + max(e for _, e, _ in _ninja_log(j.build_dir)) for j in jobs_list)
            out.append({"pool_wall_s": round(wall, 2), "with_dry_runs_s": round(total, 2), "ideal_s": round(ideal, 2),
                        "pool_vs_ideal": round(wall / ideal, 3), "ninja_starts_s": {k: round(v, 3) for k, v in starts.items()},
                        "ninja_startup_ms": [round(s * 1000) for s in startup]})
    print(json.dumps({"synthetic": vars(args), "rounds": out}))
    for i, r in enumerate(out, 1):
        print(f"round {i}: pool {r['pool_wall_s']} s (with the up-to-date checks {r['with_dry_runs_s']} s), ideal "
              f"{r['ideal_s']} s, pool/ideal {r['pool_vs_ideal']}; ninjas started at {r['ninja_starts_s']} s; "
              f"ninja start-up {r['ninja_startup_ms']} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--modules", nargs="+",
                    default=["activation:silu", "activation:gelu", "activation:gelu_tanh"],
                    help="NAME or activation:ACT, e.g. rope page activation:silu")
    ap.add_argument("--arch", default="12.0")
    ap.add_argument("-j", "--jobs", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--rounds", type=int, default=2, help="paired rounds, order alternating (default 2)")
    ap.add_argument("--synthetic", action="store_true", help="sleeping fake steps: the pool's own overhead")
    ap.add_argument("--n", type=int, default=4, help="synthetic: modules")
    ap.add_argument("--steps", type=int, default=1, help="synthetic: compile steps per module")
    ap.add_argument("--compile-s", type=float, default=2.0, help="synthetic: seconds per compile step")
    ap.add_argument("--link-s", type=float, default=0.3, help="synthetic: seconds per link step")
    args = ap.parse_args()
    synthetic(args) if args.synthetic else real(args)


if __name__ == "__main__":
    main()
