"""Every fix and refusal reason about toolkits and targets (docs/toolkit.md "When nothing fits"): the fix follows
torch's CUDA major; no pip wheel before CUDA 13.0 ships nvcc, and a pip fix already installed is never printed."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from flashinfer_sm120.core.facts import arch as _arch
from flashinfer_sm120.core.facts.archopt import assigned, named
from flashinfer_sm120.core.toolkit.memo import local_fix
from flashinfer_sm120.core.toolkit.model import Toolkit

#: The pip distribution that installs one consistent CUDA 13 set into ``site-packages/nvidia/cu13``.
PIP_TOOLKIT = "cuda-toolkit[nvcc,cccl,curand]"
#: Opt-in to accept an nvcc whose CUDA major differs from torch's (default: never).
ALLOW_OTHER_MAJOR_ENV = "FLASHINFER_SM120_ALLOW_OTHER_CUDA_MAJOR"
#: First CUDA release whose pip wheels ship nvcc.
FIRST_PIP_NVCC = Version("13.0")


def _pip(spec: str) -> str:
    return f"pip install '{PIP_TOOLKIT}{spec}'"


def _entry(t: tuple[int, str]) -> str:
    return f"{t[0]}.{t[1]}"


def _upgrade_fix(targets: Iterable[tuple[int, str]]) -> str:
    """Targets missing from the table: upgrade; until then an explicit-suffix arch list."""
    targets = list(targets)
    names = ", ".join(_arch.format_target(t) for t in targets)
    hatch = " ".join(_entry(t) if t[1][-1:] in ("a", "f") else f"{_entry(t)}a" for t in targets)
    return (f"upgrade flashinfer-sm120 (this release's target table does not know {names}); "
            f"until then, if `nvcc --list-gpu-arch` lists it, {assigned(hatch)} "
            f"with an nvcc >= {_arch.NEWEST_KNOWN_NVCC} builds it as given")


def _drop_fix(t: tuple[int, str]) -> str:
    gone, repl = _arch.dropped_in(t), _arch.RENAMED.get(_arch.target_key(t))
    if repl:
        return (f"write '{_entry(repl)}' instead of '{_entry(t)}' in {named()} "
                f"(CUDA {gone}.0 renamed {_arch.format_target(t)} to {_arch.format_target(repl)})")
    return (f"remove '{_entry(t)}' from {named()} (CUDA {gone}.0 dropped "
            f"{_arch.format_target(t)}), or use a CUDA {gone - 1} build of torch and toolkit")


def target_reason(t: tuple[int, str], v: Version) -> str:
    gone, need = _arch.dropped_in(t), _arch.min_nvcc_for(t)
    if gone is not None and v.major >= gone:
        return f"{_arch.format_target(t)} (dropped in CUDA {gone}.0)"
    if need is None:
        return f"{_arch.format_target(t)} (not in flashinfer-sm120's table: upgrade flashinfer-sm120)"
    return f"{_arch.format_target(t)} (nvcc >= {need})"


def torch_major_why(torch_cuda: str) -> str:
    tmm = _arch.major_minor(torch_cuda)
    return f"the JIT module links the nvcc's libcudart major, and torch loads libcudart.so.{tmm.major if tmm else torch_cuda}"


def consistent_set_fix(nvcc_version: Version, pip: bool) -> str:
    """A toolkit whose parts disagree or lack ``libcudart``: the same release's pip set (13+), else a reinstall."""
    v = Version(f"{nvcc_version.major}.{nvcc_version.minor}")
    if pip and v >= FIRST_PIP_NVCC:
        return _pip(f"=={v}.*")
    return (f"reinstall CUDA {v} as one set from NVIDIA or conda (conda install -c nvidia "
            f"cuda-toolkit={v}), or set CUDA_HOME to another toolkit")


def _pip_or_repair(spec: str, found: Sequence[Toolkit], need: Version | None) -> str:
    have = next((tk for tk in found if "pip" in tk.sources and tk.nvcc_version is not None
                 and SpecifierSet(spec).contains(Version(f"{tk.nvcc_version}.0"), prereleases=True)), None)
    if have is None:
        return _pip(spec)
    if have.problem and have.header_version and have.nvcc_version != have.header_version:
        # a mixed set (nvcc 13.0, headers 13.5): the same fix its own rejection names, said once
        return (f"make the pip toolkit at {have.root} one release (nvcc {have.nvcc_version}, headers "
                f"{have.header_version}): {consistent_set_fix(have.nvcc_version, True)}")
    if have.problem:
        return (f"repair the pip toolkit at {have.root} ({have.problem.rstrip('.')}): "
                f"pip install --force-reinstall '{PIP_TOOLKIT}{spec}'")
    newer = Version(f"{have.nvcc_version.major}.{have.nvcc_version.minor + 1}")  # clean, yet refused
    want = max(newer, need) if need is not None else newer
    return _pip(f">={want},<{want.major + 1}")


