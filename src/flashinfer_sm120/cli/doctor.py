"""``flashinfer-sm120 doctor``: GPUs, toolkits, the choice, and FlashInfer with and without the patch."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import shutil
import sys

from .. import __version__
from ..errors import FormatError
from ..formats import cli_float, loads_json, shown

__all__ = ["ALONE_TIMEOUT_S", "SECTIONS", "run_doctor", "add_parser"]

#: Further report sections, in print order: ``(key, module)``.  Each module (relative
#: to this package's parent) has ``doctor_section(report: dict) -> dict`` (JSON-able;
#: stored as ``report[key]``) and ``doctor_lines(section: dict) -> list[str]`` (printed).
#: A section that raises is reported as ``{"error": ...}`` and the rest still prints.
SECTIONS: tuple[tuple[str, str], ...] = (
    ("ninja", ".toolkit.ninja"),  # which ninja the server and `build` run, and conflicting ones
    ("servers", ".cli.servers_report"),  # vLLM/SGLang: their FlashInfer check, nvcc lookup and JIT dir
    ("build_line", ".cli.buildline_report"),  # variables that change every build line; servers' own targets
    ("inventory", ".verify.inventory"),  # what FlashInfer will load, with its targets
    ("caches", ".prune"),  # the size of both caches
    ("builds", ".warmup.buildreport"),  # memory seen, the build plan, the compiler-cache launcher
)

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

    FlashInfer alone runs ``<its CUDA home>/bin/nvcc --version`` at import (its
    own lookup, :func:`flashinfer_sm120.toolkit.flashinfer_naive_root`).  When
    the trust policy refuses that nvcc (:func:`flashinfer_sm120.toolkit.trace`:
    any link, wrapper or directory on the way owned or writable by another
    user), the child is not started: the result is ``{"error": "not run: ...",
    "skipped": reason}``.  Otherwise the child runs under
    :func:`flashinfer_sm120.proc.run` (``timeout`` + 60 s for the whole call,
    output capped, FlashInfer's hung nvcc and anything it detached killed).

    Returns:
        A dict with ``cuda_home``, ``cuda_version``, ``target_cuda_archs`` and
        ``jit_dir``, or ``error`` (and ``skipped`` when not run).
    """
    from .. import proc
    from ..toolkit import flashinfer_naive_root, trace

    env = dict(os.environ, FLASHINFER_SM120_DISABLE="1")
    for k in ("CUDA_HOME",):  # what the user set, not what this process exported
        if k in _ORIGINAL_ENV:
            env[k] = _ORIGINAL_ENV[k]
        else:
            env.pop(k, None)
    naive = flashinfer_naive_root(env)
    runs = []
    if not (env.get("CUDA_HOME") or env.get("CUDA_PATH")):
        # get_cuda_path() runs `which nvcc` (flashinfer/jit/cpp_ext.py), `which` from PATH;
        # run for its own sake (Debian's is a shell script), so its file and #! are checked, not its body
        which = shutil.which("which", path=env.get("PATH", os.defpath))
        if which:
            runs.append((which, False))
    if naive and os.path.lexists(os.path.join(naive, "bin", "nvcc")):
        runs.append((os.path.join(naive, "bin", "nvcc"), True))  # get_cuda_version(): nvcc --version
    for prog, body in runs:
        tr = trace(prog, body=body)
        if tr.problem:
            why = (f"FlashInfer alone would run {prog}, which the trust policy refused ({tr.problem}); "
                   f"not running it")
            return {"error": f"not run: {why}", "skipped": why}
    res = proc.run([sys.executable, "-c", _ALONE, str(timeout)], timeout=timeout + 60,
                   max_output=1 << 20, env=env)
    text = res.text()
    m = re.search(r"@@(\{.*\})\s*$", text)
    if not m:
        what = ("timed out" if res.timed_out else f"exit {res.returncode}") + (
            f", {res.error}" if res.error else "")
        return {"error": f"{what}: {text.strip()[-400:]}"}
    try:  # the child's report, read like any other outside input
        return loads_json(m.group(1), "the FlashInfer-alone child's report")
    except FormatError as exc:
        return {"error": str(exc)}


_ORIGINAL_ENV = {k: v for k, v in os.environ.items() if k in ("CUDA_HOME", "CUDA_PATH")}


