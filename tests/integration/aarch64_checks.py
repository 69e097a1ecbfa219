"""The checks of tests/integration/aarch64_emulated.sh, run inside its arm64 root (not a pytest module).

    python3 aarch64_checks.py doctor DOCTOR_JSON          # pip nvcc, AArch64, sm_121a, the view's libcudart
    python3 aarch64_checks.py build BUILD_JSON            # each module built holds sm_121a, AArch64
    python3 aarch64_checks.py autoload                    # a 'spawn' worker imports flashinfer: status()
    python3 aarch64_checks.py seed AARCH64_JSON HOST_JSON # the fake 12.8 toolkit passed over, as on x86_64

Each prints what it found and exits 1 with the reason on the first check that fails.
"""

from __future__ import annotations

import glob
import json
import multiprocessing
import os
import re
import subprocess
import sys


def fail(msg: str) -> None:
    print(f"FAIL: {msg}")
    sys.exit(1)


def machine(path: str) -> str:
    """`file -L` on ``path``: its description (``ELF 64-bit LSB ..., ARM aarch64, ...``)."""
    return subprocess.run(["file", "-bL", path], capture_output=True, text=True).stdout.strip()


def aarch64(path: str, what: str) -> None:
    desc = machine(path)
    print(f"{what}: {path}\n  file: {desc}")
    if "ARM aarch64" not in desc:
        fail(f"{what} {path} is not an AArch64 ELF: {desc}")


def doctor(report_path: str) -> None:
    report = json.load(open(report_path))
    d = report["diagnosis"]
    print(f"verdict ok={d['ok']} targets={d['targets']} nvcc={d['nvcc']} root={d['root']}")
    if d["targets"] != ["sm_121a"]:
        fail(f"targets {d['targets']}, expected ['sm_121a']")
    root = d["root"] or ""
    if "/nvidia/cu13" not in root:
        fail(f"the chosen toolkit {root!r} is not the pip wheel's (site-packages/nvidia/cu13)")
    aarch64(os.path.join(root, "bin", "nvcc"), "chosen nvcc")
    view = ((report.get("resolution") or {}).get("cuda_home") or {}).get("path") or ""
    lib = os.path.join(view, "lib64", "libcudart.so.13")
    if not os.path.exists(lib):
        fail(f"the view {view!r} has no lib64/libcudart.so.13")
    print(f"view {view}: lib64/libcudart.so.13 -> {os.path.realpath(lib)}")
    aarch64(lib, "the view's libcudart.so.13")


def build(build_path: str) -> None:
    """Every module ``build --json`` made holds SASS sm_121a (its fatbin headers, by the venv's cuobjdump),
    is an AArch64 ELF and records libcudart.so.13."""
    found = [m["library"] for m in json.load(open(build_path))["modules"]]
    if not found:
        fail("'build' made no module")
    cuobjdump = next(iter(glob.glob(os.path.join(sys.prefix, "lib", "python3*", "site-packages", "nvidia", "cu13",
                                                  "bin", "cuobjdump"))), "cuobjdump")
    for path in found:
        heads = subprocess.run([cuobjdump, path], capture_output=True, text=True).stdout
        if "arch = sm_121a" not in heads:
            fail(f"{path}: no SASS sm_121a in its fatbin headers:\n{heads[-2000:]}")
        aarch64(path, "module (SASS sm_121a)")
        needed = subprocess.run(["readelf", "-d", path], capture_output=True, text=True).stdout
        print("  " + "\n  ".join(line.strip() for line in needed.splitlines() if "NEEDED" in line or "PATH" in line))
        if "libcudart.so.13" not in needed:
            fail(f"{path} does not record libcudart.so.13")


def _worker(q) -> None:
    import flashinfer  # noqa: F401  (the autoload patches it on this import)
    import flashinfer_sm120

    q.put(json.loads(json.dumps(flashinfer_sm120.status(), default=str)))


def autoload() -> None:
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_worker, args=(q,))
    p.start()
    got = q.get(timeout=600)
    p.join(60)
    print(json.dumps(got, indent=1))
    text = json.dumps(got)
    if p.exitcode != 0:
        fail(f"the spawned worker exited {p.exitcode}")
    if got.get("mode") != "patched":
        fail(f"the worker's FlashInfer is {got.get('mode')!r}, not patched")
    if "sm_121a" not in text or "/nvidia/cu13" not in text:
        fail("the worker's status names no sm_121a or no pip nvcc (nvidia/cu13)")


def seed(aarch64_json: str, host_json: str) -> None:
    def passed_over(path):
        """What status says of the fake 12.8 toolkit: its rejection and what FlashInfer alone would use,
        with site-packages made equal (the venvs differ)."""
        st = json.load(open(path))
        res = st["resolution"]
        out = [f"chosen: {res['choice']['toolkit']['root']}"]
        out += [f"{r['kind']}: {r['toolkit']['given_as']}: {r['reason']}" for r in res["choice"]["rejected"]
                if FAKE in r["toolkit"]["root"]]
        out.append(f"FlashInfer alone would use CUDA_HOME={res['flashinfer_naive_cuda_home']}")
        return [re.sub(r"/\S*/site-packages/", "<site-packages>/", line) for line in out]

    arm, host = passed_over(aarch64_json), passed_over(host_json)
    print("aarch64:\n  " + "\n  ".join(arm) + "\nx86_64 host:\n  " + "\n  ".join(host))
    if "/nvidia/cu13" not in arm[0]:
        fail("the aarch64 status did not keep the pip nvcc (nvidia/cu13)")
    if len(arm) < 3:
        fail(f"the aarch64 status does not name the fake toolkit {FAKE}")
    if arm != host:
        fail("what status says of the 12.8 toolkit differs between aarch64 and the x86_64 host")


FAKE = "/opt/fake-cuda-12.8"


if __name__ == "__main__":
    what, *rest = sys.argv[1:]
    {"doctor": doctor, "build": build, "autoload": autoload, "seed": seed}[what](*rest)
