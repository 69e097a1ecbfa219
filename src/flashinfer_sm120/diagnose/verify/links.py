"""What a built module is linked against, and what it loaded at run time.

FlashInfer links every JIT module with ``-L$cuda_home/lib64/stubs -lcudart -lcuda``
(``flashinfer/jit/cpp_ext.py`` ``generate_ninja_build_for_op``, 0.6.7 - 0.7.4): the ``libcuda.so``
there is a link stub; what must load is the driver's ``libcuda.so.1`` and torch's one ``libcudart``.
"""

from __future__ import annotations

import os

from flashinfer_sm120.safety.formats.binary import read_elf

__all__ = ["static_problems", "cuda_libraries", "runtime_problems"]

def static_problems(path: str, *, view: str | None = None, cuda_major: int | None = None) -> tuple[dict, list[str]]:
    """``(facts, problems)`` of the module at ``path``: ``facts`` has ``needed``, ``rpath``,
    ``soname``; each problem is a sentence with the fix."""
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
    out: dict[str, list[str]] = {"libcuda": [], "libcudart": []}
    for p in mapped:
        base = os.path.basename(p)
        key = "libcudart" if base.startswith("libcudart.so") else "libcuda" if base.startswith("libcuda.so") else None
        if key:
            out[key].append(os.path.realpath(p))
    return {k: sorted(set(v)) for k, v in out.items()}


def runtime_problems(before: set[str], after: set[str], *, view: str | None = None,
                     stub_dirs: tuple[str, ...] = ()) -> tuple[dict, list[str]]:
    """Compare what was mapped before and after loading modules (``/proc/self/maps`` paths)."""
    b, a = cuda_libraries(before), cuda_libraries(after)
    facts = {"libcuda": a["libcuda"], "libcudart": a["libcudart"], "libcudart_before": b["libcudart"]}
    problems = []
    if not a["libcuda"]:
        problems.append("libcuda.so.1 is not loaded: no NVIDIA driver library was found at run time")
    bad_roots = [os.path.realpath(d) for d in ((view,) if view else ()) + tuple(stub_dirs)]
    for lib in a["libcuda"]:
        if "/stubs/" in lib or any(lib == r or lib.startswith(r + "/") for r in bad_roots):
            problems.append(f"{lib} was loaded as libcuda: that is a link stub, not the driver; the module "
                            f"was linked with an RPATH into it or LD_LIBRARY_PATH names it: remove that")
    if len(a["libcudart"]) > 1:
        problems.append(f"two CUDA runtimes are loaded ({', '.join(a['libcudart'])}): the module brought its "
                        f"own libcudart instead of using torch's; rebuild it with torch's CUDA major")
    elif b["libcudart"] and a["libcudart"] != b["libcudart"]:
        problems.append(f"the module loaded {a['libcudart']} while torch had {b['libcudart']}")
    return facts, problems

