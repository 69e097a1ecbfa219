"""One check of tests/integration/real_servers.sh, run by the REAL server's venv python.

    python server_probe.py versions|has_flashinfer|export|workers|jit_dir|fallbacks|own_targets NAME
    python server_probe.py warm NAME MODULE

NAME is ``vllm`` or ``sglang``.  Each command prints one last line: ``PASS <details>`` or
``FAIL <why>`` (``has_flashinfer`` prints the value, compared by the script).  Not run in CI.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import multiprocessing
import os
import shutil
import subprocess
import sys


#: vLLM's on-by-default FLASHINFER variables that only tune a path another option switches on: no fallback needed.
TUNING_ONLY = {
    "VLLM_FLASHINFER_CUTEDSL_MOE_LOCALIZE_MEMSET_OVERLAP": "0.34.0 vllm/envs.py: acts only with "
    "VLLM_USE_LOCALITY_DOMAINS=1 (default 0) on FlashInfer's CuteDSL NVFP4 MoE, which --moe-backend chooses",
}


def uncovered(release, on_by_default: list[str]) -> list[str]:
    """The on-by-default FLASHINFER variables with neither a ``<name>=0`` fallback nor a :data:`TUNING_ONLY` entry."""
    covered = {fb.text for fb in release.fallbacks}
    return [k for k in on_by_default if f"{k}=0" not in covered and k not in TUNING_ONLY]


def _server(name: str):
    return importlib.import_module(name)  # the autoload's trigger: exports right after


def _wheel_ninja() -> str | None:
    from flashinfer_sm120.core.toolkit import ninja

    found = ninja._wheel(None)
    return os.path.realpath(found[0][0]) if found else None


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "-"


def versions(name: str) -> None:
    import torch

    print(f"# {name}: {name} {_version(name)}, torch {_version('torch')} (CUDA {torch.version.cuda}), "
          f"flashinfer-python {_version('flashinfer-python')}, ninja wheel {_version('ninja')}, "
          f"nvidia-cuda-nvcc {_version('nvidia-cuda-nvcc')}, cuda-toolkit {_version('cuda-toolkit')}, "
          f"flashinfer-sm120 {_version('flashinfer-sm120')}, Debian ninja "
          f"{subprocess.run(['/usr/bin/ninja', '--version'], capture_output=True, text=True).stdout.strip() if os.path.exists('/usr/bin/ninja') else '-'}")


def has_flashinfer(name: str) -> None:
    _server(name)
    if name == "vllm":
        from vllm.utils.flashinfer import has_flashinfer as hf

        print(f"{hf()} (which nvcc {shutil.which('nvcc')}, which ninja {shutil.which('ninja')})")
        return
    from sglang.kernels.jit.utils.arch import _jit_cuda_version
    from sglang.kernels.jit.utils.compile.toolchain import cuda_home

    home = cuda_home()
    nvcc = os.path.join(home, "bin", "nvcc")
    source = "nvcc" if os.access(nvcc, os.X_OK) else "torch-fallback"
    print(f"{source}:{'.'.join(map(str, _jit_cuda_version()))} (cuda_home() {home})")


def _state(name: str) -> dict:
    import flashinfer_sm120

    out = {"CUDA_HOME": os.environ.get("CUDA_HOME"), "which_nvcc": shutil.which("nvcc"),
           "which_ninja": shutil.which("ninja")}
    out["ninja_real"] = out["which_ninja"] and os.path.realpath(out["which_ninja"])
    out["ninja_version"] = out["which_ninja"] and subprocess.run(
        [out["which_ninja"], "--version"], capture_output=True, text=True).stdout.strip()
    res = flashinfer_sm120.resolve()
    out["chosen_home"] = res.home.path
    return out


def export(name: str) -> None:
    _server(name)
    s = _state(name)
    wheel = _wheel_ninja()
    problems = []
    if s["CUDA_HOME"] != s["chosen_home"]:
        problems.append(f"CUDA_HOME {s['CUDA_HOME']} is not the choice {s['chosen_home']}")
    if s["which_nvcc"] != os.path.join(s["chosen_home"], "bin", "nvcc"):
        problems.append(f"which nvcc gives {s['which_nvcc']}")
    if s["ninja_real"] != wheel:
        problems.append(f"which ninja gives {s['which_ninja']} ({s['ninja_version']}), not the wheel's {wheel}")
    print(("FAIL " + "; ".join(problems)) if problems else
          f"PASS CUDA_HOME={s['CUDA_HOME']}; which nvcc {s['which_nvcc']}; which ninja {s['which_ninja']} -> "
          f"{s['ninja_real']} ({s['ninja_version']})")


def _worker(name: str, q) -> None:
    _server(name)
    import flashinfer  # noqa: F401  (a worker imports FlashInfer; the shim patches or finds it right)
    import flashinfer_sm120
    from flashinfer.jit import core

    st = flashinfer_sm120.status()
    q.put(dict(_state(name), mode=st["mode"], pid=os.getpid(),
               targets=sorted(f"{a}{b}" for a, b in core.current_compilation_context.TARGET_CUDA_ARCHS)))


def workers(name: str) -> None:
    _server(name)
    parent = _state(name)
    ctx = multiprocessing.get_context("spawn")  # vLLM's and SGLang's default for CUDA workers
    q = ctx.Queue()
    p = ctx.Process(target=_worker, args=(name, q))
    p.start()
    child = q.get(timeout=600)
    p.join(60)
    same = all(child[k] == parent[k] for k in ("CUDA_HOME", "which_nvcc", "ninja_real"))
    print(f"{'PASS' if same and child['targets'] and child['mode'] in ('patched', 'noop') else 'FAIL'} "
          f"worker pid {child['pid']} ({child['mode']}): CUDA_HOME={child['CUDA_HOME']}, ninja "
          f"{child['ninja_real']} ({child['ninja_version']}), targets {child['targets']}; parent CUDA_HOME="
          f"{parent['CUDA_HOME']}, ninja {parent['ninja_real']}")


def jit_dir(name: str) -> None:
    _server(name)
    import flashinfer.jit.env as e

    jit = str(e.FLASHINFER_JIT_DIR)
    home = os.path.expanduser("~")
    sub = (".cache", "sglang", ".cache", "flashinfer") if name == "sglang" else (".cache", "flashinfer")
    want = os.path.join(home, *sub)
    print(f"{'PASS' if jit.startswith(want + os.sep) else 'FAIL'} {jit} "
          f"(FLASHINFER_WORKSPACE_BASE={os.environ.get('FLASHINFER_WORKSPACE_BASE')})")


def _gpu_caps() -> list[tuple[int, int]]:
    """The capabilities the check runs for (no GPU here): FLASHINFER_CUDA_ARCH_LIST's entries."""
    return [(int(e.split(".")[0]), int(e.split(".")[1][0])) for e in os.environ["FLASHINFER_CUDA_ARCH_LIST"].split()]


