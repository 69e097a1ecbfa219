"""flashinfer-sm120: make FlashInfer JIT-build for the right GPUs with the right nvcc.

Commands: doctor (what was found and chosen), build (JIT-build kernels now),
enable/disable (import flashinfer_sm120 in every Python process)."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from . import __version__
from . import arch as _arch

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


def _err(msg: str) -> int:
    print(f"flashinfer-sm120: error: {msg}", file=sys.stderr)
    return 2


# --------------------------------------------------------------------------- doctor


#: Seconds ``doctor`` lets unpatched FlashInfer run in its child process.  FlashInfer
#: runs ``nvcc --version`` without a timeout, so a hung nvcc would hang it forever.
ALONE_TIMEOUT_S = 60.0

_ALONE = r"""
import json, os, sys, threading
out = {"step": "import flashinfer"}
def work():
    try:
        import flashinfer.jit.core as core, flashinfer.jit.cpp_ext as cx, flashinfer.jit.env as env
        out["target_cuda_archs"] = sorted("sm_%d%s" % t for t in core.current_compilation_context.TARGET_CUDA_ARCHS)
        out["step"] = "get_cuda_path()"
        out["cuda_home"] = cx.get_cuda_path()
        out["jit_dir"] = str(env.FLASHINFER_JIT_DIR)
        out["step"] = "get_cuda_version() (runs nvcc --version with no timeout)"
        try:
            out["cuda_version"] = str(cx.get_cuda_version())
        except Exception as e:
            out["cuda_version_error"] = repr(e)
        out.pop("step")
    except Exception as e:
        out["error"] = repr(e)
t = threading.Thread(target=work, daemon=True)
t.start()
t.join(float(sys.argv[1]))
if t.is_alive():
    out["error"] = "FlashInfer hung in %s for %s s" % (out["step"], sys.argv[1])
