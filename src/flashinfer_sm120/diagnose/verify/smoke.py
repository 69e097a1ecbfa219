"""``doctor --smoke``: a tiny kernel built with FlashInfer's own ``gen_jit_spec`` and ``generate_ninja_build_for_op``
(0.7.4) in a private scratch directory, checked, and run when a GPU is visible; the result names the failing
step (:data:`STEPS`, one deadline)."""

from __future__ import annotations

import dataclasses
import os
import sys
import time

from flashinfer_sm120.errors import Sm120Error
from flashinfer_sm120.safety.formats.reads import loads_json
from flashinfer_sm120.safety.formats.fields import field

__all__ = ["SMOKE_TIMEOUT_S", "STEPS", "Step", "SmokeResult", "run_smoke"]

#: Seconds the whole smoke check may take by default.
SMOKE_TIMEOUT_S = 30.0
#: The steps, in order.
STEPS = ("toolkit", "generate", "compile", "link", "link check", "load", "run")
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


@dataclasses.dataclass
class Step:
    """One step: ``status`` is ``passed``, ``failed`` or ``skipped``."""

    name: str
    status: str
    seconds: float = 0.0
    detail: str = ""
    output: str = ""


@dataclasses.dataclass
class SmokeResult:
    """The outcome: ``ok`` when no step failed; ``failed`` names the first failing step."""

    ok: bool
    steps: list[Step]
    failed: str | None
    seconds: float
    cuda_home: str | None = None
    targets: list[str] = dataclasses.field(default_factory=list)

    def to_dict(self) -> dict:
        """JSON-ready form."""
        return dataclasses.asdict(self)


class _Failed(Exception):
    def __init__(self, detail: str, output: str = "") -> None:
        super().__init__(detail)
        self.detail, self.output = detail, output


def _tail(text: str, keep: int = OUTPUT_KEPT) -> str:
    text = text.strip()
    return text if len(text) <= keep else f"... ({len(text) - keep} characters cut)\n" + text[-keep:]


def _choose(state: dict) -> str:
    """The toolkit and targets FlashInfer builds with here, patched (``state`` gets ``home`` and ``targets``)."""
    from flashinfer_sm120.core.facts.refusals import import_refused

    refusal = import_refused()  # threat-model: P4: FlashInfer and its dependencies write where it must not
    if refusal is not None:
        raise _Failed(str(refusal))
    import flashinfer_sm120

    flashinfer_sm120.install()
    import flashinfer.jit.core as core  # noqa: F401  (applies the patch)
    import flashinfer.jit.cpp_ext as cx

    st = flashinfer_sm120.status()
    if st["mode"] not in ("patched", "noop"):
        raise _Failed(f"FlashInfer is {st['mode']}, so its JIT builds would not use a fitting toolkit: "
                      f"{st.get('error') or st.get('summary')}")
    targets = st["target_cuda_archs"] or []
    if not targets:
        from flashinfer_sm120.diagnose.verify.diagnosis import NO_TARGETS, NO_TARGETS_FIX

        raise _Failed(f"no targets: {NO_TARGETS}; fix: {NO_TARGETS_FIX}")
    from flashinfer_sm120.safety.compilers import path_problem

    problem = path_problem(os.environ)
    if problem:
        raise _Failed(str(problem))
    home = state["home"] = cx.get_cuda_path()
    state["targets"] = targets
    nvcc = os.path.realpath(os.path.join(home, "bin", "nvcc"))
    return f"nvcc {cx.get_cuda_version()} ({nvcc}) via CUDA_HOME={home}; targets {' '.join(targets)}"


