"""What ``doctor`` reports, as JSON-able data (GPUs, toolkits, the choice, FlashInfer with and without the patch,
further sections); nothing here prints: :mod:`.diagnosis` judges it, :mod:`flashinfer_sm120.cli.doctor` renders."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Callable, Sequence

from flashinfer_sm120 import __version__
from flashinfer_sm120.errors import FormatError
from flashinfer_sm120.safety.formats.reads import loads_json
from flashinfer_sm120.safety.formats.fields import iter_lines
from flashinfer_sm120.safety.formats.params import parse_ninja_log_header
from flashinfer_sm120.safety.formats.base import shown

#: Seconds ``doctor`` lets unpatched FlashInfer run in its child process.  FlashInfer
#: runs ``nvcc --version`` without a timeout, so a hung nvcc would hang it forever.
ALONE_TIMEOUT_S = 60.0
#: Bytes of output the FlashInfer-alone child may print (its report is a few hundred).
_ALONE_MAX_OUTPUT = 1 << 20

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
    """What unpatched FlashInfer computes, from a child with the shim off; none starts when it would run a refused program (P2)."""
    from flashinfer_sm120.core.patch.state import STATE
    from flashinfer_sm120.safety import proc
    from flashinfer_sm120.core.toolkit.sources import flashinfer_naive_root
    from flashinfer_sm120.safety.trust import trace

    base = os.environ.get("FLASHINFER_WORKSPACE_BASE") or os.path.expanduser("~")
    scratch = os.path.join(STATE.listing_dir(), "alone") if STATE.listing else None  # P4: its import makes one
    if scratch:  # and its dependencies' temporary files (cuda-tile's, which its atexit never removes: os._exit)
        os.makedirs(scratch, exist_ok=True)
    env = dict(os.environ, FLASHINFER_SM120_DISABLE="1",
               **({"FLASHINFER_WORKSPACE_BASE": scratch, "TMPDIR": scratch} if scratch else {}))
    env.pop("CUDA_HOME", None)  # what the user set, not what this process exported
    env.update({k: v for k, v in _ORIGINAL_ENV.items() if k == "CUDA_HOME"})
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
                   max_output=_ALONE_MAX_OUTPUT, env=env)
    text = res.text()
    m = re.search(r"@@(\{.*\})\s*$", text)
    if not m:
        last = f"; its last output: {shown(text.strip()[-80:], 80)}" if text.strip() else ""
        nvcc = os.path.join(naive, "bin", "nvcc") if naive else None
        look = (f"run '{nvcc} --version' and 'python -c \"import flashinfer\"' by hand to see which"
                if nvcc else "run 'python -c \"import flashinfer\"' by hand to see why")
        what = (f"was killed after printing more than {_ALONE_MAX_OUTPUT >> 20} MiB (FlashInfer's import or the nvcc "
                f"it runs floods its output)" if res.truncated else f"was killed after {timeout + 60:g} s"
                if res.timed_out else f"exited with status {res.returncode}{f' ({res.error})' if res.error else ''}")
        return {"error": f"the child {what}; {look}{', and fix or remove that toolkit' if res.truncated else ''}{last}"}
    try:  # the child's report, read like any other outside input
        out = loads_json(m.group(1), "the FlashInfer-alone child's report")
    except FormatError as exc:
        return {"error": str(exc)}
    if scratch and isinstance(out.get("jit_dir"), str) and out["jit_dir"].startswith(scratch + os.sep):
        out["jit_dir"] = base + out["jit_dir"][len(scratch):]  # where FlashInfer alone would have it
    return out


_ORIGINAL_ENV = {k: v for k, v in os.environ.items() if k in ("CUDA_HOME", "CUDA_PATH")}


def ninja_section(report: dict) -> dict:
    """The chosen ninja, every reachable one, those of another log format, and the JIT dir's log formats."""
    from flashinfer_sm120.core.toolkit import ninja

    found = ninja.candidates()
    out: dict = {"candidates": [n.to_dict() for n in found], "which_ninja": ninja.on_path()}
    try:
        chosen = ninja.choose(found=found)
    except ninja.NinjaError as exc:
        out["error"] = str(exc)
        return out
    out["chosen"] = chosen.to_dict()
    out["conflicts"] = [n.to_dict() for n in found if n.problem is None and not ninja.same_log(n, chosen)]
    jit_dir = (report.get("after") or {}).get("jit_dir")
    try:
        names = sorted(os.listdir(jit_dir))[:512] if jit_dir else []
    except OSError:
        names = []
    formats = (log_format_of_dir(os.path.join(jit_dir, name)) for name in names)
    out.update(jit_dir=jit_dir, cache_log_formats=dict(collections.Counter(str(f) for f in formats if f is not None)))
    return out


