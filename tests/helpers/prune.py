"""``cache prune`` on fake caches (the ``caches`` fixture in tests/conftest.py): FlashInfer's installs and
JIT workspaces as 0.7.4 lays them out, the real command, and a child holding a lock."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from helpers.child import cli


def fake_flashinfer(site: Path, version: str) -> Path:
    """``site/flashinfer`` with ``data/include`` and the distribution's metadata, as pip installs it."""
    (site / "flashinfer" / "data" / "include").mkdir(parents=True, exist_ok=True)
    meta = site / f"flashinfer_python-{version}.dist-info"
    meta.mkdir(exist_ok=True)
    (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: flashinfer-python\nVersion: {version}\n")
    return site / "flashinfer"


def workspace(root: Path, rel: str, cuda_home: str, fi_pkg: Path, modules=("sampling",)) -> Path:
    """A JIT workspace as FlashInfer writes it: cached_ops/<module>/{build.ninja,<module>.so},
    cached_ops/tmp/<module>.lock, generated/, and the flashinfer_jit.log its import makes."""
    ws = root / rel
    for m in modules:
        d = ws / "cached_ops" / m
        d.mkdir(parents=True)
        (d / "build.ninja").write_text(
            f"ninja_required_version = 1.3\nname = {m}\ncuda_home = {cuda_home}\n"
            f"common_cflags = -DPy_LIMITED_API=0x03090000 $\n    -isystem {fi_pkg}/data/include $\n"
            f"    -isystem $cuda_home/include\n")
        (d / f"{m}.so").write_bytes(b"\x7fELF" + b"\0" * 8000)
        (ws / "cached_ops" / "tmp").mkdir(exist_ok=True)
        (ws / "cached_ops" / "tmp" / f"{m}.lock").touch()
    (ws / "generated").mkdir(exist_ok=True)
    (ws / "flashinfer_jit.log").touch()
    return ws


def prune(c, *args, timeout=120):
    return cli(["cache", "prune", *args], c["env"], timeout, python=sys.executable)


def listing(c, *args) -> dict:
    proc = prune(c, "--json", *args)
    assert proc.returncode == 0, proc.stderr
    return {e["path"]: e for e in json.loads(proc.stdout)["entries"]}


def hold(path: str):
    """A child process holding ``path`` with filelock, as FlashInfer and the view builder do."""
    code = ("import filelock, sys, time\nl = filelock.FileLock(sys.argv[1]); l.acquire()\n"
            "print('held', flush=True)\ntime.sleep(120)\n")
    p = subprocess.Popen([sys.executable, "-c", code, path], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    return p
