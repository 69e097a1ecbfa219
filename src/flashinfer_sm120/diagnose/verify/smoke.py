"""``doctor --smoke``: a tiny kernel built with FlashInfer's own ``gen_jit_spec`` and ``generate_ninja_build_for_op``
(0.7.4) in a private scratch directory, checked, and run when a GPU is visible; the result names the failing
step (:data:`STEPS`, one deadline), as ``doctor --json`` shows it under ``smoke``."""

from __future__ import annotations

import os
import sys
import time

from flashinfer_sm120.errors import Sm120Error
from flashinfer_sm120.safety.formats.reads import loads_json

__all__ = ["SMOKE_TIMEOUT_S", "STEPS", "run_smoke"]

#: Seconds the whole smoke check may take by default.
SMOKE_TIMEOUT_S = 30.0
#: Characters of a failing step's output kept (its end: compilers print the error last).
OUTPUT_KEPT = 2000
_NAME = "flashinfer_sm120_smoke"

SOURCE = r"""// flashinfer-sm120 smoke check: compiled and linked with FlashInfer's own build line.
#include <cuda.h>
#include <cuda_runtime.h>

__global__ void flashinfer_sm120_smoke_kernel(float* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = 2.0f * x[i] + 1.0f;
}

// Calls the driver API too, so the module needs libcuda.so.1 (linked against the stub,
// loaded from the driver) as FlashInfer's modules do.
extern "C" int flashinfer_sm120_smoke(int n, int* driver_version, int* wrong) {
  if (cuDriverGetVersion(driver_version) != CUDA_SUCCESS) return -1;
  float* h = new float[n];
  for (int i = 0; i < n; ++i) h[i] = (float)i;
  float* d = nullptr;
  cudaError_t e = cudaMalloc(&d, n * sizeof(float));
  if (e == cudaSuccess) e = cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice);
  if (e == cudaSuccess) {
    flashinfer_sm120_smoke_kernel<<<(n + 255) / 256, 256>>>(d, n);
    e = cudaGetLastError();
  }
  if (e == cudaSuccess) e = cudaMemcpy(h, d, n * sizeof(float), cudaMemcpyDeviceToHost);
  if (d) cudaFree(d);
  *wrong = 0;
  for (int i = 0; i < n; ++i) *wrong += (h[i] != 2.0f * i + 1.0f);
  delete[] h;
  return (int)e;
}
"""

_CHILD = r"""
import ctypes, json, sys
out = {}
def maps():
    with open("/proc/self/maps") as fh:
        return fh.read()
try:
    import torch
    torch.cuda.init()
    out["before"] = maps()
    lib = ctypes.CDLL(sys.argv[1])
    out["loaded"] = True
    fn = lib.flashinfer_sm120_smoke
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int)]
    drv, wrong = ctypes.c_int(0), ctypes.c_int(-1)
    out["rc"] = fn(4096, ctypes.byref(drv), ctypes.byref(wrong))
    out["driver"], out["wrong"] = drv.value, wrong.value
    out["after"] = maps()
except Exception as e:
    out["error"] = repr(e)[:2000]
sys.stdout.write("\n@@" + json.dumps(out) + "\n")
"""


class _Failed(Sm120Error):
    """A step failed: the message says why, ``output`` is the end of what its tool printed."""

    def __init__(self, detail: str, output: str = "", fix: str = "") -> None:
        super().__init__(detail, fix)
        self.output = output


def _more_time(st: dict) -> str:
    """The fix of a step stopped by the one deadline."""
    return f"give the smoke check more than {st['timeout']:g} s: --timeout SECONDS (default {SMOKE_TIMEOUT_S:g})"


def _left(st: dict) -> float:
    """Seconds left of the one deadline; none left fails the step before it starts its tool."""
    left = st["deadline"] - time.monotonic()
    if left <= 0:
        raise _Failed(f"the smoke check's {st['timeout']:g} s were used up before this step", fix=_more_time(st))
    return left