def run_doctor(args: argparse.Namespace) -> int:
    from .. import patch, toolkit
    from ..gpus import query
    from ..patch.resolve import cleaned_homes, flashinfer_version
    from ..releases import release_info

    report: dict = {"flashinfer_sm120": __version__, "python": sys.executable}
    report["original_env"] = dict(_ORIGINAL_ENV, **{k: os.environ[k] for k in ("PATH", "FLASHINFER_WORKSPACE_BASE")
                                                    if k in os.environ})
    try:  # the installed server's cache redirection (SGLang), before FlashInfer is imported
        from ..warmup.session import apply_server_cache

        report["server_cache"] = apply_server_cache(strict=False)
    except Exception as exc:
        report["server_cache"] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
    report["torch_from"] = _installed("torch")  # "not installed" is not a CPU build
    report["flashinfer_installed"] = _installed("flashinfer") is not None
    report["flashinfer"] = flashinfer_version() if report["flashinfer_installed"] else None
    release = release_info(report["flashinfer"])
    report["release"] = release.to_dict()
    report["torch_cuda"] = toolkit.torch_cuda_version()  # imports torch: the GPU fallback may use it
    gq = query()
    report["gpu_source"] = gq.describe()
    report["gpus"] = [
        {"index": g.index, "name": g.name, "capability": f"{g.capability[0]}.{g.capability[1]}"}
        for g in gq.gpus
    ]
    arch_list = os.environ.get("FLASHINFER_CUDA_ARCH_LIST")  # as read; cut when it is too long to be one
    report["FLASHINFER_CUDA_ARCH_LIST"] = arch_list if arch_list is None or len(arch_list) <= 4096 else (
        arch_list[:200] + f"... ({len(arch_list)} characters)")
    report["cleaned"] = list(cleaned_homes(dict(os.environ, **_ORIGINAL_ENV)))
    candidates = list(toolkit.discover())  # every one read, once
    report["candidates"] = [tk.to_dict() for tk in candidates]
    verdicts: dict[str, str] = {}
    try:
        res = patch.resolve(toolkits=candidates, release=release, guard=True)
        if res.guard:
            report["resolution_error"] = res.error
            report["guard"] = True
            report["fix"] = res.fix
        else:
            report["resolution"] = res.to_dict()
            verdicts[res.choice.toolkit.root] = "CHOSEN: " + res.choice.reason
            from ..toolkit.model import RejectKind

            for r in res.choice.rejected:
                lost = r.kind in (RejectKind.USABLE, RejectKind.NOT_CHOSEN)
                verdicts.setdefault(r.toolkit.root, ("not chosen: " if lost else "rejected: ")
                                    + (f"({r.why})" if r.kind is RejectKind.NOT_CHOSEN else r.why))
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

        report["after"] = {"status": patch.status(), "jit_dir": str(jit_env.FLASHINFER_JIT_DIR)}
        if report["after"]["status"]["mode"] != "guard":  # guarded: FlashInfer's own nvcc, not run here
            report["after"].update(cuda_home=cx.get_cuda_path(), cuda_version=str(cx.get_cuda_version()))
        from .. import environ  # what the rest of the process and its children get

        report["after"]["exported"] = environ.exported()
    except Exception as exc:
        report["after"] = {"status": patch.status(), "error": repr(exc)}
    from .. import autoload  # deploy: is the .pth installed for this interpreter?

    report["autoload"] = autoload.doctor_report()
    for key, module in SECTIONS:
        try:
            report[key] = importlib.import_module(module, __package__.rpartition(".")[0]).doctor_section(report)
        except Exception as exc:  # one broken section never hides the rest
            report[key] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
    if getattr(args, "smoke", False):  # doctor --smoke: build (and run) a tiny kernel now
        from ..verify import smoke

        report["smoke"] = smoke.run_smoke().to_dict()
    ok = ("resolution" in report and report["flashinfer_installed"]
          and report.get("smoke", {"ok": True})["ok"])
    if args.json:
        print(json.dumps(report, indent=2, default=str))
        return 0 if ok else 1
    _print_doctor(report)
    return 0 if ok else 1


