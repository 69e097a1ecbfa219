"""What FlashInfer's JIT builds get besides the toolkit: its compiler variables checked
(:mod:`flashinfer_sm120.safety.compilers`), ``MAX_JOBS`` from the memory (:mod:`.jobs`), and the compiler
cache when asked for (:data:`CACHE_ENV` or ``build --compiler-cache``; :mod:`.launcher`, loaded only then).

:func:`from_verdicts` (the compiler variables, checked at import) and :func:`plan_builds` (at the first
JIT build) decide what to set and remove; :mod:`flashinfer_sm120.core.jitenv.environ` applies it through its undo log, so ``revert()``
restores the user's environment.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading

from packaging.version import Version

from flashinfer_sm120.safety.formats.reads import env_text
from flashinfer_sm120.safety.formats.base import shown
from flashinfer_sm120.safety import compilers
from flashinfer_sm120.errors import FormatError
logger = logging.getLogger("flashinfer_sm120")

__all__ = ["CACHE_ENV", "CACHE_KINDS", "Setup", "configure", "from_verdicts", "plan_builds", "last", "own_max_jobs", "refresh_max_jobs", "release_max_jobs",
           "requested", "request_from_flag", "asked_by"]

_lock = threading.Lock()
_last: "Setup | None" = None
_jobs: dict = {"value": None, "targets": 1}  # the MAX_JOBS this package exported and still owns

#: The compiler cache's opt-in variable.
CACHE_ENV = "FLASHINFER_SM120_COMPILER_CACHE"
#: Values it takes (besides unset, empty, ``0``/``off``/``none``: off).
CACHE_KINDS = ("sccache",)


@dataclasses.dataclass
class Setup:
    """What :func:`configure` decided: variables to ``set`` and to ``pop`` (refused), a sentence per decision
    (``notes``, for ``doctor``) and per refusal (``warnings``), the user's compiler variables ``refused``
    (``{"variable", "value", "why"}``, for ``build --json``), the compiler ``cache`` (``requested``,
    ``launcher``, ``verdict``, ``basedirs``, ``refused``), and ``MAX_JOBS`` (sentence and value)."""

    set: dict = dataclasses.field(default_factory=dict)
    pop: list = dataclasses.field(default_factory=list)
    notes: list = dataclasses.field(default_factory=list)
    warnings: list = dataclasses.field(default_factory=list)
    refused: list = dataclasses.field(default_factory=list)
    cache: dict = dataclasses.field(default_factory=dict)
    max_jobs: str = ""
    max_jobs_value: str | None = None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


_FLAG = {"text": None}  # set by `build --compiler-cache` (request_from_flag): how the user asked


def request_from_flag(flag_text: str | None) -> None:
    """Say that this process asked for the cache with a command-line flag (``build
    --compiler-cache sccache``), not with :data:`CACHE_ENV`, so messages name what was typed."""
    _FLAG["text"] = flag_text


def asked_by() -> tuple[str, str, bool]:
    """``(how it was asked for, how to build uncached, by a flag)`` for messages."""
    if _FLAG["text"]:
        return _FLAG["text"], f"drop {_FLAG['text']}", True
    return f"{CACHE_ENV}=sccache", f"unset {CACHE_ENV} / FLASHINFER_NVCC_LAUNCHER", False


def requested(env=None) -> tuple[str | None, str | None]:
    """``(kind, problem)``: ``("sccache", None)`` when the cache is asked for, ``(None, None)``
    when not, ``(None, why)`` for a value we do not know (the message names the fix)."""
    try:
        raw = env_text(CACHE_ENV, env, max_len=64)
    except FormatError as exc:
        return None, str(exc)
    value = (raw or "").strip().lower()
    if value in ("", "0", "off", "no", "none", "false"):
        return None, None
    if value in CACHE_KINDS:
        return value, None
    return None, (f"{CACHE_ENV}={shown(raw, 40)} is not a compiler cache flashinfer-sm120 knows; "
                  f"set it to {' or '.join(CACHE_KINDS)}, or unset it")


def _target_code(targets) -> str:
    """``120f`` for ``[(12, "0f")]``; ``80`` when no target is known (nvcc 11+ builds it)."""
    for major, minor in targets:
        return f"{int(major)}{minor}"
    return "80"


def configure(home: str, nvcc: str, targets, env=None) -> Setup:
    """Decide for ``home`` (the ``CUDA_HOME`` FlashInfer builds with), ``nvcc`` and FlashInfer's
    ``targets``, reading ``env`` (default ``os.environ``) and changing nothing: the compiler variables
    checked, then :func:`plan_builds`.  Never raises."""
    env = os.environ if env is None else env
    try:
        verdicts = compilers.check(env, nvcc, home)
    except Exception as exc:  # a check that fails must not stop patching: said in the notes
        verdicts = exc
    out = from_verdicts(verdicts)
    plan_builds(out, home, nvcc, targets, env)
    return out


def from_verdicts(verdicts) -> Setup:
    """A :class:`Setup` from :func:`flashinfer_sm120.safety.compilers.check`'s verdicts (or the exception
    it raised): the refused variables to pop, each said (P2)."""
    out = Setup()
    if isinstance(verdicts, Exception):
        out.notes.append(f"compiler variables not checked: {verdicts!r}"[:300])
        return out
    for v in verdicts:
        out.notes.append(v.note)
        if not v.keep:
            out.pop.append(v.var)
            out.warnings.append(v.note)
            out.refused.append({"variable": v.var, "value": v.value, "why": v.note})
    return out


def plan_builds(out: Setup, home: str, nvcc: str, targets, env=None) -> None:
    """``MAX_JOBS`` from the memory and the compiler cache, added to ``out``: before the first JIT
    build, since FlashInfer 0.6/0.7 reads ``MAX_JOBS`` and the launchers only in ``run_ninja`` and
    ``generate_ninja_build_for_op`` (``jit/cpp_ext.py``).  Runs the launcher probe when one is in play."""
    from flashinfer_sm120.core.jitenv import jobs

    global _last
    env = os.environ if env is None else env
    targets = list(targets)
    try:
        _user, problem = jobs.flashinfer_max_jobs(env.get("MAX_JOBS"))
        if problem:  # FlashInfer would crash on it or ignore it: ours instead (undone by revert())
            out.pop.append("MAX_JOBS")
        value, why = jobs.server_max_jobs(len(targets) or 1, env)
        if problem:
            out.warnings.append(why)
        out.max_jobs = why
        _jobs["targets"] = len(targets) or 1
        if value is not None:
            out.max_jobs_value = str(value)
    except Exception as exc:
        out.max_jobs = f"MAX_JOBS not exported: {exc!r}"[:300]
    try:
        _cache(out, home, nvcc, targets, env)
    except Exception as exc:
        out.cache["refused"] = f"compiler cache not set up: {exc!r}"[:300]
        out.warnings.append(out.cache["refused"])
    with _lock:
        _last = out


def _nvcc_versions(nvcc: str):
    """``(full, major.minor Version)`` of the chosen nvcc (remembered per binary)."""
    from flashinfer_sm120.core.facts.arch import major_minor
    from flashinfer_sm120.core.toolkit.probe import nvcc_version

    full, _problem = nvcc_version(nvcc)
    return full, major_minor(full) if full else None


def _cache(out: Setup, home: str, nvcc: str, targets, env) -> None:
    kind, problem = requested(env)
    out.cache["requested"] = kind
    if problem:
        out.cache["refused"] = problem
        out.warnings.append(problem)
    user = env.get("FLASHINFER_NVCC_LAUNCHER") if "FLASHINFER_NVCC_LAUNCHER" not in out.pop else None
    if not user and kind != "sccache":
        return
    from flashinfer_sm120.core.jitenv import launcher  # only when a launcher is in play

    nvcc_full, nvcc_version = _nvcc_versions(nvcc)
    fi_nvcc = os.path.join(home, "bin", "nvcc")
    if env.get("FLASHINFER_NVCC") and "FLASHINFER_NVCC" not in out.pop:
        fi_nvcc = env["FLASHINFER_NVCC"]
    static_stub = nvcc_version is None or nvcc_version >= Version("12.8")  # FlashInfer's rule (cpp_ext.py)
    target = _target_code(targets)
    if user:
        prog, others, _problem = compilers.program_of(user, env.get("PATH"))
        out.cache["launcher"] = user
        if kind:
            out.notes.append(f"{CACHE_ENV}={kind}: your FLASHINFER_NVCC_LAUNCHER={user} is used instead")
        if prog is None or len(user.split()) != 1:
            out.cache["verdict"] = {"ok": None, "why": "a launcher of more than one word is not probed"}
            return
        v = launcher.probe_once(prog, fi_nvcc, home, target, nvcc_full, static_stub=static_stub)
        out.cache["verdict"] = v.to_dict()
        if not v.ok:
            out.pop.append("FLASHINFER_NVCC_LAUNCHER")
            out.cache["refused"] = v.why
            out.warnings.append(f"FLASHINFER_NVCC_LAUNCHER={user} is refused: {v.why}")
        return
    if kind != "sccache":
        return
    port = env.get("SCCACHE_SERVER_PORT")
    if port is not None and not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
        out.cache["refused"] = (f"{CACHE_ENV}=sccache: not used: SCCACHE_SERVER_PORT="
                                f"{shown(port, 20)} is not a port from 1 to 65535 (sccache would start "
                                f"a server no client reaches). Fix: set it to a free port such as 4226, or unset it")
        out.warnings.append(out.cache["refused"])
        return
    path, notes = launcher.find_sccache(env)
    out.notes += notes
    how, uncached, by_flag = asked_by()
    if path is None:
        out.cache["refused"] = f"{how}: not used: " + "; ".join(notes) + f"; or {uncached} to build uncached"
        if not by_flag:  # `build` reports a refusal of its own flag as its error, once
            out.warnings.append(out.cache["refused"])
        return
    out.cache["launcher"] = path
    server_env = dict(env)
    if not env.get("SCCACHE_BASEDIRS"):
        dirs = launcher.basedirs(env)
        if dirs:
            out.set["SCCACHE_BASEDIRS"] = server_env["SCCACHE_BASEDIRS"] = os.pathsep.join(dirs)
    out.cache["basedirs"] = server_env.get("SCCACHE_BASEDIRS")
    running = launcher.start_server(path, server_env) or {}
    ours = [d.rstrip("/") for d in (out.set.get("SCCACHE_BASEDIRS") or "").split(os.pathsep) if d]
    theirs = [str(d).rstrip("/") for d in running.get("basedirs") or [] if isinstance(d, str)]
    if ours and set(ours) - set(theirs):
        out.notes.append(f"the sccache server already running (port {env.get('SCCACHE_SERVER_PORT', '4226')}) "
                         f"was started without SCCACHE_BASEDIRS={out.set['SCCACHE_BASEDIRS']}; nodes with other "
                         f"paths will miss its entries until it is restarted ('{path} --stop-server')")
    v = launcher.probe_once(path, fi_nvcc, home, target, nvcc_full, static_stub=static_stub)
    out.cache["verdict"] = v.to_dict()
    if not v.ok:
        out.cache["refused"] = f"{how}: not used: {v.why}; or {uncached} to build uncached"
        if not by_flag:
            out.warnings.append(out.cache["refused"])
        out.set.pop("SCCACHE_BASEDIRS", None)
        return
    out.set["FLASHINFER_NVCC_LAUNCHER"] = path
    if not env.get("FLASHINFER_CXX_LAUNCHER") or "FLASHINFER_CXX_LAUNCHER" in out.pop:
        out.set["FLASHINFER_CXX_LAUNCHER"] = path
    out.notes.append(f"compiler cache: sccache {v.launcher_version or '?'} at {path} compiles with nvcc "
                     f"{nvcc_full or '?'} ({'remembered' if v.remembered else f'probed in {v.seconds} s'})")


def own_max_jobs(value: str) -> None:
    """``MAX_JOBS=value`` was exported by us: :func:`refresh_max_jobs` may update it."""
    with _lock:
        _jobs["value"] = value


def release_max_jobs() -> None:
    """Undo: remove ``MAX_JOBS`` if it is still the value we exported."""
    with _lock:
        if _jobs["value"] is not None and os.environ.get("MAX_JOBS") == _jobs["value"]:
            os.environ.pop("MAX_JOBS", None)
        _jobs["value"] = None


def refresh_max_jobs() -> None:
    """Right before FlashInfer runs ninja: ``MAX_JOBS`` again from the memory left now (a
    server loads its model and KV cache after importing FlashInfer), if it is still ours.
    Never raises."""
    try:
        with _lock:
            mine = _jobs["value"]
            if mine is None or os.environ.get("MAX_JOBS") != mine:
                return
            from flashinfer_sm120.core.jitenv import jobs

            env = {k: v for k, v in os.environ.items() if k != "MAX_JOBS"}
            value, why = jobs.server_max_jobs(_jobs["targets"], env)
            if value is not None and str(value) != mine:
                os.environ["MAX_JOBS"] = _jobs["value"] = str(value)
                logger.info("flashinfer-sm120: %s (memory left now)", why)
    except Exception as exc:  # pragma: no cover - a failed refresh keeps the earlier value
        logger.debug("flashinfer-sm120: MAX_JOBS not refreshed: %r", exc)


def last() -> Setup | None:
    """The last :func:`configure` outcome in this process, or ``None``."""
    with _lock:
        return _last
