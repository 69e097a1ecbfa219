"""How ``doctor`` prints: the one rule for long lines (:func:`wrap`), and one renderer per section of
:func:`flashinfer_sm120.diagnose.verify.report.collect` for ``--verbose``."""

from __future__ import annotations

import os
import textwrap

from flashinfer_sm120.safety.formats.base import plural, shown

__all__ = ["WIDTH", "wrap", "ninja_lines", "servers_lines", "build_line_lines", "inventory_lines", "human",
           "caches_lines", "autoload_lines"]

#: Characters per line of the default report.  Text wraps at spaces only: a path, command or fix
#: is never cut; one longer than this gets a line of its own (copied whole).
WIDTH = 120


def wrap(text: str, indent: str = "  ") -> list[str]:
    """``text`` wrapped at :data:`WIDTH` at spaces only, later lines indented."""
    return textwrap.wrap(text, WIDTH, subsequent_indent=indent, break_long_words=False,
                         break_on_hyphens=False) or [text]


def exported_lines(info: dict) -> list[str]:
    """:func:`flashinfer_sm120.core.jitenv.environ.exported` as printed, one line per item."""
    if not info:
        return ["nothing exported (FlashInfer not patched in this process)"]
    lines = [f"CUDA_HOME={info['cuda_home']}"]
    for k in ("CUDA_PATH", "PATH", "ninja", "torch.utils.cpp_extension.CUDA_HOME", "triton"):
        if k in info:
            lines.append(f"{k}: {info[k]}")
    lines.append(f"which nvcc: {info.get('which_nvcc')}")
    if "which_ninja" in info:
        lines.append(f"which ninja: {info['which_ninja']}")
    return lines


def ninja_lines(section: dict) -> list[str]:
    """:func:`flashinfer_sm120.diagnose.verify.report.ninja_section` as printed."""
    if "chosen" not in section:
        return [f"Ninja: none usable: {section.get('error')}"]
    c = section["chosen"]
    fmt = f".ninja_log v{c['log_format']}" if c["log_format"] else ".ninja_log format unknown"
    lines = [f"Ninja (FlashInfer's JIT builds and 'flashinfer-sm120 build' run it): {c['path']} "
             f"(ninja {c['version']}, {fmt}; {', '.join(c['sources'])})"]
    which = section.get("which_ninja")
    if which and os.path.realpath(which) != c["real"]:
        lines.append(f"  which ninja in this shell: {which} (a server process gets the one above first on "
                     f"PATH once flashinfer-sm120 exports its toolkit)")
    elif not which:
        lines.append("  which ninja in this shell: none (a server process gets the one above on PATH once "
                     "flashinfer-sm120 exports its toolkit)")
    stale = {k: v for k, v in (section.get("cache_log_formats") or {}).items() if str(k) != str(c["log_format"])}
    if stale and c["log_format"]:
        lines.append(f"  WARNING: {plural(sum(stale.values()), 'module')} in {section.get('jit_dir')} were built by a ninja "
                     f"with .ninja_log v{', v'.join(sorted(stale))}: {c['path']} will rebuild them. Fix: "
                     f"'flashinfer-sm120 build' them again (it runs {c['path']})")
    return lines


def servers_lines(section: dict) -> list[str]:
    """:func:`flashinfer_sm120.diagnose.verify.report.servers_section` as printed."""
    found = section.get("servers") or []
    if not found:
        return ["Servers: neither vLLM nor SGLang is installed here"]
    lines = ["Servers installed here:"]
    applied = section.get("applied") or {}
    if applied.get("changed"):
        lines.append(f"  this report uses {applied['server']}'s FLASHINFER_WORKSPACE_BASE={applied['base']}, as "
                     f"importing it would ({applied['how']}); 'flashinfer-sm120 build' does the same")
    elif applied.get("error") or ("why" in applied and applied.get("server") is None):  # servers here differ
        lines.append(f"  JIT directory of this report: FlashInfer's own ({applied.get('error') or applied['why']}; "
                     f"'flashinfer-sm120 build --for vllm|sglang' picks one)")

    def nvcc(home: str) -> str:
        path = os.path.join(home, "bin", "nvcc")
        return path + ("" if os.path.exists(path) else " (absent)")

    for s in found:
        lines.append(f"  {s['label']}: {s['check']}")
        if "without" in s:
            lines.append("    has_flashinfer() without flashinfer-sm120: {} ({})".format(*s["without"]))
            if s.get("with") is not None:
                lines.append("    has_flashinfer() once flashinfer-sm120 exports its toolkit: {} ({})".format(*s["with"]))
            if not section.get("autoload"):
                lines.append("    the autoload is not enabled, so the server runs without flashinfer-sm120: "
                             "run 'flashinfer-sm120 enable'")
        where = f"without flashinfer-sm120 {nvcc(s['nvcc_without'])}"
        if s.get("nvcc_with") and s["nvcc_with"] != s["nvcc_without"]:
            where += f"; once it exports its toolkit {nvcc(s['nvcc_with'])}"
        lines.append(f"    nvcc its lookup finds ({s['nvcc_lookup']}): {where}")
        lines.append(f"    JIT dir: {s['jit_dir'] or '? (FlashInfer not imported)'}"
                     + (f"  (FLASHINFER_WORKSPACE_BASE={s['workspace_base']}: {s['workspace_how']})"
                        if s.get("workspace_base") is not None else ""))
    return lines