sys.stdout.write("\n@@" + json.dumps(out))
sys.stdout.flush()
os._exit(0)
"""


def _flashinfer_alone(timeout: float = ALONE_TIMEOUT_S) -> dict:
    """What unpatched FlashInfer computes, from a child process with the shim off.

    Returns a dict with ``cuda_home``, ``cuda_version``, ``target_cuda_archs`` and
    ``jit_dir``, or ``error`` (e.g. FlashInfer hung on a broken nvcc for
    ``timeout`` seconds; the child and its process group are then killed).
    """
    env = dict(os.environ, FLASHINFER_SM120_DISABLE="1")
    for k in ("CUDA_HOME",):  # what the user set, not what this process exported
        if k in _ORIGINAL_ENV:
            env[k] = _ORIGINAL_ENV[k]
        else:
            env.pop(k, None)
    import tempfile

    # Files, not pipes: a hung nvcc left behind by FlashInfer would hold a pipe open.
    with tempfile.TemporaryFile("w+") as out_f, tempfile.TemporaryFile("w+") as err_f:
        proc = subprocess.Popen([sys.executable, "-c", _ALONE, str(timeout)], stdout=out_f,
                                stderr=err_f, text=True, env=env, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            proc.wait(timeout=timeout + 60)
        except subprocess.TimeoutExpired:
            pass
        try:  # the child, and FlashInfer's hung nvcc if any, go with the group
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        proc.wait()
        out_f.seek(0)
        err_f.seek(0)
        stdout, stderr = out_f.read(), err_f.read()
    m = re.search(r"@@(\{.*\})\s*$", stdout)
    if not m:
        return {"error": f"exit {proc.returncode}: {stderr.strip()[-400:]}"}
    return json.loads(m.group(1))


_ORIGINAL_ENV = {k: v for k, v in os.environ.items() if k in ("CUDA_HOME", "CUDA_PATH")}


def _doctor(args: argparse.Namespace) -> int:
    from . import patch, toolkit
    from .gpus import visible_gpus

    report: dict = {"flashinfer_sm120": __version__, "python": sys.executable}
    try:
        import importlib.metadata as md

        report["flashinfer"] = md.version("flashinfer-python")
    except Exception:
        report["flashinfer"] = None
    report["torch_cuda"] = toolkit.torch_cuda_version()
    try:
        report["gpus"] = [
            {"index": g.index, "name": g.name, "capability": f"{g.capability[0]}.{g.capability[1]}"}
            for g in visible_gpus()
        ]
    except Exception as exc:
        report["gpus_error"] = str(exc)
        report["gpus"] = []
    report["FLASHINFER_CUDA_ARCH_LIST"] = os.environ.get("FLASHINFER_CUDA_ARCH_LIST")
    candidates = list(toolkit.discover())  # every one read, once
    report["candidates"] = [tk.to_dict() for tk in candidates]
    verdicts: dict[str, str] = {}
    try:
        res = patch.resolve(toolkits=candidates)
        report["resolution"] = res.to_dict()
        verdicts[res.choice.toolkit.root] = "CHOSEN: " + res.choice.reason
        for tk, why in res.choice.rejected:
            label = "not chosen: " if why.startswith(("usable", "not chosen")) else "rejected: "
            verdicts.setdefault(tk.root, label + why.removeprefix("not chosen "))
    except Exception as exc:
        report["resolution_error"] = str(exc)
    for c in report["candidates"]:
        c["verdict"] = verdicts.get(c["root"]) or ("rejected: " + c["problem"] if c["problem"] else "")
    report["disabled"] = patch.env_flag("FLASHINFER_SM120_DISABLE")
    if not args.json:
        print(f"(asking unpatched FlashInfer in a child process, up to {args.timeout:g} s ...)",
              file=sys.stderr, flush=True)
    report["before"] = _flashinfer_alone(args.timeout)
    try:
        import flashinfer.jit.core  # noqa: F401  (triggers the hooks)
        import flashinfer.jit.env as jit_env
        import flashinfer.jit.cpp_ext as cx

        report["after"] = {
            "status": patch.status(),
            "cuda_home": cx.get_cuda_path(),
            "cuda_version": str(cx.get_cuda_version()),
            "jit_dir": str(jit_env.FLASHINFER_JIT_DIR),
        }
    except Exception as exc:
        report["after"] = {"status": patch.status(), "error": repr(exc)}
    if args.json:
        print(json.dumps(report, indent=2, default=str))
        return 0 if "resolution" in report else 1
    _print_doctor(report)
    return 0 if "resolution" in report else 1


def _print_doctor(r: dict) -> None:
    p = print
    p(f"flashinfer-sm120 {r['flashinfer_sm120']}  flashinfer {r['flashinfer']}  "
      f"torch CUDA {r['torch_cuda'] or 'none (CPU build)'}")
    p("\nGPUs (NVML, CUDA_VISIBLE_DEVICES applied):")
    for g in r["gpus"]:
        p(f"  [{g['index']}] {g['name']}  compute capability {g['capability']}")
    if not r["gpus"]:
        p("  none" + (f" ({r['gpus_error']})" if r.get("gpus_error") else ""))
    if r["FLASHINFER_CUDA_ARCH_LIST"] is not None:
        p(f"FLASHINFER_CUDA_ARCH_LIST={r['FLASHINFER_CUDA_ARCH_LIST']!r}")
    p("\nCUDA toolkits found (preference order):")
    for c in r["candidates"]:
        ver = c["nvcc_full"] or "?"
        hdr = c["header_version"] or "?"
        p(f"  {c['root']}\n      nvcc {ver} (from {c['version_from'] or '-'}), headers {hdr}, "
          f"found via {', '.join(c['sources'])}\n      {c.get('verdict') or ''}")
    if r.get("disabled"):
        p("\nFLASHINFER_SM120_DISABLE is set: what follows is what flashinfer-sm120 WOULD do; "
          "nothing is patched. Unset it to enable.")
    if "resolution" in r:
        res = r["resolution"]
        ch = res["choice"]
        p(f"\nChoice: nvcc {ch['toolkit']['nvcc_full']} at {ch['toolkit']['root']}")
        p(f"  CUDA_HOME for FlashInfer: {res['cuda_home']['path']}"
          + (f"  (view; adds {', '.join(res['cuda_home']['added'])})" if res["cuda_home"]["is_view"] else ""))
        p(f"  curand.h from: {res['cuda_home']['curand_include'] or 'NOWHERE (sampling kernels will not compile)'}")
        p(f"  targets: {', '.join(ch['targets']) or 'none'}")
        if res.get("arch_list_error"):
            p(f"  arch list ignored: {res['arch_list_error']}")
    else:
        p(f"\nNo usable toolkit: {r.get('resolution_error')}")
    b = r["before"]
    p("\nFlashInfer alone:   " + (f"CUDA_HOME={b.get('cuda_home')}  CUDA {b.get('cuda_version', b.get('cuda_version_error'))}"
                                 f"  TARGET_CUDA_ARCHS={b.get('target_cuda_archs')}"
                                 if "error" not in b else f"error: {b['error']}"))
    a = r["after"]
    st = a["status"]
    p(f"With flashinfer-sm120 ({st['mode']}): "
      + (f"CUDA_HOME={a.get('cuda_home')}  CUDA {a.get('cuda_version')}  "
         f"TARGET_CUDA_ARCHS={st.get('target_cuda_archs')}" if "error" not in a else f"error: {a['error']}"))
    if st.get("error"):
        p(f"  patch error: {st['error']}")


# --------------------------------------------------------------------------- build


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


def _build(args: argparse.Namespace) -> int:
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

    from . import patch

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


# --------------------------------------------------------------------------- enable / disable

_PTH_NAME = "flashinfer_sm120_autoload.pth"
# site.py executes .pth lines that start with "import"; one line, and it must
# never stop the interpreter from starting, hence the try/except inside exec.
_PTH_LINE = (
    "import os, sys; exec(\"if os.environ.get('FLASHINFER_SM120_DISABLE', '').strip().lower()"
    " in ('', '0', 'false', 'no', 'off'):\\n"
    " try:\\n  import flashinfer_sm120\\n except Exception as e:\\n"
    "  sys.stderr.write('flashinfer-sm120: autoload failed: %r\\\\n' % (e,))\")\n"
)


def _site_target(user: bool, site_dir: str | None = None) -> Path:
    import site
    import sysconfig

    if site_dir:
        return Path(site_dir)
    return Path(site.getusersitepackages() if user else sysconfig.get_paths()["purelib"])


def _enable(args: argparse.Namespace) -> int:
    target = _site_target(args.user, args.site_dir) / _PTH_NAME
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(_PTH_LINE)
    except OSError as exc:
        return _err(f"cannot write {target}: {exc.strerror}; try --user or a virtualenv")
    print(f"wrote {target}: every Python process of {sys.executable} now imports flashinfer_sm120 "
          f"at start-up (set FLASHINFER_SM120_DISABLE=1 to skip it)")
    return 0


def _disable(args: argparse.Namespace) -> int:
    removed = []
    for user in ((False,) if args.site_dir else (False, True)):
        target = _site_target(user, args.site_dir) / _PTH_NAME
        if target.exists():
            target.unlink()
            removed.append(str(target))
    print("removed " + ", ".join(removed) if removed else "nothing to remove")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``flashinfer-sm120`` command; returns the exit status."""
    parser = argparse.ArgumentParser(prog="flashinfer-sm120", description=__doc__)
    parser.add_argument("--version", action="version", version=__version__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("doctor", help="show GPUs, toolkits, the choice and the patch status")
    d.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    d.add_argument("--timeout", type=float, default=ALONE_TIMEOUT_S, metavar="SECONDS",
                   help="how long unpatched FlashInfer may take in its child process "
                        f"(it runs nvcc without a timeout; default {ALONE_TIMEOUT_S:g})")
    b = sub.add_parser("build", help="JIT-build FlashInfer modules into FlashInfer's JIT cache")
    b.add_argument("modules", nargs="+", metavar="MODULE", help=f"one of: {', '.join(MODULES)}")
    b.add_argument("--arch", help="compute capabilities, e.g. '12.0' or '12.0 12.1' "
                   "(default: the GPUs present); sets FLASHINFER_CUDA_ARCH_LIST")
    b.add_argument("--jobs", "-j", type=int, help="parallel compile jobs (default: MAX_JOBS or ninja's)")
    b.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    e = sub.add_parser("enable", help="import flashinfer_sm120 in every process (writes a .pth file)")
    e.add_argument("--user", action="store_true", help="user site-packages instead of this environment")
    e.add_argument("--site-dir", help=argparse.SUPPRESS)
    dis = sub.add_parser("disable", help="remove the .pth file written by 'enable'")
    dis.add_argument("--site-dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    return {"doctor": _doctor, "build": _build, "enable": _enable, "disable": _disable}[args.cmd](args)