def _generate(state: dict, work: str) -> str:
    """Write the source and FlashInfer's build.ninja into ``work``; ``state`` gets the ninja, object and ``.so`` paths."""
    import re
    from pathlib import Path

    import flashinfer.jit.cpp_ext as cx
    from flashinfer.jit import env as jit_env
    from flashinfer.jit.core import gen_jit_spec

    src = Path(work) / "smoke.cu"
    src.write_text(SOURCE)
    spec = gen_jit_spec(_NAME, [src])
    text = cx.generate_ninja_build_for_op(
        spec.name, spec.sources, spec.extra_cflags, spec.extra_cuda_cflags, spec.extra_ldflags,
        spec.extra_include_dirs, getattr(spec, "needs_device_linking", False))
    theirs = str((Path(jit_env.FLASHINFER_JIT_DIR) / _NAME).resolve())
    if theirs not in text:
        raise _Failed(f"FlashInfer's build.ninja does not name its output directory {theirs} where expected; "
                      "this FlashInfer release writes its ninja files differently", text[-1500:])
    text = text.replace(theirs, str(Path(work).resolve()))
    state["ninja"] = os.path.join(work, "build.ninja")
    with open(state["ninja"], "w") as fh:
        fh.write(text)
    state["obj"] = os.path.join(os.path.realpath(work), f"{src.parent.name}_{src.stem}.cuda.o")
    state["so"] = os.path.join(os.path.realpath(work), f"{_NAME}.so")
    gencode = sorted(set(re.findall(r"-gencode=arch=\S+", text)))
    return f"FlashInfer's build.ninja: {' '.join(gencode) or 'no -gencode'}; links -lcudart -lcuda"


def _ninja(args: list[str], left, what: str) -> str:
    """Run the ninja FlashInfer's ``run_ninja`` will run (:func:`flashinfer_sm120.core.toolkit.ninja.choose`)."""
    from flashinfer_sm120.safety import proc
    from flashinfer_sm120.core.toolkit import ninja as _ninjas
    from flashinfer_sm120.safety.fs.atomic import build_env

    ninja = _ninjas.choose().path  # a NinjaError, or a PlaceError just below: the step's detail, as any refusal
    env = build_env(os.environ)  # nvcc's temporary names are predictable: a directory of ours
    res = proc.run([ninja, *args], timeout=left(), max_output=1 << 20, env=env)
    if not res.ok:
        why = ("timed out" if res.timed_out else res.error or f"exit {res.returncode}")
        raise _Failed(f"{what} failed ({why})", res.text())
    return f"{what} with {ninja}"


def _link_check(so: str, home: str, targets: list[str]) -> str:
    from flashinfer_sm120.diagnose.verify.inventory import find_cuobjdump, module_targets
    from flashinfer_sm120.diagnose.verify.rules import static_problems

    from flashinfer_sm120.core.toolkit.policy import torch_cuda_version

    torch_cuda = torch_cuda_version()
    major = int(torch_cuda.split(".")[0]) if torch_cuda and torch_cuda.split(".")[0].isdigit() else None
    facts, problems = static_problems(so, view=_view(home), cuda_major=major)
    if problems:
        raise _Failed("; ".join(problems))
    found = module_targets(so, find_cuobjdump(home))
    if found["known"]:
        missing = [t for t in targets if t not in found["sass"]]
        if missing:
            raise _Failed(f"the .so holds no SASS for {', '.join(missing)} (it holds "
                          f"{', '.join(found['sass'] + found['ptx']) or 'no device code'})")
        code = "SASS " + ", ".join(found["sass"])
    else:
        code = found["note"]
    cuda = [n for n in facts["needed"] if n.startswith(("libcuda", "libcudart"))]
    return f"NEEDED {', '.join(cuda) or 'no CUDA library'}; {code}"


def _view(home: str) -> str | None:
    """``home`` when it is a view of ours (its stubs must never be loaded at run time), else ``None``."""
    from flashinfer_sm120.core.view.meta import META_NAME

    return home if os.path.isfile(os.path.join(home, META_NAME)) else None


def _load(so: str, home: str, left, state: dict) -> str:
    from flashinfer_sm120.safety import proc
    from flashinfer_sm120.diagnose.verify.rules import runtime_problems
    from flashinfer_sm120.safety.formats.binary import proc_maps_paths

    res = proc.run([sys.executable, "-c", _CHILD, so], timeout=left(), max_output=16 << 20)
    line = next((ln for ln in reversed(res.text().splitlines()) if ln.startswith("@@")), None)
    if line is None:
        raise _Failed(f"the child process printed no result ({'timed out' if res.timed_out else res.returncode})",
                      res.text())
    out = loads_json(line[2:], "the smoke child's result")
    if not field(out, "loaded", bool, "the smoke child's result", default=False):
        raise _Failed(f"loading the .so failed: {out.get('error')}")
    maps = [proc_maps_paths(str(out.get(k, "")), "/proc/self/maps") for k in ("before", "after")]
    facts, problems = runtime_problems(*maps, view=_view(home))
    if problems:
        raise _Failed("; ".join(problems))
    state["child"] = out
    return f"libcuda from {', '.join(facts['libcuda'])}; libcudart from {', '.join(facts['libcudart'])}"


