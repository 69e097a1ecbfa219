"""The ninja FlashInfer's ``run_ninja`` (0.7.x) and vLLM 0.33's ``has_flashinfer`` run from ``PATH``: found like
nvcc (steps as data, :func:`.memo.version_of`), the wheel first, then ``PATH``; exported first on ``PATH``."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import importlib.util
import os
import shutil
import stat
from dataclasses import dataclass
from typing import Callable

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from flashinfer_sm120.core.toolkit.memo import local_fix, version_of
from flashinfer_sm120.errors import PlaceError, Sm120Error
from flashinfer_sm120.safety.formats.grammar import parse_leading_version
from flashinfer_sm120.safety.fs.places import make_private_dirs
from flashinfer_sm120.safety.fs.statedir import cache_root
from flashinfer_sm120.safety.fs.atomic import make_private
from flashinfer_sm120.safety.ownership import mine_problem
from flashinfer_sm120.safety.trust import trace

#: Seconds ``ninja --version`` may take (it prints one line at once).
NINJA_TIMEOUT_S = 10.0

#: ``.ninja_log`` format each release writes: ``kCurrentVersion`` in ninja's ``src/build_log.cc`` at
#: v1.5.0 .. v1.11.1 (5), v1.12.x (6), v1.13.0 .. v1.13.2 (7).  From 1.12 on a log of another format is
#: deleted ("build log version is too old/new; starting over") and every output rebuilt; 1.11 reads a
#: v7 log but hashes commands with MurmurHash64A where 1.13 uses rapidhash: rebuilt too.
LOG_FORMATS: tuple[tuple[SpecifierSet, int], ...] = (
    (SpecifierSet(">=1.13,<1.14"), 7),
    (SpecifierSet(">=1.12,<1.13"), 6),
    (SpecifierSet(">=1.5,<1.12"), 5),
)


class NinjaError(Sm120Error):
    """No usable ninja, or its ``PATH`` entry cannot be made."""


@dataclass(frozen=True)
class Ninja:
    """One ninja: where found (run as given), its real path, sources (best first), version, why unusable."""

    path: str
    real: str
    sources: tuple[str, ...]
    version: Version | None
    problem: str | None = None

    @property
    def log_format(self) -> int | None:
        v = self.version
        return next((fmt for spec, fmt in LOG_FORMATS if v and spec.contains(v, prereleases=True)), None)

    def describe(self) -> str:
        """``/opt/venv/bin/ninja (ninja 1.13.2, .ninja_log v7; the ninja wheel 1.13.2)``."""
        fmt = f".ninja_log v{self.log_format}" if self.log_format else ".ninja_log format unknown"
        return f"{self.path} (ninja {self.version or '?'}, {fmt}; {', '.join(self.sources)})"

    def to_dict(self) -> dict:
        return {"path": self.path, "real": self.real, "sources": list(self.sources),
                "version": str(self.version) if self.version else None, "log_format": self.log_format,
                "problem": self.problem}


def same_log(a: Ninja, b: Ninja) -> bool:
    """Whether a cache one built is up to date for the other (same ``.ninja_log`` format)."""
    if a.log_format is not None and b.log_format is not None:
        return a.log_format == b.log_format
    if a.version is None or b.version is None:
        return a.real == b.real
    return a.version.release[:2] == b.version.release[:2]


def package_dir(key: str) -> str | None:
    """The directory of the top-level package ``key`` (found, not imported), or ``None``."""
    try:
        spec = importlib.util.find_spec(key)
    except (ImportError, ValueError):
        return None
    return next(iter(spec.submodule_search_locations or ()), None) if spec else None


def wheel_binary(name: str) -> str | None:
    """The ``name`` wheel's ``bin/<name>`` from its ``RECORD`` (older ninja wheels' is a Python wrapper: their
    ``ninja/data/bin/ninja`` first), or ``None``."""
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return None
    found = [os.path.normpath(str(dist.locate_file(f))) for f in dist.files or () if f.parts[-2:] == ("bin", name)]
    return min((p for p in found if os.path.isfile(p)), key=lambda p: "data" not in p.split(os.sep), default=None)


def _wheel(env_path: str | None) -> list[tuple[str, str]]:
    found = wheel_binary("ninja")
    return [(found, f"the ninja wheel {importlib.metadata.version('ninja')}")] if found else []


def _absolute_entries(env_path: str | None) -> list[str]:
    """``PATH``'s absolute directories (``run_ninja`` runs in the module's build directory)."""
    path = os.environ.get("PATH", os.defpath) if env_path is None else env_path
    return [d for d in path.split(os.pathsep) if d and os.path.isabs(d)]


def programs(name: str, env_path: str | None) -> list[str]:
    """The executable ``name`` files in ``PATH``'s absolute directories, in order."""
    cands = (os.path.join(d, name) for d in _absolute_entries(env_path))
    return [c for c in cands if os.path.isfile(c) and os.access(c, os.X_OK)]


def _on_path(env_path: str | None) -> list[tuple[str, str]]:
    return [(c, "PATH") for c in programs("ninja", env_path)]