def _installed(name: str) -> str | None:
    """Where ``name`` would be imported from, or ``None`` when it is not installed (nothing imported)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    return (spec.origin or name) if spec is not None else None


def _print_doctor(r: dict) -> None:
    from ..formats import printable

    def p(*parts, **kw) -> None:
        # threat-model: P8 -- module and file names found on disk are shown, never acted on by the terminal
        print(*(printable(str(x)) for x in parts), **kw)
    rel = r["release"]
    torch = ("torch: not installed" if r.get("torch_from") is None
             else f"torch CUDA {r['torch_cuda'] or 'none (CPU build)'}")
    fi = f"flashinfer {r['flashinfer']}" if r.get("flashinfer_installed") else "flashinfer: not installed"
    p(f"flashinfer-sm120 {r['flashinfer_sm120']}  {fi}  {torch}")
    if not r.get("flashinfer_installed"):
        p(f"FlashInfer is not installed for {r['python']}: pip install flashinfer-python")
    if rel["supported"]:
        p(f"FlashInfer release: era {rel['era']}: {rel['arch_rules']}"
          + (f"; needs nvcc >= {rel['min_nvcc']} ({rel['min_nvcc_why']})" if rel["min_nvcc"] else ""))
    else:
        p(f"FlashInfer release: {rel['reason']}")
    p(f"\nGPUs (from {r['gpu_source']}; CUDA_VISIBLE_DEVICES applied):")
    for g in r["gpus"]:
        p(f"  [{g['index']}] {g['name']}  compute capability {g['capability']}")
    if not r["gpus"]:
        p("  none")
    if r["FLASHINFER_CUDA_ARCH_LIST"] is not None:
        p(f"FLASHINFER_CUDA_ARCH_LIST={shown(r['FLASHINFER_CUDA_ARCH_LIST'], 200)}")
    for note in r["cleaned"]:
        p(f"CUDA_HOME/CUDA_PATH cleaned: {note}")
    p("\nCUDA toolkits found (preference order):")
    for c in r["candidates"]:
        if c.get("problem") and not c["nvcc_full"] and not c["header_version"]:  # refused: the reason only
            p(f"  {c['root']}  (found via {', '.join(c['sources'])})\n      {c.get('verdict') or ''}")
            continue
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
        p(f"  targets: {', '.join(ch['targets']) or 'none (no GPU visible and no FLASHINFER_CUDA_ARCH_LIST: to check the choice for GPUs not present, run e.g. FLASHINFER_CUDA_ARCH_LIST=12.0 flashinfer-sm120 doctor)'}")
        if res.get("arch_list_error"):
            p(f"  arch list ignored: {res['arch_list_error']}")
    elif r.get("guard"):
        p(f"\nNo usable toolkit: FlashInfer is GUARDED (it imports; its first JIT build raises "
          f"this message):\n{r.get('resolution_error')}")
        from ..servers import fallback_text  # after the real fix: the installed server's ways around

        if fallback_text():
            p(fallback_text())
    else:
        p(f"\nNo usable toolkit: {r.get('resolution_error')}")
    b = r["before"]
    p("\nFlashInfer alone:   " + (f"CUDA_HOME={b.get('cuda_home')}  {_alone_cuda(b, r.get('torch_cuda'))}"
                                 f"  TARGET_CUDA_ARCHS={b.get('target_cuda_archs')}"
                                 if "error" not in b else f"error: {b['error']}"))
    a = r["after"]
    st = a["status"]
    if st["mode"] == "guard":
        p("With flashinfer-sm120 (guard): FlashInfer keeps its own toolkit and targets, and its JIT "
          "builds raise the message above instead of running nvcc")
    else:
        p(f"With flashinfer-sm120 ({st['mode']}): "
          + (f"CUDA_HOME={a.get('cuda_home')}  CUDA {a.get('cuda_version')}  "
             f"TARGET_CUDA_ARCHS={st.get('target_cuda_archs')}  JIT dir {a.get('jit_dir')}"
             if "error" not in a else f"error: {a['error']}"))
    skipped = {k: v for k, v in st.get("steps", {}).items() if v.startswith("skipped")}
    if skipped:
        p("  steps skipped: " + ", ".join(f"{k} ({v})" for k, v in skipped.items()))
    if st.get("error") and st["mode"] != "guard":
        p(f"  patch error: {st['error']}")
    from .. import environ  # deploy: the autoload and what the process exports
    from .enable import autoload_lines

    for line in autoload_lines(r.get("autoload"), r["python"]):
        p(line)
    p("Exported to this process and its children:")
    for line in environ.describe(a.get("exported", {})):
        p(f"  {line}")
    for key, module in SECTIONS:
        section = r.get(key) or {}
        if "error" in section:
            p(f"{key}: could not be checked ({section['error']})")
            continue
        for line in importlib.import_module(module, __package__.rpartition(".")[0]).doctor_lines(section):
            p(line)
    if "smoke" in r:
        from ..verify.smoke import smoke_lines

        for line in smoke_lines(r["smoke"]):
            p(line)


def _alone_cuda(b: dict, torch_cuda) -> str:
    """FlashInfer alone's CUDA version, saying when it is torch's fallback, not an nvcc
    (``get_cuda_version``, flashinfer/jit/cpp_ext.py 0.7.x: ``nvcc --version``, and on
    ``FileNotFoundError`` ``torch.version.cuda``)."""
    home = b.get("cuda_home")
    if home and not os.path.lexists(os.path.join(home, "bin", "nvcc")):
        return (f"no nvcc (CUDA version would come from torch: {b.get('cuda_version') or torch_cuda})"
                if b.get("cuda_version") else f"no nvcc ({b.get('cuda_version_error')})")
    return f"CUDA {b.get('cuda_version', b.get('cuda_version_error'))}"


def add_parser(sub) -> None:
    """Register the ``doctor`` subcommand on an argparse subparsers object."""
    d = sub.add_parser("doctor", help="show GPUs, toolkits, the choice and the patch status")
    d.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    d.add_argument("--timeout", type=cli_float("--timeout", 0.1, 3600.0), default=ALONE_TIMEOUT_S,
                   metavar="SECONDS",
                   help="how long unpatched FlashInfer may take in its child process "
                        f"(it runs nvcc without a timeout; default {ALONE_TIMEOUT_S:g})")
    d.add_argument("--smoke", action="store_true",
                   help="also compile and link a tiny kernel with the chosen toolkit and FlashInfer's own "
                        "flags, and run it when a GPU is visible (under 30 s; exit 1 naming the failing step)")
    d.set_defaults(func=run_doctor)