def _ran(state: dict) -> str:
    out = state["child"]
    src = "the smoke child's result"
    rc = field(out, "rc", int, src, default=None)
    if out.get("error") or rc is None:
        raise _Failed(f"calling the kernel failed: {out.get('error')}")
    wrong = field(out, "wrong", int, src, default=-1)
    if rc != 0 or wrong != 0:
        raise _Failed(f"the kernel ran with cudaError {rc} and {wrong} wrong results of 4096 "
                      f"(cudaError 209 is cudaErrorNoKernelImageForDevice: no code for this GPU)")
    driver = field(out, "driver", int, src, default=0)
    return f"4096 results right; driver API version {driver // 1000}.{driver % 1000 // 10}"


def _gpu_visible() -> bool:
    try:
        from flashinfer_sm120.core.facts import gpus

        return bool(gpus.query(torch_fallback=False).gpus)
    except Exception:
        return False


def run_smoke(timeout: float = SMOKE_TIMEOUT_S) -> SmokeResult:
    """The smoke check within ``timeout`` seconds; never raises: a failure is a failed step."""
    start = time.monotonic()
    steps: list[Step] = []
    st: dict = {"home": None, "targets": []}

    def left() -> float:
        if time.monotonic() >= start + timeout:
            raise _Failed(f"the smoke check's {timeout:g} s were used up before this step")
        return start + timeout - time.monotonic()

    table = [("toolkit", lambda: _choose(st)),
             ("generate", lambda: _generate(st, work)),
             ("compile", lambda: _ninja(["-C", work, "-f", st["ninja"], st["obj"]], left, "compile")),
             ("link", lambda: _ninja(["-C", work, "-f", st["ninja"]], left, "link")),
             ("link check", lambda: _link_check(st["so"], st["home"], st["targets"])),
             ("load", lambda: _load(st["so"], st["home"], left, st)),
             ("run", lambda: _ran(st))]
    scratch = None
    try:
        from flashinfer_sm120.safety.fs.statedir import cache_root
        from flashinfer_sm120.safety.fs.atomic import make_private

        scratch = make_private("smoke-", cache_root())  # locked while it runs: a killed one is swept by the next
        work = scratch.path
        for name, fn in table[:5] + (table[5:] if _gpu_visible() else []):
            t0 = time.monotonic()
            try:
                steps.append(Step(name, "passed", 0.0, fn() or ""))
            except Exception as exc:  # anything FlashInfer or the OS raises: the step failed; a refusal says its text
                failed = exc if isinstance(exc, _Failed) else _Failed(
                    (str(exc) if isinstance(exc, Sm120Error) else f"{type(exc).__name__}: {exc}")[:2000])
                steps.append(Step(name, "failed", 0.0, failed.detail, _tail(failed.output)))
                break
            finally:
                steps[-1].seconds = round(time.monotonic() - t0, 2)
    except Exception as exc:  # the scratch directory itself (no cache root): name it as a step
        steps.append(Step("toolkit", "failed", 0.0, f"{type(exc).__name__}: {exc}"[:2000]))
    finally:
        if scratch is not None:
            scratch.close()
    done = {s.name for s in steps}
    failed = next((s.name for s in steps if s.status == "failed"), None)
    for name in STEPS:
        if name not in done:
            why = (f"not run: {failed} failed" if failed else "no GPU visible (compile and link checked only)")
            steps.append(Step(name, "skipped", 0.0, why))
    return SmokeResult(failed is None, steps, failed, round(time.monotonic() - start, 2), st["home"], st["targets"])
