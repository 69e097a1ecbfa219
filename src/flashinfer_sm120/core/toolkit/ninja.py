"""The ninja of the process: the one FlashInfer's ``run_ninja`` runs, ``build`` runs, and servers check.

FlashInfer runs ``ninja`` from ``PATH`` (0.7.x ``flashinfer/jit/cpp_ext.py``
``run_ninja``: ``subprocess.run(["ninja", "-v", "-C", workdir, "-f", ninja_file, ...])``,
read at each build), and vLLM 0.33 disables FlashInfer when ``shutil.which("ninja")``
finds none (``vllm/utils/flashinfer.py`` ``has_flashinfer``).  The ``ninja`` wheel,
a dependency of flashinfer-python, installs its binary into the environment's
``bin`` (``ninja-1.13.2.dist-info/RECORD``: ``../../../bin/ninja``), which is not on
``PATH`` when a service runs ``/opt/venv/bin/vllm`` without activating the venv.

Two ninja releases do not share a JIT cache: each writes its own ``.ninja_log``
format and rebuilds everything the other built (:data:`LOG_FORMATS`).  So one
ninja is chosen (:func:`choose`: the wheel next to FlashInfer first, then ``PATH``;
trusted like any binary we run, :func:`flashinfer_sm120.safety.trust.check_executable`),
``build`` runs exactly it, the export puts it first on ``PATH``
(:func:`export_dir`), and ``doctor`` says which one and warns when another
ninja with another log format is reachable (:func:`doctor_section`).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import shutil
import stat
from dataclasses import dataclass
from typing import Callable

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from flashinfer_sm120.errors import Sm120Error

__all__ = ["NINJA_TIMEOUT_S", "LOG_FORMATS", "FIND_STEPS", "Ninja", "NinjaError", "log_format",
           "candidates", "choose", "on_path", "same_log", "export_dir", "link_dir", "log_format_of_dir",
           "doctor_section"]

#: Seconds ``ninja --version`` may take (it prints one line at once).
NINJA_TIMEOUT_S = 10.0

#: ``.ninja_log`` format each ninja release writes: ``kCurrentVersion`` in ninja's
#: ``src/build_log.cc`` at tags v1.5.0 .. v1.11.1 (5), v1.12.0, v1.12.1 (6), v1.13.0 ..
#: v1.13.2 (7).  From 1.12 on ``kOldestSupportedVersion == kCurrentVersion``: a log of
#: another format is deleted ("build log version is too old; starting over" / "too new")
#: and every output is rebuilt; 1.11 reads a v7 log, but hashes each command with
#: MurmurHash64A where 1.13 uses rapidhash, so every command looks changed: rebuilt too.
#: A release newer than the table: unknown (compared by major.minor).
LOG_FORMATS: tuple[tuple[SpecifierSet, int], ...] = (
    (SpecifierSet(">=1.13,<1.14"), 7),
    (SpecifierSet(">=1.12,<1.13"), 6),
    (SpecifierSet(">=1.5,<1.12"), 5),
)

_WHEEL = "the ninja wheel"
_memo: dict[tuple, tuple[Version | None, str | None]] = {}


class NinjaError(Sm120Error):
    """No usable ninja, or its ``PATH`` entry cannot be made; the message names the fix."""


def log_format(version: Version | None) -> int | None:
    """The ``.ninja_log`` format ninja ``version`` writes (:data:`LOG_FORMATS`), or ``None``."""
    if version is None:
        return None
    return next((fmt for spec, fmt in LOG_FORMATS if spec.contains(version, prereleases=True)), None)


@dataclass(frozen=True)
class Ninja:
    """One ninja binary.

    Attributes:
        path: where it was found (run as given).
        real: its real path (links followed).
        sources: how it was found (``the ninja wheel 1.13.2``, ``PATH``), first first.
        version: what ``ninja --version`` printed, or ``None``.
        problem: why it is not used (untrusted, no version), or ``None``.
    """

    path: str
    real: str
    sources: tuple[str, ...]
    version: Version | None
    problem: str | None = None

    @property
    def log_format(self) -> int | None:
        return log_format(self.version)

    def describe(self) -> str:
        """``/opt/venv/bin/ninja (ninja 1.13.2, .ninja_log v7; the ninja wheel 1.13.2)``."""
        fmt = f".ninja_log v{self.log_format}" if self.log_format else ".ninja_log format unknown"
        return f"{self.path} (ninja {self.version or '?'}, {fmt}; {', '.join(self.sources)})"

    def to_dict(self) -> dict:
        return {"path": self.path, "real": self.real, "sources": list(self.sources),
                "version": str(self.version) if self.version else None, "log_format": self.log_format,
                "problem": self.problem}


def same_log(a: Ninja, b: Ninja) -> bool:
    """Whether a cache one of them built is up to date for the other (same ``.ninja_log`` format)."""
    if a.log_format is not None and b.log_format is not None:
        return a.log_format == b.log_format
    if a.version is None or b.version is None:
        return a.real == b.real
    return a.version.release[:2] == b.version.release[:2]


# ----------------------------------------------------------------------------- finding


def _wheel(env_path: str | None) -> list[tuple[str, str]]:
    """The binary of the ``ninja`` distribution installed in this environment (FlashInfer's
    dependency), from its ``RECORD``: ``bin/ninja`` (1.13 wheels put the binary there), or
    ``ninja/data/bin/ninja`` (older wheels, whose ``bin/ninja`` is a Python wrapper)."""
    try:
        dist = importlib.metadata.distribution("ninja")
    except importlib.metadata.PackageNotFoundError:
        return []
    found = []
    for f in dist.files or ():
        parts = f.parts
        if len(parts) >= 2 and parts[-2:] == ("bin", "ninja"):
            path = os.path.normpath(str(dist.locate_file(f)))
            if os.path.isfile(path):
                found.append(path)
    found.sort(key=lambda p: "data" not in p.split(os.sep))  # the real binary before a wrapper
    return [(p, f"{_WHEEL} {dist.version}") for p in found[:1]]


def _absolute_entries(env_path: str | None) -> list[str]:
    """The absolute directories of ``PATH``: FlashInfer runs ninja with ``cwd=`` the module's
    build directory (0.7.x ``run_ninja``), where ``.``, an empty or a relative entry names
    another place than here."""
    path = os.environ.get("PATH", os.defpath) if env_path is None else env_path
    return [d for d in path.split(os.pathsep) if d and os.path.isabs(d)]


def _on_path(env_path: str | None) -> list[tuple[str, str]]:
    out = []
    for d in _absolute_entries(env_path):
        cand = os.path.join(d, "ninja")
        if os.path.isfile(cand) and os.access(cand, os.X_OK):
            out.append((cand, "PATH"))
    return out


#: Where ninjas are looked for, in preference order: ``(name, finder(env_path))``.
FIND_STEPS: tuple[tuple[str, Callable[[str | None], list[tuple[str, str]]]], ...] = (
    ("ninja wheel", _wheel),
    ("PATH", _on_path),
)


def _inspect(path: str) -> tuple[Version | None, str | None]:
    """``(version, problem)`` of the ninja at ``path``; runs it only when trusted.
    Remembered per process by real path, size and mtime, and across processes in the
    binary memo (:mod:`flashinfer_sm120.core.toolkit.memo`, keyed by the file's identity), so
    the workers of a server do not each run ``ninja --version``."""
    try:
        st = os.stat(path)
    except OSError as exc:
        return None, f"cannot read {path}: {exc.strerror or exc}"
    key = (os.path.realpath(path), st.st_size, st.st_mtime_ns)
    if key in _memo:
        return _memo[key]
    from flashinfer_sm120.safety import formats, proc
    from flashinfer_sm120.core.toolkit import memo
    from flashinfer_sm120.safety.trust import check_executable

    problem = check_executable(path)  # every time: trust is not remembered, only the version
    version = None
    if problem is None:
        def probe() -> tuple[str | None, str | None, bool]:
            res = proc.run([path, "--version"], timeout=NINJA_TIMEOUT_S, max_output=4096)
            if not res.ok:
                why = res.error or ("timed out" if res.timed_out else f"exit {res.returncode}")
                return None, f"'{path} --version' failed ({why})", not res.local
            try:
                return str(formats.parse_leading_version(res.text(), f"'{path} --version'")), None, True
            except formats.FormatError as exc:
                return None, str(exc), True

        full, problem = memo.probe_once(path, probe, NINJA_TIMEOUT_S + 5)
        version = Version(full) if full else None
    _memo[key] = (version, problem)
    return version, problem


def candidates(env_path: str | None = None) -> list[Ninja]:
    """Every ninja reachable here, in :data:`FIND_STEPS` order, one per real path.

    Args:
        env_path: the ``PATH`` to search (default ``$PATH``)."""
    by_real: dict[str, tuple[str, list[str]]] = {}
    for _name, finder in FIND_STEPS:
        for path, source in finder(env_path):
            real = os.path.realpath(path)
            entry = by_real.setdefault(real, (path, []))
            if source not in entry[1]:
                entry[1].append(source)
    out = []
    for real, (path, sources) in by_real.items():
        version, problem = _inspect(path)
        if problem is None and version is None:
            problem = "its version cannot be read"
        out.append(Ninja(path, real, tuple(sources), version, problem))
    return out


def choose(env_path: str | None = None, found: list[Ninja] | None = None) -> Ninja:
    """The ninja FlashInfer will run once exported, and ``build`` runs: the first trusted
    one of :func:`candidates` (the wheel next to FlashInfer first).

    Raises:
        NinjaError: none is usable; the message lists each and says the fix."""
    found = candidates(env_path) if found is None else found
    for n in found:
        if n.problem is None:
            return n
    seen = "; ".join(f"{n.path}: {n.problem}" for n in found) or "no ninja in this environment or on PATH"
    fix = "pip install --force-reinstall ninja" if found else "pip install ninja"
    raise NinjaError(f"no usable ninja ({seen}). Fix: {fix} (FlashInfer builds its JIT "
                     f"kernels with it, and vLLM's has_flashinfer() is False without one)")


def on_path(env_path: str | None = None) -> str | None:
    """``shutil.which("ninja")`` for ``env_path`` (default ``$PATH``), absolute entries only: what
    ``run_ninja`` runs from a module's build directory."""
    dirs = _absolute_entries(env_path)
    return shutil.which("ninja", path=os.pathsep.join(dirs)) if dirs else None


# ----------------------------------------------------------------------------- exporting


def link_dir(chosen: Ninja) -> str:
    """``<cache root>/ninja/<hash>``: a directory holding only ``ninja`` -> ``chosen.real``,
    made once (a temp directory renamed into place, so concurrent workers agree), ``0700``.

    Raises:
        NinjaError: it cannot be made, or something else is in its place."""
    from flashinfer_sm120.errors import PlaceError
    from flashinfer_sm120.safety.fs.tmpdirs import make_private
    from flashinfer_sm120.safety.ownership import mine_problem
    from flashinfer_sm120.safety.fs.statedir import cache_root
    from flashinfer_sm120.safety.formats import make_private_dirs

    try:
        parent = os.path.join(cache_root(), "ninja")
        make_private_dirs(parent)
        st = os.lstat(parent)
    except (OSError, Sm120Error) as exc:
        raise NinjaError(f"cannot make a PATH entry for {chosen.path}: {exc}") from None
    if not stat.S_ISDIR(st.st_mode) or mine_problem(parent, st):
        raise NinjaError(f"not using {parent}: not a directory of yours that others cannot write "
                         f"({mine_problem(parent, st) or 'not a directory'}); remove it")
    final = os.path.join(parent, hashlib.sha256(chosen.real.encode()).hexdigest()[:12])

    def ok() -> bool:
        link = os.path.join(final, "ninja")
        try:
            dst = os.lstat(final)
            return (stat.S_ISDIR(dst.st_mode) and mine_problem(final, dst) is None
                    and os.path.islink(link) and os.readlink(link) == chosen.real)
        except OSError:
            return False

    if ok():
        return final
    try:
        made = make_private(".tmp-", parent)  # held while we live; a killed maker's is swept
        try:
            os.symlink(chosen.real, os.path.join(made.path, "ninja"))
            try:
                os.rename(made.path, final)
            except OSError:  # made meanwhile by another process (or something else is there)
                pass
        finally:
            made.close()  # removes it unless renamed into place
    except (OSError, PlaceError) as exc:
        raise NinjaError(f"cannot make a PATH entry for {chosen.path} in {parent}: "
                         f"{getattr(exc, 'strerror', None) or exc}") from None
    if not ok():
        raise NinjaError(f"{final} is not a link to {chosen.real}; remove it")
    return final


def export_dir(chosen: Ninja, env_path: str | None, shared: Callable[[str], str | None]) -> tuple[str | None, str]:
    """The directory to put first on ``PATH`` so that ``ninja`` runs ``chosen``, and a note.

    ``None`` when ``which ninja`` already gives it.  Its own directory when that holds no
    other programs it would shadow (``shared(dir)`` is ``None``), else :func:`link_dir`
    (the wheel's binary sits in the venv's ``bin`` next to ``python``).

    Raises:
        NinjaError: a link directory was needed and cannot be made."""
    now = on_path(env_path)
    if now and os.path.realpath(now) == chosen.real:
        return None, f"unchanged: 'which ninja' is already {chosen.describe()}"
    own = os.path.dirname(chosen.path)
    if shared(own) is None:
        return own, f"{own} first (ninja {chosen.version}; was: 'which ninja' -> {now})"
    d = link_dir(chosen)
    return d, f"{d} first, a link to {chosen.describe()} ({shared(own)}; was: 'which ninja' -> {now})"


# ----------------------------------------------------------------------------- caches


def log_format_of_dir(build_dir: str) -> int | None:
    """The ``.ninja_log`` format in ``build_dir`` (first line only), or ``None`` (none, unreadable)."""
    from flashinfer_sm120.safety import formats

    try:
        for _n, line in formats.iter_lines(os.path.join(build_dir, ".ninja_log"), max_line=64, max_lines=1):
            return formats.parse_ninja_log_header(line, os.path.join(build_dir, ".ninja_log"))
    except formats.FormatError:
        return None
    return None


def _cache_formats(jit_dir: str | None, limit: int = 512) -> dict[int, int]:
    """``{log format: modules}`` among the module directories of ``jit_dir``."""
    out: dict[int, int] = {}
    if not jit_dir or not os.path.isdir(jit_dir):
        return out
    try:
        names = sorted(os.listdir(jit_dir))[:limit]
    except OSError:
        return out
    for name in names:
        fmt = log_format_of_dir(os.path.join(jit_dir, name))
        if fmt is not None:
            out[fmt] = out.get(fmt, 0) + 1
    return out


# ----------------------------------------------------------------------------- doctor


def doctor_section(report: dict) -> dict:
    """``doctor``'s ninja part: the chosen one (what the server and ``build`` run once the
    toolkit is exported), every reachable one, conflicts of log format, and the log formats
    of the modules already in this process's JIT dir."""
    found = candidates()
    out: dict = {"candidates": [n.to_dict() for n in found], "which_ninja": on_path()}
    try:
        chosen = choose(found=found)
    except NinjaError as exc:
        out["error"] = str(exc)
        return out
    out["chosen"] = chosen.to_dict()
    out["conflicts"] = [n.to_dict() for n in found if n.problem is None and not same_log(n, chosen)]
    jit_dir = (report.get("after") or {}).get("jit_dir")
    out["jit_dir"] = jit_dir
    out["cache_log_formats"] = {str(k): v for k, v in _cache_formats(jit_dir).items()}
    out["autoload"] = bool((report.get("autoload") or {}).get("pth"))
    return out

