"""``doctor``'s build-line section: FlashInfer variables set here that change every build line
(:mod:`flashinfer_sm120.core.facts.buildline`), modules warmed with other values, and the targets each
installed server's model processes choose themselves (:mod:`flashinfer_sm120.core.facts.serverarch`)."""

from __future__ import annotations

import os
from pathlib import Path

from flashinfer_sm120.core.facts import buildline, serverarch, servers
from flashinfer_sm120.safety.formats import shown

__all__ = ["doctor_section", "doctor_lines"]

#: What each kind of variable does to the line, as printed.
_EFFECT = {
    buildline.Read.ONE: "changes every build line",
    buildline.Read.FLAGS: "is added to every build line",
    buildline.Read.THREADS: "changes every CUDA build line",
    buildline.Read.PRESENT: "changes every CUDA build line",
    buildline.Read.VALUE: "changes every build line",
}


def doctor_section(report: dict) -> dict:
    """JSON-able: the variables set, the modules built with other values (per JIT directory
    doctor knows of), and each installed server's own targets for the GPUs of the choice."""
    env = dict(os.environ)
    version = report.get("flashinfer") if isinstance(report.get("flashinfer"), str) else None
    now = buildline.snapshot(env, version)
    out: dict = {"set": [{"name": s.var.name, "value": s.value, "read": s.var.read.name, "enters": s.var.enters,
                          "where": s.var.where} for s in buildline.settings(env, version)]}
    dirs = [(report.get("after") or {}).get("jit_dir")]
    dirs += [s.get("jit_dir") for s in ((report.get("servers") or {}).get("servers") or ())]
    stale = {}
    for d in dict.fromkeys(d for d in dirs if d):
        for module, changed in buildline.stale(Path(d), now).items():
            stale[os.path.join(d, module)] = [c.__dict__ for c in changed]
    out["stale"] = stale
    caps = [tuple(int(x) for x in c.split(".")) for c in
            (((report.get("resolution") or {}).get("choice") or {}).get("capabilities") or ())]
    out["server_arch"] = []
    for inst in servers.installed():
        choice = serverarch.server_arch(inst.release.key, caps, env) if caps else None
        if choice is not None:
            out["server_arch"].append({"name": choice.name, "variable": choice.variable, "value": choice.value,
                                       "targets": list(choice.targets), "function": choice.function,
                                       "how": choice.how})
    return out


def doctor_lines(section: dict) -> list[str]:
    """:func:`doctor_section` as printed."""
    lines = ["\nBuild line (what makes a warm module rebuild):"]
    for s in section.get("set") or ():
        effect = _EFFECT.get(buildline.Read[s["read"]], "changes the build line")
        value = s["value"] if len(s["value"]) <= 200 and s["value"].isprintable() else shown(s["value"], 200)
        lines.append(f"  {s['name']}={value} {effect}: the warm cache will be rebuilt "
                     f"({s['enters']}; {s['where']})")
    if not section.get("set"):
        lines.append("  no FlashInfer variable that changes the build line is set")
    stale = section.get("stale") or {}
    for path, changed in list(stale.items())[:20]:
        what = ", ".join(f"{c['name']} {c['built'] or '(unset)'} then, {c['now'] or '(unset)'} now" for c in changed)
        lines.append(f"  {path} was built with other values ({what}): it will be rebuilt")
    if len(stale) > 20:
        lines.append(f"  ... and {len(stale) - 20} more modules built with other values")
    for a in section.get("server_arch") or ():
        if a["value"]:
            lines.append(f"  {a['name']} will build for {', '.join(a['targets'])} (its {a['function']} sets "
                         f"{a['variable']}={a['value']}; {a['how']}): 'flashinfer-sm120 build --for "
                         f"{a['name'].lower()}' warms that")
        else:
            lines.append(f"  {a['name']} leaves {a['variable']} as it is here ({a['function']}; {a['how']})")
    return lines
