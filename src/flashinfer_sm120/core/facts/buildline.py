"""FlashInfer's variables that enter a module's ``build.ninja`` lines (read from its code): ninja rebuilds a module
whose line changed, so a warm cache serves only when they read as in its build (``CUDA_HOME`` and ours: not listed)."""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass
from pathlib import Path

from packaging.specifiers import SpecifierSet


class Read(enum.Enum):
    """How FlashInfer reads a variable, which decides when it changes the build line."""

    ONE = "on when exactly '1'"
    FLAGS = "split like a shell line and appended"
    THREADS = "an integer >= 1, else 1"
    PRESENT = "used whenever it is set, even empty"
    VALUE = "used in place of a default"


@dataclass(frozen=True)
class BuildVar:
    """One variable: how FlashInfer reads it, what it ``enters`` in ``build.ninja``, ``where``, and its ``default``."""

    name: str
    read: Read
    enters: str
    where: str
    releases: SpecifierSet
    default: str | None = None
    overridden_by: str | None = None


_ALL = SpecifierSet(">=0.6.7")  # read in 0.6.7, 0.7.2 and 0.7.4; older releases not read
_LAUNCHERS = SpecifierSet(">0.6.7")  # absent in 0.6.7, present in 0.7.2 and 0.7.4

#: What FlashInfer's debug build (``FLASHINFER_JIT_DEBUG=1``, else ``FLASHINFER_JIT_VERBOSE=1``) does to the
#: lines (``gen_jit_spec``, flashinfer/jit/core.py, read in 0.7.4).
DEBUG_BUILD = ("debug flags -O0 -g --device-debug -lineinfo --ptxas-options=-v -DCUTLASS_DEBUG_TRACE_LEVEL=2 on "
               "every CUDA compile line (-O0 -g on C++ lines), dropping -DNDEBUG -O3")

#: Every variable of FlashInfer's own that enters a module's build line.  Verified against
#: flashinfer-python 0.6.7, 0.7.2 and 0.7.4 (``flashinfer/jit/core.py``, ``flashinfer/jit/cpp_ext.py``);
#: 0.6.7 reads ``FLASHINFER_NVCC_THREADS`` unchecked into ``--threads=``.
BUILD_VARS: tuple[BuildVar, ...] = (
    BuildVar("FLASHINFER_JIT_VERBOSE", Read.ONE, DEBUG_BUILD, "flashinfer/jit/core.py gen_jit_spec", _ALL,
             overridden_by="FLASHINFER_JIT_DEBUG"),
    BuildVar("FLASHINFER_JIT_DEBUG", Read.ONE, f"{DEBUG_BUILD} (wins over FLASHINFER_JIT_VERBOSE when set)",
             "flashinfer/jit/core.py gen_jit_spec", _ALL),
    BuildVar("FLASHINFER_JIT_LINEINFO", Read.ONE, "-lineinfo on every CUDA compile line",
             "flashinfer/jit/core.py gen_jit_spec", _ALL),
    BuildVar("FLASHINFER_NVCC_THREADS", Read.THREADS, "nvcc --threads=N on every CUDA compile line",
             "flashinfer/jit/cpp_ext.py get_nvcc_parallelism_flags", _ALL, default="1"),
    BuildVar("FLASHINFER_EXTRA_CFLAGS", Read.FLAGS, "appended to every C++ compile line",
             "flashinfer/jit/cpp_ext.py build_cflags", _ALL),
    BuildVar("FLASHINFER_EXTRA_CUDAFLAGS", Read.FLAGS, "appended to every CUDA compile line",
             "flashinfer/jit/cpp_ext.py build_cuda_cflags", _ALL),
    BuildVar("FLASHINFER_EXTRA_LDFLAGS", Read.FLAGS, "appended to every link line",
             "flashinfer/jit/cpp_ext.py generate_ninja_build_for_op", _ALL),
    BuildVar("CC", Read.PRESENT, "-ccbin $CC on every CUDA compile line",
             "flashinfer/jit/cpp_ext.py build_cuda_cflags", _ALL),
    BuildVar("CXX", Read.VALUE, "the C++ compiler and linker (cxx = ...)",
             "flashinfer/jit/cpp_ext.py generate_ninja_build_for_op", _ALL, default="c++"),
    BuildVar("FLASHINFER_NVCC", Read.VALUE, "the nvcc of every CUDA line (nvcc = ...)",
             "flashinfer/jit/cpp_ext.py generate_ninja_build_for_op", _ALL, default="$cuda_home/bin/nvcc"),
    BuildVar("FLASHINFER_NVCC_LAUNCHER", Read.VALUE, "a command in front of every nvcc line",
             "flashinfer/jit/cpp_ext.py generate_ninja_build_for_op", _LAUNCHERS, default=""),
    BuildVar("FLASHINFER_CXX_LAUNCHER", Read.VALUE, "a command in front of every C++ compile line",
             "flashinfer/jit/cpp_ext.py generate_ninja_build_for_op", _LAUNCHERS, default=""),
)