def _as_model_process(name: str) -> str | None:
    """What a model process does before its first FlashInfer JIT build: SGLang's
    ModelRunner.load_model() calls the real sglang.srt.utils.common.set_cuda_arch(), here with
    torch.cuda answering for the first GPU of the arch list (there is no GPU on the check
    machine); vLLM does nothing.  Returns FLASHINFER_CUDA_ARCH_LIST afterwards."""
    if name == "sglang":
        import torch
        from sglang.srt.utils import common

        cap = _gpu_caps()[0]
        saved = torch.cuda.is_available, torch.cuda.get_device_capability
        torch.cuda.is_available, torch.cuda.get_device_capability = (lambda: True), (lambda *a, **k: cap)
        try:
            common.set_cuda_arch()
        finally:
            torch.cuda.is_available, torch.cuda.get_device_capability = saved
    return os.environ.get("FLASHINFER_CUDA_ARCH_LIST")


def own_targets(name: str) -> None:
    """The targets the server's model process sets itself are the ones flashinfer-sm120 reads from
    the installed source (and builds with `build --for NAME`)."""
    _server(name)
    import flashinfer  # noqa: F401  (imported before load_model, as in the server)
    from flashinfer_sm120.core.facts import serverprobe

    before = os.environ.get("FLASHINFER_CUDA_ARCH_LIST")
    ours = serverprobe.server_arch(name, _gpu_caps(), dict(os.environ))
    after = _as_model_process(name)
    want = ours.value if ours is not None and ours.value is not None else before
    ok = after == want and (ours is None or ours.how.startswith("read from "))
    print(f"{'PASS' if ok else 'FAIL'} FLASHINFER_CUDA_ARCH_LIST {before} -> {after} in a model process; "
          f"flashinfer-sm120 reads {want} ({ours.how if ours else 'no rule for ' + name})")


def warm(name: str, module: str) -> None:
    """After `flashinfer-sm120 build --arch ... MODULE`: in a model process of the server (SGLang:
    after its set_cuda_arch()), FlashInfer's own write_ninja() and the ninja on the server's PATH
    (run_ninja's) with -n: nothing to do."""
    _server(name)
    import flashinfer  # noqa: F401
    from flashinfer_sm120.warmup import modules

    arch = _as_model_process(name)
    spec = modules.expand([module])[0].spec()
    spec.write_ninja()  # what JitSpecNvcc.build() does before run_ninja (flashinfer/jit/core.py)
    ninja = shutil.which("ninja")
    proc = subprocess.run(["ninja", "-n", "-C", str(spec.build_dir.resolve()), "-f", str(spec.ninja_path.resolve())],
                          capture_output=True, text=True, cwd=str(spec.build_dir))
    out = (proc.stdout + proc.stderr).strip().replace("\n", " | ")
    ok = proc.returncode == 0 and "no work to do" in out and spec.jit_library_path.exists()
    print(f"{'PASS' if ok else 'FAIL'} {spec.build_dir} (FLASHINFER_CUDA_ARCH_LIST={arch}): '{ninja} -n' -> "
          f"{out[:300]}")


def fallbacks(name: str) -> None:
    """The guard's serving fallbacks are defined in the installed server's source, and (vLLM)
    every vllm/envs.py variable that turns a FlashInfer path on by default has one."""
    from flashinfer_sm120.core.facts import serverprobe, servers

    found = [(fb.text, ok) for inst, fb, ok in serverprobe.fallbacks() if inst.release.key == name]
    ok = bool(found) and all(v is True for _, v in found)
    missing = []
    if name == "vllm":
        import vllm.envs as envs

        for k in [k for k in os.environ if "FLASHINFER" in k and k.startswith("VLLM_")]:
            del os.environ[k]
        on = [k for k, get in envs.environment_variables.items() if "FLASHINFER" in k and get() is True]
        missing = uncovered(servers.newest("vllm"), on)
    print(f"{'PASS' if ok and not missing else 'FAIL'} "
          + (f"no fallback for {', '.join(missing)}; " if missing else "")
          + serverprobe.fallback_text([i for i in servers.installed() if i.release.key == name]))


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    try:
        {"versions": versions, "has_flashinfer": has_flashinfer, "export": export, "workers": workers,
         "jit_dir": jit_dir, "warm": warm, "fallbacks": fallbacks, "own_targets": own_targets}[cmd](*args)
    except Exception as exc:  # one line the script can read
        print(f"FAIL {type(exc).__name__}: {json.dumps(str(exc))[:500]}")
        raise SystemExit(1)