#: Where ninjas are looked for, in preference order: ``(name, finder(env_path))``.
FIND_STEPS: tuple[tuple[str, Callable[[str | None], list[tuple[str, str]]]], ...] = (
    ("ninja wheel", _wheel),
    ("PATH", _on_path),
)


def _inspect(path: str) -> tuple[Version | None, str | None]:
    full, problem = None, trace(path).problem
    if problem is None:
        full, problem = version_of(path, lambda out: str(parse_leading_version(out, f"'{path} --version'")),
                                   name="ninja", fix="or pip install --force-reinstall ninja",
                                   timeout=NINJA_TIMEOUT_S)
    return (Version(full) if full else None), problem


def candidates(env_path: str | None = None) -> list[Ninja]:
    """Every ninja reachable with ``PATH`` = ``env_path``, in :data:`FIND_STEPS` order, one per real path."""
    by_real: dict[str, tuple[str, list[str]]] = {}
    for _name, finder in FIND_STEPS:
        for path, source in finder(env_path):
            sources = by_real.setdefault(os.path.realpath(path), (path, []))[1]
            if source not in sources:
                sources.append(source)
    return [Ninja(path, real, tuple(sources), *_inspect(path)) for real, (path, sources) in by_real.items()]


def choose(env_path: str | None = None, found: list[Ninja] | None = None) -> Ninja:
    """The first usable of :func:`candidates`; :class:`NinjaError` lists each when none is."""
    found = candidates(env_path) if found is None else found
    for n in found:
        if n.problem is None:
            return n
    seen = "; ".join(f"{n.path}: {n.problem}" for n in found) or "no ninja in this environment or on PATH"
    fix = local_fix(n.problem for n in found) or (
        "pip install --force-reinstall ninja" if found else "pip install ninja")
    raise NinjaError(f"no usable ninja ({seen}). Fix: {fix} (FlashInfer builds its JIT "
                     f"kernels with it, and vLLM's has_flashinfer() is False without one)")


def on_path(env_path: str | None = None) -> str | None:
    """``shutil.which("ninja")`` over ``PATH``'s absolute entries: what ``run_ninja`` runs."""
    dirs = _absolute_entries(env_path)
    return shutil.which("ninja", path=os.pathsep.join(dirs)) if dirs else None


def link_dir(chosen: Ninja) -> str:
    """``<cache root>/ninja/<hash>``, a ``0700`` directory holding only ``ninja`` -> ``chosen.real``, renamed into
    place from a private temp directory (P5); else :class:`NinjaError`."""
    try:
        parent = os.path.join(cache_root(), "ninja")
        make_private_dirs(parent)
        st = os.lstat(parent)
    except (OSError, Sm120Error) as exc:
        raise NinjaError(f"cannot make a PATH entry for {chosen.path}: {exc}") from None
    why = mine_problem(parent, st) if stat.S_ISDIR(st.st_mode) else "not a directory"
    if why:
        raise NinjaError(f"not using {parent}: not a directory of yours that others cannot write ({why}); remove it")
    final = os.path.join(parent, hashlib.sha256(chosen.real.encode()).hexdigest()[:12])

    def ok() -> bool:
        try:
            st = os.lstat(final)
            link = os.path.join(final, "ninja")
            return (stat.S_ISDIR(st.st_mode) and mine_problem(final, st) is None
                    and os.path.islink(link) and os.readlink(link) == chosen.real)
        except OSError:
            return False

    if ok():
        return final
    try:
        made = make_private(".tmp-", parent)  # held while we live; a killed maker's is swept
        try:
            os.symlink(chosen.real, os.path.join(made.path, "ninja"))
            with contextlib.suppress(OSError):  # made meanwhile by another process (or something else is there)
                os.rename(made.path, final)
        finally:
            made.close()  # removes it unless renamed into place
    except (OSError, PlaceError) as exc:
        raise NinjaError(f"cannot make a PATH entry for {chosen.path} in {parent}: "
                         f"{getattr(exc, 'strerror', None) or exc}") from None
    if not ok():
        raise NinjaError(f"{final} is not a link to {chosen.real}; remove it")
    return final


def export_dir(chosen: Ninja, env_path: str | None, shared: Callable[[str], str | None]) -> tuple[str | None, str]:
    """The directory to put first on ``PATH`` so that ``ninja`` runs ``chosen`` (``None``: it does), and a note:
    its own when that shadows nothing (``shared(dir)`` is ``None``), else :func:`link_dir`."""
    now = on_path(env_path)
    if now and os.path.realpath(now) == chosen.real:
        return None, f"unchanged: 'which ninja' is already {chosen.describe()}"
    own = os.path.dirname(chosen.path)
    if shared(own) is None:
        return own, f"{own} first (ninja {chosen.version}; was: 'which ninja' -> {now})"
    d = link_dir(chosen)
    return d, f"{d} first, a link to {chosen.describe()} ({shared(own)}; was: 'which ninja' -> {now})"
