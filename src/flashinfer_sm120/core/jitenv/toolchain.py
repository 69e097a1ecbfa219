"""What FlashInfer's JIT builds get besides the toolkit, decided at the first one: the compiler variables checked,
``MAX_JOBS`` from the memory budget and the compiler cache when asked for, applied through the export's undo log."""

from __future__ import annotations

import dataclasses
import logging
import os
import threading

from flashinfer_sm120.safety.compilers import CACHE_ENV, requested

logger = logging.getLogger("flashinfer_sm120")

_lock = threading.RLock()
_state: dict = {"last": None, "flag": None, "jobs": None, "targets": 1, "steps": None}  # jobs: our MAX_JOBS


@dataclasses.dataclass
class Setup:
    """Variables to ``set`` and ``pop``, a sentence per decision and per refusal, the compiler variables ``refused``
    (``build --json``), the compiler ``cache`` (``requested``, ``launcher``, ``verdict``, ``basedirs``, ``refused``)."""

    set: dict = dataclasses.field(default_factory=dict)
    pop: list = dataclasses.field(default_factory=list)
    notes: list = dataclasses.field(default_factory=list)
    warnings: list = dataclasses.field(default_factory=list)
    refused: list = dataclasses.field(default_factory=list)
    cache: dict = dataclasses.field(default_factory=dict)
    max_jobs: str = ""
    max_jobs_value: str | None = None


def request_from_flag(flag_text: str | None) -> None:
    """Messages name the flag (``build --compiler-cache sccache``) instead of :data:`CACHE_ENV`."""
    _state["flag"] = flag_text


def asked_by() -> tuple[str, str, bool]:
    """``(how the cache was asked for, how to build uncached, by a flag)`` for messages."""
    if _state["flag"]:
        return _state["flag"], f"drop {_state['flag']}", True
    return f"{CACHE_ENV}=sccache", f"unset {CACHE_ENV} / FLASHINFER_NVCC_LAUNCHER", False


def configure(home: str, nvcc: str, targets, env=None, verdicts=None, listing: bool = False) -> Setup:
    """Decide from ``env``, changing nothing (``verdicts``: :func:`.compilers.check`'s, when known; ``listing``: run no
    compiler cache, P4); never raises."""
    env = os.environ if env is None else env
    if verdicts is None:
        from flashinfer_sm120.safety import compilers

        try:
            verdicts = compilers.check(env, nvcc, home)
        except Exception as exc:  # a check that fails must not stop patching: said in the notes
            verdicts = exc
    out = Setup()
    if isinstance(verdicts, Exception):
        out.notes.append(f"compiler variables not checked: {verdicts!r}"[:300])
        verdicts = []
    for v in verdicts:
        out.notes.append(v.note)
        if not v.keep:  # P2 (said by the export at import; build --json lists them)
            out.pop.append(v.var)
            out.refused.append({"variable": v.var, "value": v.value, "why": v.note})
    targets = list(targets)
    try:  # FlashInfer 0.6/0.7 reads MAX_JOBS and the launchers only in run_ninja (jit/cpp_ext.py)
        from flashinfer_sm120.core.jitenv import memory

        _state["targets"] = len(targets) or 1
        value, out.max_jobs = memory.server_max_jobs(_state["targets"], env)
        out.max_jobs_value = None if value is None else str(value)
        if memory.max_jobs(env)[2]:  # FlashInfer would crash on it or ignore it: ours instead (undone by revert())
            out.pop.append("MAX_JOBS")
            out.warnings.append(out.max_jobs)
    except Exception as exc:
        out.max_jobs = f"MAX_JOBS not exported: {exc!r}"[:300]
    try:
        kind, problem = requested(env)
        out.cache["requested"] = kind
        if problem:
            out.cache["refused"] = problem
            out.warnings.append(problem)
        if kind or (env.get("FLASHINFER_NVCC_LAUNCHER") and "FLASHINFER_NVCC_LAUNCHER" not in out.pop):
            from flashinfer_sm120.core.jitenv import launcher  # only when a launcher is in play

            launcher.configure(out, home, nvcc, targets, env, listing)
    except Exception as exc:
        out.cache["refused"] = f"compiler cache not set up: {exc!r}"[:300]
        out.warnings.append(out.cache["refused"])
    with _lock:
        _state["last"] = out
    return out


def prepare_builds(listing: bool = False) -> None:
    """At FlashInfer's first JIT build: :func:`configure`, applied through the export's undo log; never raises."""
    from flashinfer_sm120.core.jitenv import environ

    with _lock:  # held while deciding: a second builder waits for MAX_JOBS
        pending = environ.take_pending()
        if pending is None:
            return
        steps, verdicts, (home, nvcc, targets) = pending
        try:
            setup = configure(home, nvcc, targets, verdicts=verdicts, listing=listing)
            for name in setup.pop:  # those refused at import are gone already: nothing to undo twice
                steps.set_env(name, None)
            for name, value in setup.set.items():
                steps.set_env(name, value)
            if setup.max_jobs_value is not None:  # ours to refresh before each build (refresh_max_jobs)
                steps.set_env("MAX_JOBS", setup.max_jobs_value)
                _state.update(jobs=setup.max_jobs_value, steps=steps)
                steps.add("MAX_JOBS", lambda: _state.update(jobs=None))
            for line in setup.warnings:
                logger.warning("flashinfer-sm120: %s", line)
            steps.info["builds"] = dataclasses.asdict(setup)
        except Exception as exc:
            steps.info["builds"] = f"failed: {exc!r}"
            logger.warning("flashinfer-sm120: setting up JIT builds failed: %r", exc)


def refresh_max_jobs() -> None:
    """Before each ninja run: our ``MAX_JOBS`` from the memory left now (a model loads after import); never raises."""
    try:
        with _lock:
            mine = _state["jobs"]
            if mine is None or os.environ.get("MAX_JOBS") != mine:
                return
            from flashinfer_sm120.core.jitenv import memory

            env = {k: v for k, v in os.environ.items() if k != "MAX_JOBS"}
            value, why = memory.server_max_jobs(_state["targets"], env)
            if value is not None and str(value) != mine:
                _state["steps"].set_env("MAX_JOBS", str(value))  # undone in turn: back to ours, then to theirs
                _state["jobs"] = str(value)
                logger.info("flashinfer-sm120: %s (memory left now)", why)
    except Exception as exc:  # pragma: no cover - a failed refresh keeps the earlier value
        logger.debug("flashinfer-sm120: MAX_JOBS not refreshed: %r", exc)


def last() -> Setup | None:
    """The last :func:`configure` outcome in this process, or ``None``."""
    with _lock:
        return _state["last"]
