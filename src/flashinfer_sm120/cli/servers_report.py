"""``doctor``'s servers section: per installed vLLM/SGLang, its FlashInfer check, the nvcc its
lookup finds and the JIT directory it would use (data: :mod:`flashinfer_sm120.core.facts.servers`, lookups:
:mod:`flashinfer_sm120.core.facts.serverprobe`)."""

from __future__ import annotations

import os

from flashinfer_sm120.core.facts import serverprobe, servers
from flashinfer_sm120.core.facts.workspace import workspace_base
from flashinfer_sm120.core.toolkit.naive import flashinfer_naive_root

__all__ = ["doctor_section", "doctor_lines"]


def doctor_section(report: dict) -> dict:
    """``doctor``'s servers part: per installed server, its FlashInfer check now (vLLM:
    ``has_flashinfer()`` without and with the exported toolkit), the nvcc its lookup finds,
    and the JIT directory it would use."""
    after = report.get("after") or {}
    exported = bool(after.get("exported"))
    original = dict(os.environ)
    for k in ("CUDA_HOME", "CUDA_PATH", "PATH", "FLASHINFER_WORKSPACE_BASE"):
        original.pop(k, None)
    original.update((report.get("original_env") or {}))
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
    return {"servers": out, "autoload": bool((report.get("autoload") or {}).get("pth")), "exported": exported,
            "applied": report.get("server_cache") or {}}


def doctor_lines(section: dict) -> list[str]:
    """:func:`doctor_section` as printed."""
    found = section.get("servers") or []
    if not found:
        return ["Servers: neither vLLM nor SGLang is installed here"]
    lines = ["Servers installed here:"]
    applied = section.get("applied") or {}
    if applied.get("changed"):
        lines.append(f"  this report uses {applied['server']}'s FLASHINFER_WORKSPACE_BASE={applied['base']}, as "
                     f"importing it would ({applied['how']}); 'flashinfer-sm120 build' does the same")
    elif applied.get("error") or (applied.get("server") is None and "different" in applied.get("why", "")):
        lines.append(f"  JIT directory of this report: FlashInfer's own ({applied.get('error') or applied['why']}; "
                     f"'flashinfer-sm120 build --for vllm|sglang' picks one)")
    for s in found:
        lines.append(f"  {s['label']}: {s['check']}")
        if "without" in s:
            val, why = s["without"]
            lines.append(f"    has_flashinfer() without flashinfer-sm120: {val} ({why})")
            if s.get("with") is not None:
                val, why = s["with"]
                lines.append(f"    has_flashinfer() once flashinfer-sm120 exports its toolkit: {val} ({why})")
            if not section.get("autoload"):
                lines.append("    the autoload is not enabled, so the server runs without flashinfer-sm120: "
                             "run 'flashinfer-sm120 enable'")
        def nvcc(home: str) -> str:
            return os.path.join(home, "bin", "nvcc") + ("" if os.path.exists(os.path.join(home, "bin", "nvcc"))
                                                        else " (absent)")

        found = f"without flashinfer-sm120 {nvcc(s['nvcc_without'])}"
        if s.get("nvcc_with") and s["nvcc_with"] != s["nvcc_without"]:
            found += f"; once it exports its toolkit {nvcc(s['nvcc_with'])}"
        lines.append(f"    nvcc its lookup finds ({s['nvcc_lookup']}): {found}")
        lines.append(f"    JIT dir: {s['jit_dir'] or '? (FlashInfer not imported)'}"
                     + (f"  (FLASHINFER_WORKSPACE_BASE={s['workspace_base']}: {s['workspace_how']})"
                        if s.get("workspace_base") is not None else ""))
    return lines
