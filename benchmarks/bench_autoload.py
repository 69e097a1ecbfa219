"""Cost of the ``.pth`` autoload, as ratios against no ``.pth`` measured in the same run.

1. Start-up: wall time of ``python -c pass`` in a venv whose site-packages holds
   our ``.pth``, against the same venv without it; runs paired (A, B, B, A, ...),
   medians.  Goal: ratio <= 1.10.  For reference, the 0.1.0 ``.pth`` (which
   imported the whole package, wrapt, logging... at every start) is measured too.
2. FlashInfer: seconds for ``import flashinfer`` inside a fresh process of that
   venv, with the ``.pth`` (the hook loads flashinfer_sm120 and patches FlashInfer
   during the import) against without; interleaved, medians.  Goal: ratio <= 1.02.

The venv is made here (``python -m venv --without-pip``); a path-only ``.pth``
lets it import the packages of the interpreter running this script, and
``PYTHONPATH`` points at this checkout's ``src``.

Usage: ``python benchmarks/bench_autoload.py [--starts N] [--imports M] [--json out.json]``
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from flashinfer_sm120.core.autoload_hook import HOOK_FILE, PTH_LINE, PTH_NAME  # noqa: E402
from flashinfer_sm120.diagnose.autoload import hook_source  # noqa: E402

OLD_LINE = (  # the 0.1.0 line: eager import at every start
    "import os, sys; exec(\"if os.environ.get('FLASHINFER_SM120_DISABLE', '').strip().lower()"
    " in ('', '0', 'false', 'no', 'off'):\\n"
    " try:\\n  import flashinfer_sm120\\n except Exception as e:\\n"
    "  sys.stderr.write('flashinfer-sm120: autoload failed: %r\\\\n' % (e,))\")\n"
)


def make_venv(where: Path) -> tuple[str, Path]:
    base = os.path.join(sys.base_prefix, "bin", f"python{sys.version_info.major}.{sys.version_info.minor}")
    subprocess.run([base if os.access(base, os.X_OK) else sys.executable, "-m", "venv", "--without-pip",
                    str(where)], check=True)
    py = str(where / "bin" / "python")
    site_dir = Path(subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                   capture_output=True, text=True, check=True).stdout.strip())
    # the packages of this interpreter (torch, flashinfer, wrapt ...), path entries only
    (site_dir / "00_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return py, site_dir


def _write_hook(site_dir: Path) -> None:
    """What ``enable`` writes next to the ``.pth``: the hook module and its cached bytecode
    (read even where PYTHONDONTWRITEBYTECODE keeps interpreters from writing it)."""
    import py_compile

    (site_dir / HOOK_FILE).write_text(hook_source())
    py_compile.compile(str(site_dir / HOOK_FILE), doraise=True)


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("FLASHINFER_SM120_DISABLE", "PYTHONPATH")}
    env["PYTHONPATH"] = str(ROOT / "src")
    env["FLASHINFER_SM120_QUIET"] = "1"
    env.setdefault("FLASHINFER_CUDA_ARCH_LIST", "12.0")  # no GPU here: patch for a real target
    return env


def bench_start(py: str, site_dir: Path, runs: int) -> dict:
    env = _env()
    pth = site_dir / PTH_NAME
    _write_hook(site_dir)
    variants = {"none": None, "lazy": PTH_LINE, "old": OLD_LINE}
    times: dict[str, list[float]] = {k: [] for k in variants}

    def once(name: str) -> float:
        if variants[name] is None:
            pth.unlink(missing_ok=True)
        else:
            pth.write_text(variants[name])
        t = time.perf_counter()
        subprocess.run([py, "-c", "pass"], env=env, check=True)
        return time.perf_counter() - t

    for name in variants:  # warm the page cache
        once(name)
    order = list(variants)
    for i in range(runs):
        for name in (order if i % 2 == 0 else order[::-1]):
            times[name].append(once(name))
    pth.unlink(missing_ok=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    # what site.py spends on the line itself, in this process (no process noise): a first import
    # of the module (its .pyc cached by the runs above) and the finder's installation
    sys.path.insert(0, str(site_dir))
    per = []
    for _ in range(200):
        sys.modules.pop("flashinfer_sm120_autoload", None)
        t = time.perf_counter()
        exec(PTH_LINE, {}, {})  # as site.addpackage does
        per.append(time.perf_counter() - t)
        sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "FlashInferSm120Autoload"]
    sys.path.remove(str(site_dir))
    return {"none_ms": med["none"] * 1e3, "lazy_ms": med["lazy"] * 1e3, "old_ms": med["old"] * 1e3,
            "line_us": statistics.median(per) * 1e6, "ratio": med["lazy"] / med["none"], "old_ratio": med["old"] / med["none"], "goal": 1.10, "runs": runs}


_IMPORT = "import time, sys\nt = time.perf_counter()\nimport flashinfer\nprint(time.perf_counter() - t)\n" \
          "m = sys.modules.get('flashinfer_sm120')\nprint(m.status()['mode'] if m else 'not loaded')\n"


def bench_import(py: str, site_dir: Path, runs: int) -> dict:
    env = _env()
    pth = site_dir / PTH_NAME
    times: dict[str, list[float]] = {"plain": [], "shim": []}
    modes = set()

    def once(name: str) -> float:
        if name == "shim":
            _write_hook(site_dir)
            pth.write_text(PTH_LINE)
        else:
            pth.unlink(missing_ok=True)
        out = subprocess.run([py, "-c", _IMPORT], env=env, check=True, capture_output=True, text=True).stdout
        secs, mode = out.strip().splitlines()[-2:]
        if name == "shim":
            modes.add(mode)
        return float(secs)

    once("plain"), once("shim")  # warm the page cache and the CUDA_HOME view
    for i in range(runs):
        for name in (("plain", "shim") if i % 2 == 0 else ("shim", "plain")):
            times[name].append(once(name))
    pth.unlink(missing_ok=True)
    p, s = statistics.median(times["plain"]), statistics.median(times["shim"])
    return {"plain_s": p, "shim_s": s, "ratio": s / p, "goal": 1.02, "runs": runs, "shim_modes": sorted(modes)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--starts", type=int, default=100)
    ap.add_argument("--imports", type=int, default=9)
    ap.add_argument("--json")
    ap.add_argument("--skip-import", action="store_true", help="start-up only")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-autoload-"))
    try:
        py, site_dir = make_venv(tmp / "venv")
        st = bench_start(py, site_dir, a.starts)
        print(f"python -c pass: with the .pth {st['lazy_ms']:.1f} ms vs without {st['none_ms']:.1f} ms -> "
              f"ratio {st['ratio']:.3f} (goal <= {st['goal']}); 0.1.0's eager .pth: {st['old_ms']:.1f} ms "
              f"(ratio {st['old_ratio']:.2f}); {st['runs']} paired runs, medians; executing the line itself: "
              f"{st['line_us']:.0f} us", flush=True)
        if a.skip_import:
            return 0
        imp = bench_import(py, site_dir, a.imports)
        print(f"import flashinfer: with the shim (autoloaded, patching included) {imp['shim_s']:.3f} s vs "
              f"without {imp['plain_s']:.3f} s -> ratio {imp['ratio']:.3f} (goal <= {imp['goal']}); "
              f"shim mode {', '.join(imp['shim_modes'])}; {imp['runs']} interleaved runs, medians")
        if a.json:
            with open(a.json, "w") as fh:
                json.dump({"start": st, "import": imp}, fh, indent=2)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
