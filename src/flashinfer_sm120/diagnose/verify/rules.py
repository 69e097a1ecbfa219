"""Which compiled code runs on which GPU (FlashInfer 0.7.4 ``jit/_cuda_architecture.py``, CUDA 12.9 notes), and
what a module must be linked against: FlashInfer links ``-L$cuda_home/lib64/stubs -lcudart -lcuda``
(``cpp_ext.py`` 0.6.7 - 0.7.4), so the driver's ``libcuda.so.1`` and torch's one ``libcudart`` must load."""

from __future__ import annotations

import os
import re

from flashinfer_sm120.safety.formats.binary import read_elf

__all__ = ["RANK", "parse_target", "capability_of", "runs", "best", "caution", "static_problems", "cuda_libraries",
           "runtime_problems"]

_TARGET_RE = re.compile(r"^(sm|compute)_([0-9]{1,2})([0-9])([af]?)$")

#: Verdicts from best to worst (``None``: cannot run).
RANK = ("exact", "compatible", "jit")


def parse_target(target: str) -> tuple[str, int, int, str] | None:
    """``"sm_120f"`` -> ``("SASS", 12, 0, "f")``; ``"compute_90a"`` -> ``("PTX", 9, 0, "a")``; else ``None``."""
    m = _TARGET_RE.match(target)
    if not m:
        return None
    return ("SASS" if m.group(1) == "sm" else "PTX", int(m.group(2)), int(m.group(3)), m.group(4))


def capability_of(target: str) -> tuple[int, int] | None:
    """The compute capability a target is named for: ``"sm_120f"`` -> ``(12, 0)``."""
    p = parse_target(target)
    return (p[1], p[2]) if p else None


def runs(target: str, capability: tuple[int, int]) -> str | None:
    """``exact``/``compatible``/``jit`` (PTX)/``None``: ``*_XYa`` only on X.Y, ``sm_XY[f]``, ``compute_XYf`` on X.Z>=Y."""
    p = parse_target(target)
    if p is None:
        return None
    kind, major, minor, suffix = p
    same = (major, minor) == capability
    if suffix == "a":  # that GPU only
        fits = same
    elif kind == "SASS" or suffix == "f":  # later minors of the major
        fits = major == capability[0] and minor <= capability[1]
    else:  # plain PTX: the driver compiles it for any later GPU
        fits = (major, minor) <= capability
    return None if not fits else "jit" if kind == "PTX" else "exact" if same else "compatible"


def best(targets: list[str] | tuple[str, ...], capability: tuple[int, int]) -> tuple[str | None, str | None]:
    """``(verdict, target)`` of the best code among ``targets`` for ``capability``."""
    rank, target = min(((RANK.index(v), t) for t in targets if (v := runs(t, capability))), default=(None, None))
    return (None if rank is None else RANK[rank]), target


def caution(verdict: str | None, target: str | None, capability: tuple[int, int]) -> str | None:
    """A warning for legal but risky code: SM 12.x code of an earlier minor (FlashInfer builds ``sm_121a`` since 0.6.12, issue 3294)."""
    if verdict == "compatible" and target and capability[0] == 12:
        return (f"runs {target} code on compute capability {capability[0]}.{capability[1]} by binary "
                f"compatibility; FlashInfer builds sm_{capability[0]}{capability[1]}a for it because such code "
                f"has given wrong results there (FlashInfer issue 3294)")
    return None


def static_problems(path: str, *, view: str | None = None, cuda_major: int | None = None) -> tuple[dict, list[str]]:
    """``(facts, problems)`` of the module at ``path``: ``needed``, ``rpath``, ``soname``; each problem with its fix."""
    info = read_elf(path)
    facts = {"needed": list(info.needed), "rpath": list(info.rpath), "soname": info.soname}
    problems = []
    if "libcuda.so" in info.needed:
        problems.append(f"{path} records NEEDED libcuda.so (no version): the libcuda.so it was linked "
                        f"against has no SONAME, and no driver installs that name; rebuild it against a "
                        f"stub whose SONAME is libcuda.so.1 (flashinfer-sm120's view provides one)")
    for entry in info.rpath:
        real = os.path.realpath(entry) if entry.startswith("/") else entry
        inside_view = view and (real == os.path.realpath(view) or real.startswith(os.path.realpath(view) + "/"))
        if "/stubs" in entry or inside_view:
            problems.append(f"{path} has RPATH/RUNPATH {entry}: at run time the link stub there would be "
                            f"loaded instead of the driver's libcuda.so.1; rebuild it without "
                            f"FLASHINFER_EXTRA_LDFLAGS=-Wl,-rpath,... pointing there")
    carts = [n for n in info.needed if n.startswith("libcudart.so")]
    if cuda_major is not None:
        for n in carts:
            if n != f"libcudart.so.{cuda_major}":
                problems.append(f"{path} needs {n} but torch loads the CUDA {cuda_major} runtime "
                                f"(libcudart.so.{cuda_major}); rebuild it with an nvcc of CUDA {cuda_major}")
    return facts, problems


def cuda_libraries(mapped: set[str]) -> dict[str, list[str]]:
    """The ``libcuda`` and ``libcudart`` files among mapped paths, real paths, sorted."""
    return {k: sorted({os.path.realpath(p) for p in mapped if os.path.basename(p).startswith(k + ".so")})
            for k in ("libcuda", "libcudart")}


def runtime_problems(before: set[str], after: set[str], *, view: str | None = None) -> tuple[dict, list[str]]:
    """Compare what was mapped before and after loading modules (``/proc/self/maps`` paths)."""
    b, a = cuda_libraries(before), cuda_libraries(after)
    facts = {"libcuda": a["libcuda"], "libcudart": a["libcudart"], "libcudart_before": b["libcudart"]}
    problems = []
    if not a["libcuda"]:
        problems.append("libcuda.so.1 is not loaded: no NVIDIA driver library was found at run time")
    bad = os.path.realpath(view) if view else None
    for lib in a["libcuda"]:
        if "/stubs/" in lib or (bad and (lib == bad or lib.startswith(bad + "/"))):
            problems.append(f"{lib} was loaded as libcuda: that is a link stub, not the driver; the module "
                            f"was linked with an RPATH into it or LD_LIBRARY_PATH names it: remove that")
    if len(a["libcudart"]) > 1:
        problems.append(f"two CUDA runtimes are loaded ({', '.join(a['libcudart'])}): the module brought its "
                        f"own libcudart instead of using torch's; rebuild it with torch's CUDA major")
    elif b["libcudart"] and a["libcudart"] != b["libcudart"]:
        problems.append(f"the module loaded {a['libcudart']} while torch had {b['libcudart']}")
    return facts, problems
