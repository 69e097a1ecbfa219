"""The promise, cell by cell: FlashInfer era x torch CUDA x toolkit set x GPUs.

Every cell ends in one of two ways: FlashInfer writes a ``build.ninja`` whose
``-gencode`` flags are the right targets for the GPUs, built by an nvcc of an
allowed release (torch's CUDA major, at least the release's own minimum, able to
build every target); or its first JIT build raises flashinfer-sm120's
``ToolkitError``.  In every cell FlashInfer's "sm75 or higher" never appears and
no nvcc is handed a target it cannot build (the fake nvcc logs every command
line; ``nvcc --version`` aside, nothing may run it, since guarded builds must stop
before ninja).

Fast: ninja files, not compiles; one child process per FlashInfer release runs
all 96 cells (4 torch CUDA x 4 toolkit sets x 6 GPU sets) with
``revert()``/``install()``, switching torch's CUDA, the simulated GPUs, ``PATH`` and
the pip site directory at run time.  The machine's own CUDA 13 toolkits
(``/usr/local/cuda-13.0``, the venv's ``nvidia/cu13/bin``) are hidden by bind
mounts in a private mount namespace (``unshare -m``; skipped where unavailable).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from helpers.host import needs_flashinfer, real_toolkit_dirs, release_dir
from helpers.patching import logging_toolkit

pytestmark = needs_flashinfer

#: The old releases are downloaded (once, see helpers.host.release_dir): slow; the installed one is not.
ERAS = [pytest.param(v, marks=pytest.mark.slow) for v in ("0.4.0", "0.6.7", "0.6.17")] + ["installed"]
TORCH = [None, "12.8", "12.9", "13.0"]
GPUS = ["8.9", "9.0", "10.0", "12.0", "12.1", "12.0 8.9"]
#: toolkit set -> [(source, nvcc release)] in discovery order (pip before PATH).
SETS = {
    "pip13": [("pip", "13.0.88")],
    "sys128": [("PATH", "12.8.93")],
    "sys129+pip13": [("pip", "13.0.88"), ("PATH", "12.9.86")],
    "none": [],
}
#: min nvcc for the release's own flags (FlashInfer 0.6.18+: --compress-mode=size).
MIN_NVCC = {"0.4.0": None, "0.6.7": None, "0.6.17": None, "installed": (12, 8)}


def _v(s: str) -> tuple[int, int]:
    a, b = s.split(".")[:2]
    return int(a), int(b)


def best_target(cap: str, nvcc: tuple[int, int]) -> str | None:
    """Oracle: the target FlashInfer should build for ``cap`` with ``nvcc``, or None."""
    table = {"8.9": [("89", (11, 8))], "9.0": [("90a", (12, 0))], "10.0": [("100a", (12, 8))],
             "12.0": [("120f", (12, 9)), ("120a", (12, 8))], "12.1": [("121a", (12, 9))]}
    for target, need in table[cap]:
        if nvcc >= need:
            return target
    return None


def allowed(nvcc: tuple[int, int], torch: str | None, era: str) -> bool:
    """Oracle: an nvcc of this release may be used at all."""
    if torch is not None and _v(torch)[0] != nvcc[0]:
        return False
    return MIN_NVCC[era] is None or nvcc >= MIN_NVCC[era]


def expected(era: str, torch: str | None, tset: str, gpus: str) -> tuple[str, list[str]] | None:
    """Oracle (the documented policy): preferred targets first, then fallbacks,
    first acceptable toolkit in discovery order.  ``(nvcc release, targets)`` or None."""
    caps = gpus.split()
    for preferred in (True, False):
        for _, rel in SETS[tset]:
            nvcc = _v(rel)
            if not allowed(nvcc, torch, era):
                continue
            targets = [best_target(c, nvcc) for c in caps]
            if None in targets:
                continue
            if preferred and any(t == "120a" for t in targets):
                continue
            return rel, sorted(set(targets))
    return None


CHILD = r"""
import json, os, sys, glob
from helpers import fakegpu
import flashinfer_sm120 as s
import flashinfer, flashinfer.jit.cpp_ext as cx
from flashinfer.jit.sampling import gen_sampling_module
cfg = json.loads(os.environ["MATRIX_CFG"])
base_path = sys.path[:]
out = []
for tset, layout in cfg["sets"].items():
    for torch_cuda in cfg["torch"]:
        for gpus in cfg["gpus"]:
            s.revert()
            fakegpu.set_torch_cuda(torch_cuda)
            os.environ["FAKE_GPU_CAPS"] = gpus
            os.environ["PATH"] = os.pathsep.join(layout["path"] + ["/usr/bin", "/bin"])
            sys.path[:] = base_path + layout["sys_path"]
            st = s.install()
            cell = {"set": tset, "torch": torch_cuda, "gpus": gpus, "mode": st["mode"]}
            try:
                spec = gen_sampling_module()
                if st["mode"] in ("guard",):
                    spec.build_and_load()
                spec.write_ninja()
                text = spec.ninja_path.read_text()
                cell["gencode"] = sorted({l.strip() for l in text.split() if l.startswith("-gencode=")})
                cell["cuda_home"] = [l.split("=", 1)[1].strip() for l in text.splitlines()
                                     if l.startswith("cuda_home =")][0]
                cell["nvcc"] = str(cx.get_cuda_version())
            except Exception as e:
                cell["error"] = type(e).__name__ + ": " + str(e)
            out.append(cell)
