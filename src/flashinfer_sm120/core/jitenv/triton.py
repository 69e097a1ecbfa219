"""The ptxas Triton runs for each target, and ours where its bundled one cannot build it (a first process; a later
one sets what was recorded: ``environ._export_triton``)."""

from __future__ import annotations

import os

from packaging.version import Version

from flashinfer_sm120.core.facts import arch as _arch
from flashinfer_sm120.core.toolkit.ninja import package_dir
from flashinfer_sm120.core.toolkit import memo
from flashinfer_sm120.safety.ownership import fingerprint

#: Which bundled ptxas Triton runs for an SM, first match wins (``get_ptxas``, triton/backends/nvidia/compiler.py):
#: ``ptxas-thor`` for sm_110 (release/3.7.x, triton PR #10462), ``ptxas-blackwell`` from SM 100 (3.6.0+), else
#: ``ptxas``; a binary absent from the wheel falls through.
TRITON_PTXAS = (("ptxas-thor", lambda sm: sm == 110), ("ptxas-blackwell", lambda sm: sm >= 100),
                ("ptxas", lambda sm: True))


def plan(bin_dir: str, sms: list[int]) -> dict:
    """``{"env": TRITON_PTXAS*_PATH to set (``triton/knobs.py``), "note": in words, "stat": each ptxas's fingerprint}``:
    ours where Triton's cannot build a target (3.5.0's ptxas 12.8 rejects ``sm_121a``: triton-lang/triton#8539)."""
    pkg = package_dir("triton")
    triton_bin = os.path.join(pkg, "backends", "nvidia", "bin") if pkg else None  # Triton 3.x
    triton_bin = triton_bin if triton_bin and os.path.isdir(triton_bin) else None
    user = sorted(v for v in os.environ if v.startswith("TRITON_PTXAS") and v.endswith("_PATH"))
    if triton_bin is None or user:
        note = f"unchanged: {', '.join(user)} set by you" if triton_bin else "not installed"
        return {"env": {}, "note": note, "stat": {}}
    ours = os.path.join(bin_dir, "ptxas")
    notes, env = [], {}
    stats = {p: fingerprint(p) for p in [ours] + [os.path.join(triton_bin, name) for name, _ in TRITON_PTXAS]}
    for sm in sorted(set(sms)):
        binary = next(name for name, applies in TRITON_PTXAS
                      if applies(sm) and os.path.exists(os.path.join(triton_bin, name)))
        target = (sm // 10, f"{sm % 10}a" if sm >= 90 else str(sm % 10))  # sm_arch_from_capability, Triton 3.x
        need = _arch.min_nvcc_for(target)
        var = f"TRITON_{binary.upper().replace('-', '_')}_PATH"  # env_nvidia_tool in triton/knobs.py
        bundled = memo.tool_release(os.path.join(triton_bin, binary))
        label = f"{_arch.format_target(target)}: Triton's {binary} {bundled or '?'}"
        if need is None or bundled is None:
            notes.append(f"{label}: unchanged (cannot tell what it needs)")
        elif bundled >= need:
            notes.append(f"{label} builds it")
        elif (memo.tool_release(ours) or Version("0")) < need:
            notes.append(f"{label} cannot build it (needs {need}); neither can {ours} ({memo.tool_release(ours)})")
        else:
            env[var] = ours
            notes.append(f"{label} cannot build it (needs {need}): {var}={ours} ({memo.tool_release(ours)})")
    return {"env": env, "note": "; ".join(notes) or "no GPU target", "stat": stats}
