"""``flashinfer-sm120 build``: JIT-build FlashInfer modules into FlashInfer's JIT cache now."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from .. import arch as _arch
from .common import err as _err

__all__ = ["MODULES", "run_build", "add_parser"]

#: JIT modules ``build`` knows: name -> (module, generator, args from torch).
MODULES = {
    "sampling": ("flashinfer.jit.sampling", "gen_sampling_module", lambda torch: ()),
    # Batch decode attention, fp16 q/kv/o, int32 indices, head_dim 128, no RoPE,
    # no sliding window, no logits soft cap: what Llama-style models use.
    "decode": (
        "flashinfer.jit.attention.modules",
        "gen_batch_decode_module",
        lambda torch: (torch.float16, torch.float16, torch.float16, torch.int32, 128, 128, 0, False, False),
    ),
}


class _Progress:
    """One status line from ninja's ``[done/total]`` output plus elapsed seconds."""

    def __init__(self, name: str, first: str, stream=sys.stderr) -> None:
        self.name, self.stream = name, stream
        self.tty = stream.isatty()
        self.text = first
        self.t0 = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._tick, daemon=True)

    def __enter__(self):
        self._show(newline=not self.tty)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        if self.tty:
            self.stream.write("\n")

    def update(self, text: str) -> None:
        self.text = text
        self._show(newline=not self.tty)

    def _show(self, newline: bool) -> None:
        line = f"[{self.name}] {self.text}  ({time.monotonic() - self.t0:.0f} s)"
        self.stream.write(("\r\x1b[K" + line) if not newline else line + "\n")
        self.stream.flush()

    def _tick(self) -> None:
        while not self._stop.wait(1.0 if self.tty else 30.0):
            if self.tty:
                self._show(newline=False)
            else:  # a heartbeat that does not look like a repeated event
                self.stream.write(f"[{self.name}] still working: {self.busy()}  "
                                  f"({time.monotonic() - self.t0:.0f} s)\n")
                self.stream.flush()

    def busy(self) -> str:
        return self.text.split(" | ", 1)[-1]


def _run_ninja(spec, jobs: int | None, label: str) -> bool:
    """Run ninja on the module's build.ninja with a progress line; True if it was up to date."""
    ninja = shutil.which("ninja")
    if ninja is None:
        try:
            import ninja as _ninja_pkg  # FlashInfer depends on the ninja wheel

            ninja = os.path.join(_ninja_pkg.BIN_DIR, "ninja")
        except Exception:
            raise RuntimeError("ninja not found; pip install ninja") from None
    cmd = [ninja, "-C", str(spec.build_dir.resolve()), "-f", str(spec.ninja_path.resolve())]
    if jobs:
        cmd += ["-j", str(jobs)]
    env = dict(os.environ, NINJA_STATUS="[%f/%t] ")
    out_lines: list[str] = []
    sources = re.findall(r"^build \S+: (?:cuda_)?compile (\S+)", spec.ninja_path.read_text(), re.M)
    pending = [os.path.basename(x) for x in sources]
    first = f"to build: {', '.join(pending)} (one nvcc job each), then link"
    up_to_date = False
    with _Progress(label, first) as prog:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=env, errors="replace")
        assert proc.stdout is not None
        for line in proc.stdout:
            out_lines.append(line)
            if line.startswith("ninja: no work to do"):
                up_to_date = True
                prog.update("up to date (already in FlashInfer's JIT cache)")
            m = re.match(r"\[(\d+)/(\d+)\] (.*)", line)
            if m:
                done, total, what = m.groups()
                src = re.findall(r"-c (\S+)", what)
                # ninja reports an edge when it finishes: name what was done
                if src and os.path.basename(src[0]) in pending:
                    pending.remove(os.path.basename(src[0]))
                finished = ("compiled " + os.path.basename(src[0])) if src else (
                    "linked" if " -shared " in what else what[:60])
                busy = f"compiling {', '.join(pending)}" if pending else (
                    "done" if done == total else "linking")
                prog.update(f"{done}/{total} {finished} | {busy}")
        rc = proc.wait()
    if rc != 0:
        raise RuntimeError(f"ninja failed (exit {rc}):\n" + "".join(out_lines[-60:]))
    return up_to_date


class _NoLock:
    def acquire(self, timeout: float = -1) -> None:
        pass

    def release(self) -> None:
        pass


def _acquire_or_say(lock, name: str, path) -> None:
    """Take FlashInfer's per-module build lock, saying so if another build holds it."""
    try:
        lock.acquire(timeout=0)
        return
    except Exception:  # filelock.Timeout: someone else is building this module
        pass
    print(f"[{name}] waiting for another process building the same module (lock {path})",
          file=sys.stderr, flush=True)
    lock.acquire()


