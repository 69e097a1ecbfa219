"""How ``doctor --verbose`` prints the sections whose data the domain modules collect
(:func:`flashinfer_sm120.core.toolkit.ninja.doctor_section`, :func:`flashinfer_sm120.diagnose.verify.inventory.doctor_section`,
:class:`flashinfer_sm120.diagnose.verify.smoke.SmokeResult`)."""

from __future__ import annotations

import os
from flashinfer_sm120.safety.formats import plural

__all__ = ["ninja_lines", "inventory_lines", "smoke_lines"]


def ninja_lines(section: dict) -> list[str]:
    """:func:`flashinfer_sm120.core.toolkit.ninja.doctor_section` as printed."""
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
    for n in section.get("conflicts") or []:
        other = f".ninja_log v{n['log_format']}" if n["log_format"] else "another .ninja_log format"
        head = (f"  WARNING: {n['path']} (ninja {n['version']}, {other}) is reachable too, and each of the two "
                f"rebuilds every module the other built. ")
        if section.get("autoload"):
            lines.append(head + f"Servers of this environment run {c['path']} (the autoload puts it first on "
                         f"PATH); a process without the autoload (another environment's server, a shell) runs "
                         f"whichever is first on its PATH. Fix, if one does: remove the other ninja (e.g. "
                         f"apt-get remove ninja-build) or put {os.path.dirname(c['path'])} first on its PATH")
        else:
            lines.append(head + f"A server started from this environment runs whichever is first on its PATH. "
                         f"Fix: 'flashinfer-sm120 enable' (every server process then runs {c['path']}, which "
                         f"'flashinfer-sm120 build' runs), or remove the other ninja (e.g. apt-get remove "
                         f"ninja-build)")
    stale = {k: v for k, v in (section.get("cache_log_formats") or {}).items() if str(k) != str(c["log_format"])}
    if stale and c["log_format"]:
        lines.append(f"  WARNING: {plural(sum(stale.values()), 'module')} in {section.get('jit_dir')} were built by a ninja "
                     f"with .ninja_log v{', v'.join(sorted(stale))}: {c['path']} will rebuild them. Fix: "
                     f"'flashinfer-sm120 build' them again (it runs {c['path']})")
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
            lines.append(f"    {flag}{m['name']}: {held} ({_size(m['bytes'])})")
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


def _size(n: int | None) -> str:
    if n is None:
        return "?"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def smoke_lines(result: dict) -> list[str]:
    """A :meth:`flashinfer_sm120.diagnose.verify.smoke.SmokeResult.to_dict` as ``doctor --smoke`` prints it."""
    verdict = "PASSED" if result["ok"] else f"FAILED at step '{result['failed']}'"
    lines = [f"\nSmoke check (a tiny kernel built with FlashInfer's own build line for "
             f"{' '.join(result['targets']) or 'no targets'}): {verdict} in {result['seconds']:g} s"]
    for s in result["steps"]:
        lines.append(f"  {s['name']:<10}  {s['status']:<7}  {s['seconds']:>5.1f} s  {s['detail']}")
        if s["output"]:
            lines += ["      " + ln for ln in s["output"].splitlines()]
    return lines