def toolkit_fix(need: Version | None, torch_cuda: str | None, found: Sequence[Toolkit] = ()) -> str:
    """The fix that installs nvcc >= ``need`` for ``torch.version.cuda``, never a pip toolkit in ``found``."""
    tmm = _arch.major_minor(torch_cuda)
    if tmm is None:  # CPU torch: any major; pip 13.x is the one that installs with pip
        lo = max(need, FIRST_PIP_NVCC) if need is not None else FIRST_PIP_NVCC
        spec = f">={lo},<{lo.major + 1}"
        return _pip(spec) if lo.major > FIRST_PIP_NVCC.major else _pip_or_repair(spec, found, need)
    want = max(need, tmm) if need is not None else tmm
    if want.major > tmm.major:
        return (f"use a torch built for CUDA {want.major} (e.g. pip install torch --index-url "
                f"https://download.pytorch.org/whl/cu{want.major}{want.minor}) and "
                f"{_pip(f'=={want.major}.{want.minor}.*')}: nvcc >= {need} is needed, "
                f"which no CUDA {tmm.major}.x toolkit has")
    if want >= FIRST_PIP_NVCC:
        return _pip_or_repair(f"=={want.major}.{want.minor}.*", found, need)
    return (f"install CUDA {want} from NVIDIA (https://developer.nvidia.com/cuda-toolkit-archive) "
            f"or conda (conda install -c nvidia cuda-toolkit={want}) and set CUDA_HOME to it, "
            f"or use a CUDA 13 build of torch; no pip wheel before CUDA 13.0 ships nvcc")


def choose_fix(wanted: Sequence[tuple[int, str]], torch_cuda: str | None, found: Sequence[Toolkit],
               *, min_nvcc: Version | None = None, explicit: Iterable[tuple[int, str]] = ()) -> str:
    """The fix when nothing fits: raise a limit this process hit while probing (P8), else upgrade for unknown
    targets, else change dropped ones, else install a toolkit."""
    if limit := local_fix(tk.problem for tk in found):
        return limit
    explicit = set(explicit)
    unknown = [t for t in wanted if _arch.min_nvcc_for(t) is None and (t not in explicit or not any(
        tk.nvcc_version and _arch.target_supported(t, tk.nvcc_version, explicit=True) for tk in found))]
    if unknown:
        return _upgrade_fix(unknown)
    tmm = _arch.major_minor(torch_cuda)
    dropped = [t for t in wanted
               if _arch.dropped_in(t) is not None and (tmm is None or tmm.major >= _arch.dropped_in(t))]
    if dropped:
        return "; ".join(_drop_fix(t) for t in dropped)
    # an explicit target missing from the table needs what the escape hatch needs
    needs = [_arch.min_nvcc_for(t) or (_arch.NEWEST_KNOWN_NVCC if t in explicit else None) for t in wanted]
    needs = [n for n in needs + [min_nvcc] if n is not None]
    return toolkit_fix(max(needs) if needs else None, torch_cuda, found)


def unbuildable(targets: Iterable[tuple[int, str]], nvcc_version: Version) -> list[str]:
    """One message with its fix per explicit arch-list target nvcc ``nvcc_version`` cannot build (P1)."""
    return [m for t in dict.fromkeys(targets) if (m := _unbuildable(t, nvcc_version))]


def _unbuildable(target: tuple[int, str], v: Version) -> str | None:
    if _arch.target_supported(target, v, explicit=True):
        return None
    name, need = _arch.format_target(target), _arch.min_nvcc_for(target)
    head = f"{name} cannot be built by nvcc {v}"
    if _arch.dropped_in(target) is not None and v.major >= _arch.dropped_in(target):
        return f"{head}. Fix: {_drop_fix(target)}."
    if need is None:
        return (f"{head}: {name} is not in flashinfer-sm120's table of targets and nvcc {v} is older "
                f"than {_arch.NEWEST_KNOWN_NVCC}. Fix: {_upgrade_fix([target])}.")
    fix = f"use a toolkit with nvcc >= {need} (set CUDA_HOME to it)"
    alt = next((t for t in _arch.candidate_targets(target[0], int(target[1][0]))  # this nvcc's fallback
                if t != target and _arch.target_supported(t, v)), None)
    if alt is not None:
        fix = (f"write '{_entry(alt)}' in FLASHINFER_CUDA_ARCH_LIST (nvcc {v} builds "
               f"{_arch.format_target(alt)}), or unset it, or " + fix)
    return f"{head} ({name} needs nvcc >= {need}). Fix: {fix}."
