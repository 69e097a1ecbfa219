"""The fork server behind ``run_py``/``run_code`` (tests/helpers/forkserver.py) gives a child what a new
``python -c`` would have: the same sys.path, argv, environment, working directory, temp dir, exit
status, streams and exit handlers, and nothing of FlashInfer or flashinfer_sm120 imported."""

import json
import os
import site
import subprocess
import sys
import types

import pytest

from helpers import child, forkserver

PROBE = r"""
import atexit, json, os, sys, tempfile
atexit.register(lambda: print("atexit ran"))
print(json.dumps({
    "argv": sys.argv, "path": [p for p in sys.path if "forkserver" not in p], "cwd": os.getcwd(),
    "env": {k: os.environ.get(k) for k in ("PROBE_VAR", "PYTHONPATH", "FLASHINFER_SM120_CACHE_DIR")},
    "tmp": tempfile.gettempdir(), "user_site": __import__("site").getusersitepackages(), "name": __name__, "dont_write_bytecode": sys.dont_write_bytecode,
    "ours": sorted(m for m in sys.modules if m.split(".")[0] in ("flashinfer", "flashinfer_sm120", "fakegpu")),
}))
print("to stderr", file=sys.stderr)
sys.exit(int(sys.argv[1]))
"""


@pytest.fixture
def server():
    server = child.forkserver()  # started on first use
    if server is None:
        pytest.skip("the fork server is off (--no-forkserver) or could not start")
    return server


def test_a_forked_child_sees_what_a_new_interpreter_sees(server, tmp_path):
    (tmp_path / "tmp").mkdir()
    env = dict(os.environ, PROBE_VAR="x", PYTHONPATH=os.pathsep.join([str(tmp_path), "relative/dir"]),
               TMPDIR=str(tmp_path / "tmp"), FLASHINFER_SM120_CACHE_DIR=str(tmp_path / "c"))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if not site.ENABLE_USER_SITE:  # a venv: HOME changes no start-up, only site's HOME paths
        env["HOME"] = str(tmp_path / "home")
    assert server.usable_for(env)
    forked = server.run(PROBE, env, 120, cwd=str(tmp_path), args=["3"])
    real = subprocess.run([sys.executable, "-c", PROBE, "3"], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert forked.returncode == real.returncode == 3
    assert forked.stderr == real.stderr == "to stderr\n"
    f_lines, r_lines = forked.stdout.splitlines(), real.stdout.splitlines()
    assert f_lines[1:] == r_lines[1:] == ["atexit ran"]
    f, r = json.loads(f_lines[0]), json.loads(r_lines[0])
    assert f == r, (f, r)
    assert f["ours"] == [] and f["tmp"] == str(tmp_path / "tmp") and f["argv"] == ["-c", "3"]
    assert f["user_site"].startswith(env["HOME"])


@pytest.mark.parametrize("code, rc, err", [("raise ValueError('boom')", 1, "ValueError: boom"),
                                           ("raise SystemExit('bye')", 1, "bye"),
                                           ("import os; os._exit(7)", 7, ""),
                                           ("import os, signal; os.kill(os.getpid(), signal.SIGTERM)", -15, "")])
def test_exit_status_and_errors_match_a_new_interpreter(server, code, rc, err):
    env = dict(os.environ)
    forked = server.run(code, env, 60)
    real = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert forked.returncode == real.returncode == rc
    assert err in forked.stderr and err in real.stderr


def test_a_timeout_kills_the_child_and_the_server_goes_on(server):
    with pytest.raises(subprocess.TimeoutExpired):
        server.run("import time; time.sleep(60)", dict(os.environ), 1)
    assert server.run("print('next')", dict(os.environ), 60).stdout == "next\n"


def test_answers_that_arrive_together_are_each_read_and_a_stale_one_skipped():
    """The client read the server through a buffered file and waited on ``select``: when ``pid`` and
    ``rc`` arrived in one read (a loaded machine), the second sat in the buffer and the client waited
    out its timeout; then a kill of the gone child raised, the ``rc`` line stayed unread, and every
    later answer went to the wrong request (22 failures in one suite run)."""
    r, w = os.pipe()
    client = forkserver.Client.__new__(forkserver.Client)
    client.proc, client._buf = types.SimpleNamespace(stdout=open(r, "rb")), b""
    try:
        os.write(w, b'{"pid": 5, "id": 1}\n{"rc": 0, "id": 1}\n{"rc": 3, "id": 2}\n{"pid": 6, "id": 3}\n')
        assert client._read(30) == {"pid": 5, "id": 1}
        assert client._read(30) == {"rc": 0, "id": 1}  # already read with the first: no wait on select
        assert client._answer("pid", 3, 30) == {"pid": 6, "id": 3}  # request 2 was abandoned: skipped
    finally:
        os.close(w)
        client.proc.stdout.close()


@pytest.mark.parametrize("change", ["PYTHONNOUSERSITE", "LD_PRELOAD", "sitecustomize",
                                    *(("HOME",) if site.ENABLE_USER_SITE else ())])
def test_start_up_differences_get_a_new_interpreter(server, tmp_path, change):
    env = dict(os.environ)
    if change == "sitecustomize":
        (tmp_path / "sitecustomize.py").write_text("")
        env["PYTHONPATH"] = str(tmp_path)
    else:
        env[change] = str(tmp_path) if change != "PYTHONNOUSERSITE" else "1"
    assert forkserver.fresh_env_needed(env, server.server_env) is not None
    assert not server.usable_for(env)
