"""What a server process loads from this package: lines and modules of ``flashinfer_sm120`` in
``sys.modules`` after ``import flashinfer``, the figure people read before they let our ``.pth`` into
their serving environment (goal: <= 3,000 lines).

Each measure runs in fresh children of this interpreter, with its environment as is (and this
checkout's ``src`` first on ``PYTHONPATH``), twice, with a new ``FLASHINFER_SM120_CACHE_DIR``:

``first``
    the first process: the cache is empty, so nvcc and ninja are run for their versions and the
    ``CUDA_HOME`` view is built;
``later``
    every later process with the same settings: both versions remembered, the view adopted.

and two ways:

``import``
    ``import flashinfer_sm120; import flashinfer`` (the patch applied);
``autoload``
    the ``.pth`` path: the hook (``core/autoload_hook.py``) is loaded and armed as ``enable`` arms
    it, then ``import flashinfer`` fires it (``core/autoload.triggered``).

A module's lines are those of its file.  ``--arch 12.0`` exports ``FLASHINFER_CUDA_ARCH_LIST`` to
the children, so that a target exists (and FlashInfer is patched) without a GPU.

Usage: ``python benchmarks/loaded_lines.py [--arch 12.0] [--list] [--json out.json]``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HOOK = ROOT / "src" / "flashinfer_sm120" / "core" / "autoload_hook.py"

#: Child code: the ``.pth`` path arms the hook first; both print ``@@`` and the package's modules as JSON.
_ARM_HOOK = f"""
import importlib.util
spec = importlib.util.spec_from_file_location("flashinfer_sm120_autoload", {str(HOOK)!r})
hook = importlib.util.module_from_spec(spec)
sys.modules["flashinfer_sm120_autoload"] = hook
spec.loader.exec_module(hook)
hook.install()
"""
_CHILD = """
import json, sys
{arm}
{imports}
mode = sys.modules["flashinfer_sm120"].status()["mode"]
mods = {{}}
for name, mod in list(sys.modules.items()):
    path = getattr(mod, "__file__", None)
    if name.startswith("flashinfer_sm120") and path:  # the hook module too
        with open(path, "rb") as fh:
            mods[name] = fh.read().count(b"\\n")
print("@@" + json.dumps({{"mode": mode, "modules": mods}}))
"""
MEASURES = {
    "import": _CHILD.format(arm="", imports="import flashinfer_sm120\nimport flashinfer"),
    "autoload": _CHILD.format(arm=_ARM_HOOK, imports="import flashinfer"),
}


#: How each run is printed.
WHEN = {"later": "later processes", "first": "first process (empty cache)"}


def measure(code: str, env: dict) -> dict:
    """``{"mode": patch mode, "modules": {name: lines}}`` of one fresh child running ``code``."""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("@@"):
            return json.loads(line[2:])
    raise SystemExit(f"the child printed no result (exit {proc.returncode}):\n{proc.stderr[-3000:]}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", help="export FLASHINFER_CUDA_ARCH_LIST=ARCH to the children (e.g. 12.0)")
    ap.add_argument("--list", action="store_true", help="each module with its lines, largest first")
    ap.add_argument("--json", metavar="FILE", help="write the results as JSON")
    args = ap.parse_args(argv)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src")] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    if args.arch:
        env["FLASHINFER_CUDA_ARCH_LIST"] = args.arch
    results: dict = {}
    for name, code in MEASURES.items():
        with tempfile.TemporaryDirectory(prefix="loaded-lines-") as cache:
            child_env = dict(env, FLASHINFER_SM120_CACHE_DIR=cache)
            results[name] = {when: measure(code, child_env) for when in ("first", "later")}
    for name, runs in results.items():
        for when in ("later", "first"):
            res = runs[when]
            mods = res["modules"]
            print(f"{name}, {WHEN[when]}: {sum(mods.values())} lines in {len(mods)} modules "
                  f"(patch mode: {res['mode']})")
            if args.list:
                for mod, lines in sorted(mods.items(), key=lambda kv: (-kv[1], kv[0])):
                    print(f"  {lines:6d}  {mod}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