def _toolkit(st: dict) -> str:
    """A private scratch directory, then the toolkit and targets FlashInfer builds with here, patched."""
    from flashinfer_sm120.core.facts.refusals import import_refused
    from flashinfer_sm120.safety.compilers import path_problem
    from flashinfer_sm120.safety.fs.atomic import make_private
    from flashinfer_sm120.safety.fs.statedir import cache_root

    st["scratch"] = make_private("smoke-", cache_root())  # locked while it runs: a killed one is swept by the next
    refusal = import_refused()  # threat-model: P4: FlashInfer and its dependencies write where it must not
    if refusal is not None:
        raise _Failed(str(refusal))
    import flashinfer_sm120

    flashinfer_sm120.install()
    import flashinfer.jit.core as core  # noqa: F401  (applies the patch)
    import flashinfer.jit.cpp_ext as cx

    status = flashinfer_sm120.status()
    if status["mode"] not in ("patched", "noop"):
        raise _Failed(f"FlashInfer is {status['mode']}, so its JIT builds would not use a fitting toolkit: "
                      f"{status.get('error') or status.get('summary')}")
    if not status["target_cuda_archs"]:
        from flashinfer_sm120.diagnose.verify.diagnosis import NO_TARGETS, no_targets_fix

        raise _Failed(f"no targets: {NO_TARGETS}; fix: {no_targets_fix('doctor --smoke')}")
    if problem := path_problem(os.environ):
        raise _Failed(str(problem))
    home = st["home"] = cx.get_cuda_path()
    st["targets"] = status["target_cuda_archs"]
    nvcc = os.path.realpath(os.path.join(home, "bin", "nvcc"))
    return f"nvcc {cx.get_cuda_version()} ({nvcc}) via CUDA_HOME={home}; targets {' '.join(st['targets'])}"


def _generate(st: dict) -> str:
    """The source and FlashInfer's build.ninja for it, pointed at the scratch directory."""
    import re
    from pathlib import Path

    import flashinfer.jit.cpp_ext as cx
    from flashinfer.jit import env as jit_env
    from flashinfer.jit.core import gen_jit_spec

    work = Path(st["scratch"].path).resolve()
    src = work / "smoke.cu"
    src.write_text(SOURCE)
    spec = gen_jit_spec(_NAME, [src])
    text = cx.generate_ninja_build_for_op(
        spec.name, spec.sources, spec.extra_cflags, spec.extra_cuda_cflags, spec.extra_ldflags,
        spec.extra_include_dirs, getattr(spec, "needs_device_linking", False))
    theirs = str((Path(jit_env.FLASHINFER_JIT_DIR) / _NAME).resolve())
    if theirs not in text:
        raise _Failed(f"FlashInfer's build.ninja does not name its output directory {theirs} where expected; "
                      "this FlashInfer release writes its ninja files differently", text[-1500:])
    st["ninja"] = work / "build.ninja"
    st["ninja"].write_text(text.replace(theirs, str(work)))
    st["obj"], st["so"] = str(work / f"{src.parent.name}_{src.stem}.cuda.o"), str(work / f"{_NAME}.so")
    gencode = sorted(set(re.findall(r"-gencode=arch=\S+", text)))
    return f"FlashInfer's build.ninja: {' '.join(gencode) or 'no -gencode'}; links -lcudart -lcuda"


def _ninja(st: dict, what: str, *targets: str) -> str:
    """Run the ninja FlashInfer's ``run_ninja`` will run (:func:`flashinfer_sm120.core.toolkit.ninja.choose`)."""
    from flashinfer_sm120.core.toolkit import ninja as ninjas
    from flashinfer_sm120.safety import proc
    from flashinfer_sm120.safety.fs.atomic import build_env

    ninja = ninjas.choose().path  # a NinjaError, or a PlaceError just below: the step's detail, as any refusal
    env = build_env(os.environ)  # nvcc's temporary names are predictable: a directory of ours
    res = proc.run([ninja, "-C", st["scratch"].path, "-f", str(st["ninja"]), *targets], timeout=_left(st),
                   max_output=1 << 20, env=env)
    if not res.ok:
        raise _Failed(f"{what} failed ({'timed out' if res.timed_out else res.error or f'exit {res.returncode}'})",
                      res.text(), _more_time(st) if res.timed_out else "")
    return f"{what} with {ninja}"


def _view(home: str) -> str | None:
    """``home`` when it is a view of ours (its stubs must never be loaded at run time), else ``None``."""
    from flashinfer_sm120.core.view.meta import META_NAME

    return home if os.path.isfile(os.path.join(home, META_NAME)) else None


def _link_check(st: dict) -> str:
    """What the ``.so`` needs at run time, and SASS for every target (from a trusted cuobjdump)."""
    from flashinfer_sm120.core.toolkit.policy import torch_cuda_version
    from flashinfer_sm120.diagnose.verify.inventory import find_cuobjdump, module_targets
    from flashinfer_sm120.diagnose.verify.rules import static_problems

    major = (torch_cuda_version() or "").split(".")[0]
    major = int(major) if major.isdigit() else None
    facts, problems = static_problems(st["so"], view=_view(st["home"]), cuda_major=major)
    if problems:
        raise _Failed("; ".join(problems))
    found = module_targets(st["so"], find_cuobjdump(st["home"]))
    missing = [t for t in st["targets"] if t not in found["sass"]]
    if found["known"] and missing:
        raise _Failed(f"the .so holds no SASS for {', '.join(missing)} (it holds "
                      f"{', '.join(found['sass'] + found['ptx']) or 'no device code'})")
    cuda = [n for n in facts["needed"] if n.startswith(("libcuda", "libcudart"))]
    code = "SASS " + ", ".join(found["sass"]) if found["known"] else found["note"]
    return f"NEEDED {', '.join(cuda) or 'no CUDA library'}; {code}"