print("@@" + json.dumps(out))
"""


def _fake_layouts(tmp_path, log) -> dict:
    layouts = {}
    for tset, members in SETS.items():
        lay = {"path": [], "sys_path": [], "roots": {}}
        for source, rel in members:
            if source == "pip":
                site_dir = tmp_path / f"{tset}-site" / "site-packages"
                root = logging_toolkit(site_dir / "nvidia" / "cu13", rel, log)
                lay["sys_path"].append(str(site_dir))
            else:
                root = logging_toolkit(tmp_path / f"{tset}-cuda-{rel}", rel, log)
                lay["path"].append(str(root / "bin"))
            (root / "include" / "curand.h").write_text("/* fake */\n")
            lay["roots"][str(root)] = rel
        layouts[tset] = lay
    return layouts



@pytest.fixture(scope="module")
def can_unshare():
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"private mount namespaces unavailable (unshare -m: {probe.stderr.decode().strip()[:200]})")


@pytest.mark.slow  # seconds: whole builds, servers or worker fleets in child processes
@pytest.mark.parametrize("era", ERAS)
def test_matrix(era, clean_env, tmp_path, can_unshare):
    log = tmp_path / "nvcc-calls.log"
    layouts = _fake_layouts(tmp_path, log)
    env = dict(clean_env)
    target = release_dir(era)
    if target:
        env["PYTHONPATH"] = target + os.pathsep + env["PYTHONPATH"]
    env["MATRIX_CFG"] = json.dumps({"sets": layouts, "torch": TORCH, "gpus": GPUS})
    env["FLASHINFER_SM120_QUIET"] = "1"
    env["FAKE_GPU_CAPS"] = "12.0"  # fakegpu on (0.6.17 reads a GPU at import); each cell sets its own
    empty = tmp_path / "empty"
    empty.mkdir()
    mounts = " && ".join(f"mount --bind {empty} {p}" for p in real_toolkit_dirs()) or "true"
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(CHILD))
    proc = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                           f'{mounts} && exec "$0" "$1"', sys.executable, str(script)],
                          capture_output=True, text=True, env=env, timeout=900)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("@@")]
    assert lines, f"exit {proc.returncode}\n{proc.stderr[-4000:]}"
    cells = json.loads(lines[-1][2:])
    assert len(cells) == len(SETS) * len(TORCH) * len(GPUS)
    assert "sm75 or higher" not in proc.stderr
    problems = []
    for c in cells:
        where = f"{era} torch={c['torch']} set={c['set']} gpus={c['gpus']}: {c}"
        if "sm75" in json.dumps(c):
            problems.append("sm75 message: " + where)
            continue
        want = expected(era, c["torch"], c["set"], c["gpus"])
        if want is None:
            if c["mode"] != "guard" or not c.get("error", "").startswith(
                    "ToolkitError: flashinfer-sm120 stopped this FlashInfer JIT build"):
                problems.append("expected the shim's error: " + where)
            continue
        rel, targets = want
        root_rel = layouts[c["set"]]["roots"]
        home_rel = next((r for root, r in root_rel.items()
                         if c.get("cuda_home") and os.path.realpath(c["cuda_home"]).startswith(os.path.realpath(root))), None)
        flags = sorted(f"-gencode=arch=compute_{t},code=sm_{t}" for t in targets)
        if c["mode"] not in ("patched", "noop") or "error" in c:
            problems.append(f"expected a build with nvcc {rel}: " + where)
        elif home_rel != rel or not c["nvcc"] == ".".join(rel.split(".")[:2]):
            problems.append(f"expected nvcc {rel}, ninja uses {c.get('cuda_home')} ({home_rel}): " + where)
        elif c["gencode"] != flags:
            problems.append(f"expected {flags}: " + where)
    modes = {c["mode"] for c in cells}
    assert "guard" in modes and modes & {"patched", "noop"}, modes  # both outcomes exercised
    calls = log.read_text().splitlines() if log.exists() else []
    assert calls == [], f"nvcc ran: {calls[:5]}"
    assert not problems, f"{len(problems)} of {len(cells)} cells wrong:\n" + "\n".join(problems[:15])
