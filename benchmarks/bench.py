"""Speed of flashinfer-sm120, as ratios against the unpatched path in the same run.

1. Resolution: the first ``flashinfer_sm120.resolve()`` in a fresh process (find
   GPUs, list every toolkit, read versions from files, trust checks, the choice,
   the CUDA_HOME view check) against FlashInfer's own first ``get_cuda_path()`` +
   ``get_cuda_version()`` (``which nvcc`` and ``nvcc --version`` subprocesses) in
   the same process.  Goal: ratio <= 0.10.
2. Import overhead: time to ``import flashinfer_sm120, flashinfer`` against
   ``import flashinfer`` (which includes the patching, done in the import hooks),
   each in a fresh process, interleaved runs, medians.  Goal: ratio <= 1.02.

Usage: ``python benchmarks/bench.py [--runs N] [--imports M] [--json out.json]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys


_FIRST_CALL = r"""
import json, os, sys, time
os.environ["FLASHINFER_SM120_DISABLE"] = "1"  # keep FlashInfer's own functions
import flashinfer.jit.cpp_ext as cx
import flashinfer_sm120
r = {}
def ours():
    t = time.perf_counter(); flashinfer_sm120.resolve(); r["ours"] = time.perf_counter() - t
def theirs():
    t = time.perf_counter(); cx.get_cuda_path(); cx.get_cuda_version(); r["theirs"] = time.perf_counter() - t
for f in ((ours, theirs) if sys.argv[1] == "ours-first" else (theirs, ours)):
    f()
print(json.dumps(r))
"""


def bench_resolution(runs: int) -> dict:
    """First call in a fresh process (what every worker pays), alternating order."""
    env = {k: v for k, v in os.environ.items() if k != "FLASHINFER_SM120_DISABLE"}
    ours, theirs = [], []
    for i in range(runs):
        order = "ours-first" if i % 2 == 0 else "theirs-first"
        out = subprocess.run([sys.executable, "-c", _FIRST_CALL, order], env=env, check=True,
                             capture_output=True, text=True).stdout
        r = json.loads(out.strip().splitlines()[-1])
        ours.append(r["ours"])
        theirs.append(r["theirs"])
    o, f = statistics.median(ours), statistics.median(theirs)
    return {"ours_ms": o * 1e3, "flashinfer_ms": f * 1e3, "ratio": o / f, "goal": 0.10, "runs": runs}


_IMPORT = r"""
import sys, time
t = time.perf_counter()
if sys.argv[1] == "shim":
    import flashinfer_sm120
import flashinfer
print(time.perf_counter() - t)
"""


def bench_import(runs: int) -> dict:
    """Seconds from the first import to ``import flashinfer`` done, measured inside
    fresh processes (interpreter start-up excluded), interleaved, medians."""
    env = {k: v for k, v in os.environ.items() if k != "FLASHINFER_SM120_DISABLE"}
    env["FLASHINFER_SM120_QUIET"] = "1"
    times: dict[str, list[float]] = {"plain": [], "shim": []}

    def once(name: str) -> float:
        out = subprocess.run([sys.executable, "-c", _IMPORT, name], env=env, check=True,
                             capture_output=True, text=True).stdout
        return float(out.strip().splitlines()[-1])

    once("plain"), once("shim")  # warm the page cache and the CUDA_HOME view
    for i in range(runs):
        for name in (("plain", "shim") if i % 2 == 0 else ("shim", "plain")):
            times[name].append(once(name))
    p, s = statistics.median(times["plain"]), statistics.median(times["shim"])
    return {"plain_s": p, "shim_s": s, "ratio": s / p, "goal": 1.02, "runs": runs}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--imports", type=int, default=11)
    ap.add_argument("--json")
    a = ap.parse_args()
    imp = bench_import(a.imports)
    res = bench_resolution(a.runs)
    print(f"resolution (first call per process): ours {res['ours_ms']:.2f} ms vs FlashInfer "
          f"get_cuda_path+get_cuda_version "
          f"{res['flashinfer_ms']:.2f} ms -> ratio {res['ratio']:.3f} (goal <= {res['goal']})")
    print(f"import: shim {imp['shim_s']:.3f} s vs plain {imp['plain_s']:.3f} s -> ratio "
          f"{imp['ratio']:.3f} (goal <= {imp['goal']})")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"resolution": res, "import": imp}, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