#: The record ``build`` leaves in each module directory it built.
RECORD_NAME = "flashinfer-sm120-build.json"


def effective(var: BuildVar, env: dict[str, str]) -> str | None:
    """``var`` as FlashInfer reads it in ``env``; ``None`` when it leaves the line unchanged."""
    value = env.get(var.name)
    if var.overridden_by and env.get(var.overridden_by) is not None:
        return None  # the other variable decides
    if var.read is Read.ONE:
        return "1" if value == "1" else None
    if var.read is Read.FLAGS:
        return value.strip() or None if value else None
    if var.read is Read.THREADS:
        try:
            n = int(value) if value is not None else 1
        except ValueError:
            n = 1
        return None if n < 1 or str(n) == var.default else str(n)
    if var.read is Read.PRESENT:
        return value
    return None if value is None or value == var.default else value


def snapshot(env: dict[str, str], version: str | None = None) -> dict[str, str | None]:
    """Every variable of ``version`` (FlashInfer's release; all when ``None``) as read in ``env``."""
    return {v.name: effective(v, env) for v in BUILD_VARS
            if version is None or v.releases.contains(version, prereleases=True)}


def settings(env: dict[str, str], version: str | None = None) -> list[tuple[BuildVar, str]]:
    """``(variable, value)`` for each of :data:`BUILD_VARS` that changes the build line in ``env`` (against unset)."""
    by_name = {v.name: v for v in BUILD_VARS}
    return [(by_name[k], v) for k, v in snapshot(env, version).items() if v is not None]


@dataclass(frozen=True)
class Change:
    """A variable that reads differently now than in the build that warmed a module."""

    name: str
    built: str | None
    now: str | None


def changes(built: dict, now: dict) -> list[Change]:
    return [Change(k, built.get(k), now.get(k)) for k in sorted(set(built) | set(now)) if built.get(k) != now.get(k)]


def record(build_dir: Path, values: dict[str, str | None]) -> str | None:
    """Leave ``values`` (a :func:`snapshot`) in a module directory just built; returns why it could not."""
    from flashinfer_sm120.safety.fs.atomic import write_json_atomic
    from flashinfer_sm120.errors import Sm120Error

    try:
        # threat-model: P5 (put in place atomically, in a module directory build just checked and wrote)
        write_json_atomic(str(Path(build_dir) / RECORD_NAME), {"schema": 1, "build_vars": values})
    except (Sm120Error, OSError) as exc:
        return str(exc)
    return None


def recorded(build_dir: Path) -> dict | None:
    from flashinfer_sm120.errors import FormatError
    from flashinfer_sm120.safety.formats.reads import read_json_file
    from flashinfer_sm120.safety.formats.fields import field

    try:
        # threat-model: P6 (S2: a module directory may be copied from elsewhere; bounded, then checked field by field)
        data = read_json_file(str(Path(build_dir) / RECORD_NAME), 1 << 16)
        values = field(data, "build_vars", dict, RECORD_NAME)
    except (FormatError, OSError):
        return None
    names = {v.name for v in BUILD_VARS}
    if not all(k in names and (v is None or (isinstance(v, str) and len(v) <= 4096)) for k, v in values.items()):
        return None
    return values


def stale(jit_dir: Path, now: dict) -> dict[str, list[Change]]:
    """Modules under ``jit_dir`` whose record differs from ``now``: ``{module: changes}``."""
    out = {}
    try:
        entries = sorted(os.scandir(jit_dir), key=lambda e: e.name)
    except OSError:
        return {}
    for entry in entries[:10_000]:
        if entry.is_dir(follow_symlinks=False):
            rec = recorded(Path(entry.path))
            if rec is not None and changes(rec, now):
                out[entry.name] = changes(rec, now)
    return out