def build_line_lines(section: dict) -> list[str]:
    """:func:`flashinfer_sm120.diagnose.verify.report.build_line_section` as printed (the rest are findings)."""
    lines = ["\nBuild line (what makes a warm module rebuild):"]
    if not section.get("set"):
        lines.append("  no FlashInfer variable that changes the build line is set")
    stale = section.get("stale") or {}
    for path, changed in list(stale.items())[:20]:
        what = ", ".join(f"{c['name']} {c['built'] or '(unset)'} then, {c['now'] or '(unset)'} now" for c in changed)
        lines.append(f"  {path} was built with other values ({what}): it will be rebuilt")
    if len(stale) > 20:
        lines.append(f"  ... and {len(stale) - 20} more modules built with other values")
    for a in section.get("server_arch") or ():
        if not a["value"]:
            lines.append(f"  {a['name']} leaves {a['variable']} as it is here ({a['function']}; {a['how']})")
    return lines


def inventory_lines(section: dict) -> list[str]:
    """:func:`flashinfer_sm120.diagnose.verify.inventory.doctor_section` as printed."""
    lines = [f"\nWhat FlashInfer will load (checked against {section.get('against', 'the GPUs')}; targets via "
             f"{section['cuobjdump'] or 'ELF headers only: no cuobjdump, pip install nvidia-cuda-cuobjdump'}):"]
    if not section["places"]:
        lines.append("  nothing built yet and no prebuilt kernel package installed")
    for place in section["places"]:
        lines.append(f"  {place['label']}: {place['path']}")
        if place["kind"] == "flashinfer-cubin":
            by = ", ".join(f"{k} x{v}" for k, v in place["by_sm"].items()) or "none readable"
            lines.append(f"    {plural(place['cubins'], 'cubin')}{' (more not read)' if place['more'] else ''}: {by}")
            if place["note"]:
                lines.append(f"    note: {place['note']}")
            continue
        if place.get("declared"):
            lines.append(f"    declares {', '.join(place['declared'])}")
        if not place["modules"]:
            lines.append("    no modules built")
        if place.get("other_targets"):
            built = ", ".join(f"{d} ({n})" for d, n in place["other_targets"].items())
            lines.append(f"    modules built with this toolkit for other targets: {built}; set "
                         f"FLASHINFER_CUDA_ARCH_LIST (e.g. 12.0) to inspect them")
        for m in place["modules"]:
            held = ", ".join(m["sass"] + m["ptx"]) or (m["note"] or "?")
            flag = "PROBLEM " if m["problem"] else ""
            lines.append(f"    {flag}{m['name']}: {held} ({'?' if m['bytes'] is None else human(m['bytes'])})")
            if m["known"] and m["note"] and (m["sass"] or m["ptx"]):
                lines.append(f"      {m['note']}")
            if m["problem"]:
                lines.append(f"      {m['problem']}")
            elif m["caution"]:
                lines.append(f"      caution: {m['caution']}")
        if place.get("not_inspected"):
            lines.append(f"    ... and {plural(place['not_inspected'], 'more module')} not inspected")
    if section["problems"]:
        lines.append(f"  {plural(section['problems'], 'module holds', 'modules hold')} no code a GPU here can run: see PROBLEM above")
    return lines


def human(n: int) -> str:
    """``1.5 GiB``."""
    v = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if v < 1024 or unit == "TiB":
            return f"{v:.0f} {unit}" if unit == "B" else f"{v:.1f} {unit}"
        v /= 1024
    return f"{n} B"


def caches_lines(section: dict) -> list[str]:
    """:func:`flashinfer_sm120.diagnose.prune.doctor_section` as printed."""
    lines = ["\nCaches:"]
    for r in section["roots"]:
        if r["path"]:
            lines.append(f"  {r['what']}: {r['path']} ({human(r['bytes'])})")
    if section["stale"]:
        lines.append(f"  {plural(section['stale'], 'stale entry', 'stale entries')}, {human(section['stale_bytes'])}: "
                     f"'flashinfer-sm120 cache prune' lists them, '... --yes' removes them")
    return lines


def autoload_lines(report: dict | None, python: str) -> list[str]:
    """:func:`flashinfer_sm120.diagnose.autoload.doctor_report` as printed."""
    from flashinfer_sm120.core.autoload_hook import HOOK_FILE

    report = report or {}
    if report.get("pth"):
        return [f"Autoload: {', '.join(report['pth'])}: every process of {python} is patched when it first "
                f"imports {', '.join(report['triggers'])}"
                + (" (but FLASHINFER_SM120_DISABLE is set)" if report.get("disabled") else "")] + [
            f"  {p} was not written by this release, or its module {HOOK_FILE} is missing: run "
            f"'flashinfer-sm120 enable' again" for p in report.get("outdated") or ()]
    return [f"Autoload: not enabled for {python} ('flashinfer-sm120 enable' to patch every worker)"]