def log_format_of_dir(build_dir: str) -> int | None:
    """The ``.ninja_log`` format in ``build_dir`` (its first line), or ``None``."""
    log = os.path.join(build_dir, ".ninja_log")
    with contextlib.suppress(FormatError):
        for _n, line in iter_lines(log, max_line=64, max_lines=1):
            return parse_ninja_log_header(line, log)
    return None


def collect(timeout: float = ALONE_TIMEOUT_S, *, sections: Sequence[tuple[str, Callable[[dict], dict]]] = (),
            say: Callable[[str], None] | None = None, server_cache: dict | None = None, arch: str | None = None) -> dict:
    """Everything ``doctor`` reports: the core part, then ``sections``, ``(key, collector(report) -> dict)`` in
    order (each reads those before it)."""
    from flashinfer_sm120.core import patch
    from flashinfer_sm120.diagnose import autoload
    from flashinfer_sm120.core.facts.refusals import import_refused
    from flashinfer_sm120.core.toolkit.policy import torch_cuda_version
    from flashinfer_sm120.core.toolkit.sources import discover
    from flashinfer_sm120.core.facts.gpus import query
    from flashinfer_sm120.core.facts.precompiled import dist_version
    from flashinfer_sm120.core.patch.decide import for_messages, resolve
    from flashinfer_sm120.core.patch.state import flashinfer_version
    from flashinfer_sm120.core.facts.releases import release_info
    from flashinfer_sm120.core.facts.serverprobe import fallback_text
    from flashinfer_sm120.core.toolkit.model import RejectKind
    from flashinfer_sm120.safety.formats.reads import env_flag

    original = dict(_ORIGINAL_ENV, **{k: os.environ[k] for k in ("PATH", "FLASHINFER_WORKSPACE_BASE") if k in os.environ})
    report: dict = {"flashinfer_sm120": __version__, "python": sys.executable, "torch_version": dist_version("torch"),
                    "original_env": original, "server_cache": server_cache,
                    "torch_from": _installed("torch"),  # "not installed" is not a CPU build
                    "prefix": sys.prefix, "virtual_env": os.environ.get("VIRTUAL_ENV")}
    report["flashinfer_installed"] = _installed("flashinfer") is not None
    report["flashinfer"] = flashinfer_version() if report["flashinfer_installed"] else None
    release = release_info(report["flashinfer"])
    report["release"] = release.to_dict()
    report["torch_cuda"] = torch_cuda_version()  # imports torch: the GPU fallback may use it
    gq = query()
    report["gpu_source"] = gq.describe()
    report["gpus"] = [{"index": g.index, "name": g.name, "capability": "%d.%d" % g.capability} for g in gq.gpus]
    report["FLASHINFER_CUDA_ARCH_LIST"] = for_messages(os.environ.get("FLASHINFER_CUDA_ARCH_LIST"))  # as read, cut
    candidates = list(discover())  # every one read, once
    report["candidates"] = [tk.to_dict() for tk in candidates]
    states: dict[str, tuple[str, str]] = {}  # root -> (chosen | usable | rejected, why)
    try:
        res = resolve(toolkits=candidates, release=release, guard=True)
        report["settings"] = [dataclasses.asdict(s) for s in res.settings]
        if res.guard:
            report["resolution_error"] = res.error
            report["guard"] = True
            report["fix"] = res.fix
            report["fallbacks"] = fallback_text()  # after the fix: the installed servers' ways around
        else:
            report["resolution"] = res.to_dict()
            states[res.choice.toolkit.root] = ("chosen", res.choice.reason)
            state = {RejectKind.USABLE: "usable", RejectKind.NOT_EXAMINED: "not examined"}
            for r in res.choice.rejected:  # usable: would work too; not examined: the pick came first
                states.setdefault(r.toolkit.root, (state.get(r.kind, "rejected"), r.why))
    except Exception as exc:
        report["resolution_error"] = str(exc)
    for c in report["candidates"]:
        c["state"], c["why"] = states.get(c["root"]) or (("rejected", c["problem"]) if c["problem"] else ("", ""))
    report["disabled"] = env_flag("FLASHINFER_SM120_DISABLE")
    refusal = import_refused()  # threat-model: P4: either import of FlashInfer would write where it must not
    report["import_refused"] = dataclasses.asdict(refusal) if refusal else None
    if refusal is not None:
        report["before"] = {"error": f"not run: {refusal}", "skipped": str(refusal)}
        report["after"] = {"status": patch.status(), "error": str(refusal)}
    else:
        if say is not None:
            say(f"(asking unpatched FlashInfer in a child process, up to {timeout:g} s ...)")
        report["before"] = _flashinfer_alone(timeout)
        report["after"] = _with_shim()
    report["autoload"] = autoload.doctor_report()  # deploy: is the .pth installed for this interpreter?
    report["arch_option"] = arch
    for key, collector in sections:
        try:
            report[key] = collector(report)
        except Exception as exc:  # one broken section never hides the rest
            report[key] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
    return report


