"""Every Ray worker patched by flashinfer-sm120, and a check that it is.

Two layers, either is enough:

* the ``.pth`` autoload (``flashinfer-sm120 enable`` in the cluster's Python
  environment) patches any worker that imports flashinfer, vllm or sglang;
* the job's ``runtime_env`` below adds a ``worker_process_setup_hook`` that does
  the same in every worker of the job at its start (for clusters where the
  ``.pth`` is not installed), and the cache directories as ``env_vars`` (Ray
  workers often run as a user whose HOME is not writable or not shared).

Run on a Ray cluster: ``python examples/ray_workers.py [--workers N] [--address ADDR]``.
It prints, per worker, the patch state, the exported ``CUDA_HOME`` and
``shutil.which("nvcc")``.  Without Ray installed, :func:`runtime_env` and
:func:`worker_report` are plain functions (tests/project/test_examples.py runs them).
"""

from __future__ import annotations

import argparse
import json
import os

#: The hook Ray imports and calls in every worker process ("module.function").
SETUP_HOOK = "flashinfer_sm120.worker_setup"


def runtime_env(cache_root: str = "/var/cache") -> dict:
    """The ``runtime_env`` for ``ray.init`` (or one task/actor's ``.options``)."""
    return {
        "worker_process_setup_hook": SETUP_HOOK,
        "env_vars": {
            "FLASHINFER_SM120_CACHE_DIR": os.path.join(cache_root, "flashinfer-sm120"),
            "FLASHINFER_WORKSPACE_BASE": os.path.join(cache_root, "flashinfer"),
        },
    }


def worker_report() -> dict:
    """What a worker sees: the patch state, what was exported, ``which nvcc``."""
    import shutil
    import socket

    import flashinfer_sm120
    from flashinfer_sm120.core import autoload
    from flashinfer_sm120.core.jitenv import environ

    st = flashinfer_sm120.status()
    return {
        "host": socket.gethostname(), "pid": os.getpid(), "mode": st["mode"], "error": st["error"],
        "loaded_by": autoload.state.triggered_by, "early_export": autoload.state.early_export,
        "CUDA_HOME": os.environ.get("CUDA_HOME"), "which_nvcc": shutil.which("nvcc"),
        "exported": environ.exported(),
    }


def main() -> int:
    import ray

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--address", default=None, help="Ray cluster address (default: start a local one)")
    ap.add_argument("--cache-root", default="/var/cache")
    args = ap.parse_args()
    ray.init(address=args.address, runtime_env=runtime_env(args.cache_root))
    report = ray.remote(worker_report)
    rows = ray.get([report.remote() for _ in range(args.workers)])
    for row in rows:
        print(json.dumps(row))
    return 0 if all(r["exported"] or r["mode"] in ("patched", "noop") for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