def _load(st: dict) -> str:
    """Load the ``.so`` in a child that initialised CUDA through torch; the libraries it then maps."""
    from flashinfer_sm120.diagnose.verify.rules import runtime_problems
    from flashinfer_sm120.safety import proc
    from flashinfer_sm120.safety.formats.binary import proc_maps_paths

    res = proc.run([sys.executable, "-c", _CHILD, st["so"]], timeout=_left(st), max_output=16 << 20)
    line = next((ln for ln in reversed(res.text().splitlines()) if ln.startswith("@@")), None)
    if line is None:
        raise _Failed(f"the child process printed no result ({'timed out' if res.timed_out else res.returncode})",
                      res.text(), _more_time(st) if res.timed_out else "")
    out = st["child"] = loads_json(line[2:], "the smoke child's result")
    if out.get("loaded") is not True:
        raise _Failed(f"loading the .so failed: {out.get('error')}")
    maps = [proc_maps_paths(str(out.get(k, "")), "/proc/self/maps") for k in ("before", "after")]
    facts, problems = runtime_problems(*maps, view=_view(st["home"]))
    if problems:
        raise _Failed("; ".join(problems))
    return f"libcuda from {', '.join(facts['libcuda'])}; libcudart from {', '.join(facts['libcudart'])}"


def _run(st: dict) -> str:
    """The kernel's answer, as the child reported it."""
    out = st["child"]
    if out.get("error") or not isinstance(out.get("rc"), int):
        raise _Failed(f"calling the kernel failed: {out.get('error')}")
    if out["rc"] != 0 or out.get("wrong") != 0:
        raise _Failed(f"the kernel ran with cudaError {out['rc']} and {out.get('wrong')} wrong results of 4096 "
                      f"(cudaError 209 is cudaErrorNoKernelImageForDevice: no code for this GPU)")
    driver = int(out.get("driver") or 0)
    return f"4096 results right; driver API version {driver // 1000}.{driver % 1000 // 10}"


#: The steps, in order; the last two run only where a GPU is visible.
STEPS = {"toolkit": _toolkit, "generate": _generate, "compile": lambda st: _ninja(st, "compile", st["obj"]),
         "link": lambda st: _ninja(st, "link"), "link check": _link_check, "load": _load, "run": _run}


def _gpu_visible() -> bool:
    try:
        from flashinfer_sm120.core.facts import gpus

        return bool(gpus.query(torch_fallback=False).gpus)
    except Exception:
        return False


def run_smoke(timeout: float = SMOKE_TIMEOUT_S) -> dict:
    """The smoke check within ``timeout`` seconds; never raises: a failure is a failed step (``fix``: its own, if it
    names one), the rest skipped."""
    start = time.monotonic()
    st: dict = {"home": None, "targets": [], "deadline": start + timeout, "timeout": timeout}
    steps, failed, fix = [], None, None
    skip = {} if _gpu_visible() else dict.fromkeys(("load", "run"), "no GPU visible (compile and link checked only)")
    try:
        for name, fn in STEPS.items():
            why = f"not run: {failed} failed" if failed else skip.get(name)
            step = {"name": name, "status": "skipped", "seconds": 0.0, "detail": why, "output": ""}
            steps.append(step)
            if why is not None:
                continue
            t0 = time.monotonic()
            try:
                step.update(status="passed", detail=fn(st))
            except Exception as exc:  # anything FlashInfer or the OS raises fails the step; a refusal says its text
                failed, fix = name, getattr(exc, "fix", "") or None
                detail = str(exc) if isinstance(exc, Sm120Error) else f"{type(exc).__name__}: {exc}"
                output = exc.output.strip() if isinstance(exc, _Failed) else ""
                if len(output) > OUTPUT_KEPT:
                    output = f"... ({len(output) - OUTPUT_KEPT} characters cut)\n" + output[-OUTPUT_KEPT:]
                step.update(status="failed", detail=detail[:2000], output=output)
            step["seconds"] = round(time.monotonic() - t0, 2)
    finally:
        if "scratch" in st:
            st["scratch"].close()
    return {"ok": failed is None, "steps": steps, "failed": failed, "fix": fix, "seconds": round(time.monotonic() - start, 2),
            "cuda_home": st["home"], "targets": st["targets"]}