def _with_shim() -> dict:
    """What FlashInfer computes once imported here, with flashinfer-sm120's hooks, and what every build would refuse."""
    from flashinfer_sm120.core import patch
    from flashinfer_sm120.core.facts.refusals import builds_refused
    from flashinfer_sm120.core.jitenv import environ
    from flashinfer_sm120.safety.compilers import path_problem

    try:
        import flashinfer.jit.core  # noqa: F401  (triggers the hooks)
        import flashinfer.jit.env as jit_env
        import flashinfer.jit.cpp_ext as cx

        after = {"status": patch.status(), "jit_dir": str(jit_env.FLASHINFER_JIT_DIR)}
        if after["status"]["mode"] != "guard":  # guarded: FlashInfer's own nvcc, not run here
            after.update(cuda_home=cx.get_cuda_path(), cuda_version=str(cx.get_cuda_version()))
        after["exported"] = environ.exported()  # what the rest of the process and its children get
        host = path_problem(os.environ)  # what every build would run by name, on the exported PATH
        after["host_program"] = dataclasses.asdict(host) if host else None
        after["builds_refused"] = builds_refused(after["jit_dir"])  # the gate's list
        return after
    except Exception as exc:
        from flashinfer_sm120.core.facts.refusals import import_failure

        st = patch.status()
        return {"status": st, "error": import_failure(exc, st)}


def _installed(name: str) -> str | None:
    """Where ``name`` would be imported from, or ``None`` when it is not installed (nothing imported)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    return (spec.origin or name) if spec is not None else None


# ----------------------------------------------------------------------------- further sections


def servers_section(report: dict) -> dict:
    """Per installed vLLM/SGLang: its FlashInfer check, the nvcc its lookup finds and its JIT directory."""
    from flashinfer_sm120.core.facts import serverprobe, servers
    from flashinfer_sm120.core.facts.workspace import workspace_base
    from flashinfer_sm120.core.toolkit.sources import flashinfer_naive_root

    after = report.get("after") or {}
    exported = bool(after.get("exported"))
    original = {k: v for k, v in os.environ.items() if k not in ("CUDA_HOME", "CUDA_PATH", "PATH",
                                                                   "FLASHINFER_WORKSPACE_BASE")}
    original.update(report.get("original_env") or {})
    this_base = workspace_base()[0]
    out = []
    for inst in servers.installed():
        key = inst.release.key
        item: dict = {"server": key, "label": inst.label(), "check": inst.release.flashinfer_check,
                      "nvcc_lookup": inst.release.nvcc_lookup}
        if inst.release.needs_nvcc_and_ninja:
            item["without"] = serverprobe.vllm_has_flashinfer(original)
            item["with"] = serverprobe.vllm_has_flashinfer(dict(os.environ)) if exported else None
        item["nvcc_without"] = flashinfer_naive_root(original, server=True)
        item["nvcc_with"] = flashinfer_naive_root(dict(os.environ), server=True) if exported else None
        base, how = serverprobe.workspace_base(key, original)
        item["workspace_base"], item["workspace_how"] = base, how
        eff = base if base is not None else workspace_base(original)[0]
        item["jit_dir"] = serverprobe.jit_dir_for(eff, after.get("jit_dir"), this_base)
        out.append(item)
    return {"servers": out}


def build_line_section(report: dict) -> dict:
    """Variables that change every build line, modules built with other values, and each server's own targets."""
    from flashinfer_sm120.core.facts import buildline, serverprobe, servers

    env = dict(os.environ)
    version = report.get("flashinfer") if isinstance(report.get("flashinfer"), str) else None
    now = buildline.snapshot(env, version)
    out: dict = {"set": [{"name": var.name, "value": value, "read": var.read.name, "enters": var.enters,
                          "where": var.where} for var, value in buildline.settings(env, version)]}
    dirs = [(report.get("after") or {}).get("jit_dir")]
    dirs += [s.get("jit_dir") for s in ((report.get("servers") or {}).get("servers") or ())]
    stale = {}
    for d in dict.fromkeys(d for d in dirs if d):
        for module, changed in buildline.stale(Path(d), now).items():
            stale[os.path.join(d, module)] = [c.__dict__ for c in changed]
    out["stale"] = stale
    caps = [tuple(int(x) for x in c.split(".")) for c in
            (((report.get("resolution") or {}).get("choice") or {}).get("capabilities") or ())]
    choices = (serverprobe.server_arch(inst.release.key, caps, env) for inst in servers.installed() if caps)
    out["server_arch"] = [dataclasses.asdict(c) for c in choices if c is not None]
    return out