def _gencodes(ninja_file: Path) -> list[str]:
    text = ninja_file.read_text()
    return sorted(set(re.findall(r"-gencode=arch=(compute_\w+),code=(sm_\w+)", text)), key=str)


def run_build(args: argparse.Namespace) -> int:
    if args.arch is not None:
        try:
            specs = _arch.parse_arch_list(args.arch, source="--arch")
        except _arch.ArchListError as exc:
            return _err(str(exc))
        os.environ["FLASHINFER_CUDA_ARCH_LIST"] = " ".join(
            f"{s.major}.{s.minor}{s.suffix or ''}" for s in specs)
    unknown = [m for m in args.modules if m not in MODULES]
    if unknown:
        return _err(f"unknown module(s) {', '.join(unknown)}; choose from {', '.join(MODULES)}")

    from .. import patch

    os.environ.setdefault("FLASHINFER_SM120_QUIET", "1")  # the summary is printed below
    patch.install()
    import importlib

    import torch

    try:
        importlib.import_module("flashinfer.jit.core")
    except Exception as exc:
        return _err(f"importing FlashInfer failed: {exc!r}")
    st = patch.status()
    if st["mode"] == "disabled":
        return _err("FLASHINFER_SM120_DISABLE is set, so FlashInfer would build with its own "
                    "toolkit choice; unset it (or set it to 0) to build with flashinfer-sm120")
    if st["mode"] not in ("patched", "noop"):
        return _err(f"FlashInfer could not be set up ({st['mode']}): {st['error']}")
    print(f"flashinfer-sm120: {st['summary']}", file=sys.stderr)
    if not st["target_cuda_archs"]:
        return _err("no target architectures: no GPU is visible and no --arch was given; "
                    "pass e.g. --arch 12.0 (RTX 5090 / RTX PRO 6000) or --arch 12.1 (DGX Spark)")
    import flashinfer.jit.cpp_ext as cx

    jobs = args.jobs or (int(os.environ["MAX_JOBS"]) if os.environ.get("MAX_JOBS", "").isdigit() else None)
    results = []
    for name in args.modules:
        mod_name, fn_name, make_args = MODULES[name]
        gen = getattr(importlib.import_module(mod_name), fn_name)
        spec = gen(*make_args(torch))
        spec.write_ninja()
        try:
            from filelock import FileLock

            lock = FileLock(str(spec.lock_path))
        except Exception:
            lock = _NoLock()
        t0 = time.monotonic()
        try:
            _acquire_or_say(lock, name, spec.lock_path)
            try:
                up_to_date = _run_ninja(spec, jobs, name)
            finally:
                lock.release()
        except RuntimeError as exc:
            return _err(f"building {name} failed: {exc}")
        so = spec.jit_library_path
        results.append({
            "module": name,
            "library": str(so),
            "bytes": so.stat().st_size if so.exists() else None,
            "seconds": round(time.monotonic() - t0, 1),
            "up_to_date": up_to_date,
            "gencode": [f"{c},{s}" for c, s in _gencodes(spec.ninja_path)],
        })
    summary = {"cuda_home": cx.get_cuda_path(), "cuda_version": str(cx.get_cuda_version()),
               "target_cuda_archs": st["target_cuda_archs"], "modules": results}
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(f"nvcc: {summary['cuda_home']}/bin/nvcc (CUDA {summary['cuda_version']}); "
              f"targets {', '.join(summary['target_cuda_archs'])}")
        for r in results:
            verb = "up to date" if r["up_to_date"] else "built"
            print(f"{verb} {r['module']}: {r['library']} ({r['bytes']} bytes, {r['seconds']} s; "
                  f"{'; '.join(r['gencode'])})")
    return 0



def add_parser(sub) -> None:
    """Register the ``build`` subcommand on an argparse subparsers object."""
    b = sub.add_parser("build", help="JIT-build FlashInfer modules into FlashInfer's JIT cache")
    b.add_argument("modules", nargs="+", metavar="MODULE", help=f"one of: {', '.join(MODULES)}")
    b.add_argument("--arch", help="compute capabilities, e.g. '12.0' or '12.0 12.1' "
                   "(default: the GPUs present); sets FLASHINFER_CUDA_ARCH_LIST")
    b.add_argument("--jobs", "-j", type=int, help="parallel compile jobs (default: MAX_JOBS or ninja's)")
    b.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    b.set_defaults(func=run_build)
