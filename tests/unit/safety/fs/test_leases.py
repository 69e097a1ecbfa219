"""Leases (docs/threat-model.md P3): a process that uses a CUDA_HOME view or a JIT workspace
holds a shared lock on it, and ``cache prune`` keeps whatever it cannot lock exclusively.

Every test runs real processes: a child Python that imports FlashInfer patched by this package
and stays alive (idle, as a server between requests is), and the real ``flashinfer-sm120 cache
prune``.  Origin: ``cache prune --older-than 0 --yes`` removed the view of a running idle
process (``/proc/<pid>/environ`` is the environment at exec, the exported ``CUDA_HOME`` comes
later), after a toolkit reinstall too, and the views of workers starting while it ran.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers import TESTS
from helpers.child import cli
from helpers.host import needs_flashinfer
from helpers.views import pip_like
from flashinfer_sm120.safety.fs import inuse

pytestmark = needs_flashinfer

#: A patched process: prints ``@@{json}`` once FlashInfer is patched, then idles until stdin closes.
LIVE = """
import helpers.fakegpu, json, os, sys
import flashinfer_sm120, flashinfer
import flashinfer.jit.env as jit_env
from flashinfer_sm120.safety.fs import lease
home = os.environ.get("CUDA_HOME")
ws = str(jit_env.FLASHINFER_WORKSPACE_DIR)
if os.environ.get("LIVE_MODULE"):  # a module FlashInfer built here (fake bytes: nothing maps it)
    d = os.path.join(ws, "cached_ops", "sampling")
    os.makedirs(d, exist_ok=True)
    open(os.path.join(d, "sampling.so"), "wb").write(b"\\x7fELF" + bytes(64))
out = dict(home=home, ws=ws, mode=flashinfer_sm120.status()["mode"], pid=os.getpid(),
           leased=lease.held(home) and lease.held(ws))
{extra}
print("@@" + json.dumps(out), flush=True)
sys.stdin.read()
"""


#: ``python -c FORK_WORKERS CODE N``: import torch once, then run CODE in N forked children, each line they print
#: written whole by one ``write`` (they share one pipe, and PYTHONUNBUFFERED splits a print in two writes).
FORK_WORKERS = """
import atexit, os, sys
import helpers.fakegpu
import torch


class Lines:
    def __init__(self):
        self.part = ""

    def write(self, text):
        *whole, self.part = (self.part + text).split("\\n")
        for line in whole:
            os.write(1, (line + "\\n").encode())
        return len(text)

    def flush(self):
        pass


kids = []
for _ in range(int(sys.argv[2])):
    pid = os.fork()
    if pid == 0:
        sys.stdout = Lines()
        exec(compile(sys.argv[1], "<worker>", "exec"), {"__name__": "__main__"})
        atexit._run_exitfuncs()
        os._exit(0)
    kids.append(pid)
for pid in kids:
    os.waitpid(pid, 0)
"""


@pytest.fixture
def world(tmp_path):
    """Private caches, a pip-like toolkit (it needs a view), one simulated SM120 GPU."""
    tk = pip_like(tmp_path / "tk", "13.0.88")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLASHINFER", "CUDA_", "SGLANG"))}
    env.update(HOME=str(tmp_path / "home"), FLASHINFER_SM120_CACHE_DIR=str(tmp_path / "ours"),
               FLASHINFER_WORKSPACE_BASE=str(tmp_path / "base"), SGLANG_CACHE_DIR=str(tmp_path / "sglang"),
               CUDA_HOME=str(tk), FAKE_GPU_CAPS="12.0", FAKE_TORCH_CUDA="13.0",
               PYTHONPATH=os.pathsep.join([str(TESTS)] + [p for p in os.environ.get("PYTHONPATH", "").split(
                   os.pathsep) if p]))
    (tmp_path / "home").mkdir()
    (tmp_path / "ours").mkdir(mode=0o700)
    return {"env": env, "tk": tk, "tmp": tmp_path}


def start(env: dict, extra: str = "", **kw) -> tuple[subprocess.Popen, dict]:
    """A live patched child and what it printed."""
    p = subprocess.Popen([sys.executable, "-c", LIVE.replace("{extra}", extra)], env=env, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
    line = p.stdout.readline()
    if not line.startswith("@@"):
        p.kill()
        raise AssertionError(f"child printed {line!r}:\n{p.stderr.read()[-4000:]}")
    return p, json.loads(line[2:])


def stop(p: subprocess.Popen) -> None:
    if p.poll() is None:
        p.stdin.close()
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def prune(env: dict, *args: str, ns: bool = False) -> dict:
    """The real ``flashinfer-sm120 cache prune --older-than 0 --yes --json`` (in a new PID
    namespace with its own /proc when ``ns``): ``{path: entry}``."""
    proc = cli(["cache", "prune", "--older-than", "0", "--yes", "--json", *args], env, 300, python=sys.executable,
               prefix=["unshare", "-pf", "--mount-proc"] if ns else ())
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stdout[-2000:] + proc.stderr[-4000:]
    return {e["path"]: e for e in json.loads(proc.stdout)["entries"]}


def test_an_idle_patched_process_keeps_its_view_and_workspace(world):
    """The view and JIT workspace of a live idle process are kept by its lease, and go once it exits."""
    p, out = start(dict(world["env"], LIVE_MODULE="1"))
    try:
        home, ws = out["home"], out["ws"]
        assert out["mode"] == "patched" and home.startswith(str(world["tmp"] / "ours")), out
        assert out["leased"]
        got = prune(world["env"])
        assert got[home]["reason"] and "lease" in (got[home]["kept"] or ""), got[home]
        assert got[ws]["reason"] and "lease" in (got[ws]["kept"] or ""), got[ws]
        assert os.access(os.path.join(home, "bin", "nvcc"), os.X_OK) and os.path.isdir(ws)
    finally:
        stop(p)
    got = prune(world["env"])
    assert got[home]["removed"] and not os.path.lexists(home)
    assert got[ws]["removed"] and not os.path.lexists(os.path.join(ws, "cached_ops"))
    assert not os.path.lexists(os.path.join(os.path.dirname(home), f".{os.path.basename(home)}.lease"))


def test_a_view_whose_toolkit_was_reinstalled_stays_while_a_process_uses_it(world):
    p, out = start(world["env"])
    try:
        nvcc = world["tk"] / "bin" / "nvcc"
        text = nvcc.read_text()
        nvcc.unlink()
        nvcc.write_text(text + "# reinstalled\n")  # a new file: the view's fingerprint no longer matches
        nvcc.chmod(0o755)
        got = prune(world["env"])
        assert "toolkit changed" in got[out["home"]]["reason"] and "lease" in (got[out["home"]]["kept"] or "")
        assert os.path.isfile(os.path.join(out["home"], "bin", "nvcc"))
    finally:
        stop(p)
    assert prune(world["env"])[out["home"]]["removed"]


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root and unshare(1)")
def test_a_prune_in_another_pid_namespace_keeps_a_leased_view(world):
    """There, /proc shows none of the user's processes: only the lease (a file lock) can tell."""
    p, out = start(world["env"])
    try:
        got = prune(world["env"], ns=True)
        assert "lease" in (got[out["home"]]["kept"] or "") and os.path.isdir(out["home"])
    finally:
        stop(p)


def test_a_forked_child_holds_the_lease_after_its_parent_exits(world):
    extra = ("r, w = os.pipe()\nif os.fork() == 0:\n    os.close(r); os.write(w, b'x'); os.close(w)\n"
             "    sys.stdin.read(); os._exit(0)\n"
             "os.close(w); os.read(r, 1); out['child'] = os.waitpid(-1, os.WNOHANG)[0] == 0\n"
             "print('@@' + json.dumps(out), flush=True); os._exit(0)")
    p = subprocess.Popen([sys.executable, "-c", LIVE.replace("{extra}", extra)], env=world["env"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out = json.loads(p.stdout.readline()[2:])
        assert p.wait(timeout=60) == 0 and out["child"]  # the parent is gone, its fork lives on
        assert inuse.lease_state(out["home"]) is not None
        assert "lease" in (prune(world["env"])[out["home"]]["kept"] or "") and os.path.isdir(out["home"])
    finally:
        p.stdin.close()  # the fork reads the same stdin: it exits now
    deadline = time.monotonic() + 60
    while inuse.lease_state(out["home"]) is not None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert prune(world["env"])[out["home"]]["removed"]


def test_a_program_the_process_runs_never_holds_the_lease(world):
    """The lease descriptor is close-on-exec: a daemon started by a patched process (a compiler
    cache server, a detached nvcc) does not keep the view leased after the process exits."""

    extra = ("import subprocess\nd = subprocess.Popen(['sleep', '300'], close_fds=False, "
             "start_new_session=True)\nout['daemon'] = d.pid\n"
             "out['fds'] = sorted(os.readlink(f'/proc/{d.pid}/fd/' + n) for n in os.listdir(f'/proc/{d.pid}/fd'))")
    p, out = start(world["env"], extra)
    try:
        stop(p)
        assert os.path.exists(f"/proc/{out['daemon']}")
        assert not [f for f in out["fds"] if f.endswith(".lease")], out["fds"]
        assert inuse.lease_state(out["home"]) is None
    finally:
        os.kill(out["daemon"], 9)


@pytest.mark.slow  # over 4 s in the quick run (--durations, 2026-12-02)
def test_a_spawned_worker_takes_its_own_lease(world):
    """A ``multiprocessing`` spawn worker is a new Python: it inherits ``CUDA_HOME`` (the view), not
    the descriptor, and takes its own lease when it imports FlashInfer."""

    worker = ("import helpers.fakegpu, os, sys, json, flashinfer_sm120, flashinfer\nfrom flashinfer_sm120.safety.fs import lease\n"
              "h = os.environ['CUDA_HOME']\nos.write(1, ('@@' + json.dumps(dict(pid=os.getpid(), "
              "own=lease.held(h))) + '\\n').encode())\nimport time\ntime.sleep(600)\n")
    extra = (f"import multiprocessing as mp\nw = mp.get_context('spawn').Process(target=exec, args=({worker!r},))\n"
             "w.start()\nprint('@@' + json.dumps(out), flush=True)\nsys.stdin.read()\nos._exit(0)")
    p = subprocess.Popen([sys.executable, "-c", LIVE.replace("{extra}", extra)], env=world["env"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out = json.loads(p.stdout.readline()[2:])
    line = p.stdout.readline()
    assert line.startswith("@@"), p.stderr.read()[-3000:]
    w = json.loads(line[2:])
    try:
        stop(p)  # the parent exits; the spawned worker lives on
        assert w["own"] and os.path.exists(f"/proc/{w['pid']}")
        assert inuse.lease_state(out["home"]) is not None
        assert "lease" in (prune(world["env"])[out["home"]]["kept"] or "") and os.path.isdir(out["home"])
    finally:
        os.kill(w["pid"], 9)


@pytest.mark.slow
def test_workers_starting_while_prune_runs_all_end_with_an_existing_cuda_home(world):
    """Four workers start while prunes run back to back: each one ends with a CUDA_HOME that exists
    (it leased the view, then checked it, else built it anew). One round: the interleaving this
    samples is pinned deterministically by the next test; this one checks the whole, with real
    processes."""
    env = world["env"]
    p, first = start(env)
    stop(p)  # a view exists, leased by nobody: every prune below may remove it
    for _ in range(1):
        # one process pruning back to back (a new interpreter per prune spent most of this test's CPU
        # on start-up, not on racing the workers)
        pruning = subprocess.Popen(
            [sys.executable, "-c", "import contextlib, io, os, sys\nfrom flashinfer_sm120.cli import main\n"
             "while not os.path.exists(os.environ['STOP']):\n"
             "    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
             "        main(['cache', 'prune', '--older-than', '0', '--yes'])\n"],
            env=dict(env, STOP=str(world["tmp"] / "stop")))
        workers = []
        # the four workers fork from one process that imported torch (as a server's fork-started workers):
        # the race is in choosing and leasing the view, not in importing torch four times
        procs = [subprocess.Popen([sys.executable, "-c", FORK_WORKERS, LIVE.replace("{extra}", ""), "4"], env=env,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)]
        try:
            for _ in range(4):
                line = procs[0].stdout.readline()
                assert line.startswith("@@"), procs[0].stderr.read()[-3000:]
                workers.append((procs[0], json.loads(line[2:])))
            (world["tmp"] / "stop").touch()
            pruning.wait(timeout=300)
            prune(env)  # one more, after every worker started
            for _, out in workers:
                assert os.access(os.path.join(out["home"], "bin", "nvcc"), os.X_OK), out
        finally:
            (world["tmp"] / "stop").touch()
            for q in procs:
                stop(q)
            pruning.wait(timeout=300)
            (world["tmp"] / "stop").unlink()


def test_a_chooser_that_finds_the_view_being_removed_waits_then_builds_it_anew(world, monkeypatch):
    """Check, then use, under the lease: the chooser adopts the view, waits for the lease a prune
    holds exclusively while removing it, finds it gone and builds it again (deterministic: the
    prune's part is played here, between the chooser's first wait and its retry)."""
    import threading

    from flashinfer_sm120.safety.fs import lease, statedir
    from flashinfer_sm120.diagnose.tree import remove_tree
    from flashinfer_sm120.core.toolkit.probe import inspect
    from flashinfer_sm120.core.view.build import linkable_home

    monkeypatch.setenv("FLASHINFER_SM120_CACHE_DIR", world["env"]["FLASHINFER_SM120_CACHE_DIR"])
    statedir.forget_cache_root()
    p, out = start(world["env"])
    stop(p)  # the view exists and nobody leases it
    view = out["home"]
    fd = inuse.take_exclusive(view)  # the prune's part: the lease, exclusively
    assert fd is not None
    waiting, waits, real_sleep = threading.Event(), [], time.sleep

    def sleep(s):
        waits.append(s)
        waiting.set()
        real_sleep(s)

    monkeypatch.setattr(lease.time, "sleep", sleep)
    got = []
    t = threading.Thread(target=lambda: got.append(linkable_home(inspect(str(world["tk"])))))
    t.start()
    try:
        assert waiting.wait(60)  # the chooser adopted the view and waits for its lease
        remove_tree(view)
        inuse.end_exclusive(view, fd, removed=True)
    finally:
        t.join(120)
    try:
        assert got and got[0].path == view and got[0].is_view, got
        assert os.access(os.path.join(view, "bin", "nvcc"), os.X_OK) and lease.held(view) and inuse.lease_state(view) is not None
        assert len(waits) >= 1
    finally:
        lease.release(view)
        statedir.forget_cache_root()


def test_prune_removes_lease_files_left_without_their_view_unless_held(world):
    """A chooser that found its view removed leaves a lease file; prune removes it, but never one
    a process holds (a chooser about to build that view)."""
    views = world["tmp"] / "ours" / "cuda-home"
    views.mkdir(mode=0o700)
    orphan = views / ".cuda-13.0.48-0123456789ab.lease"
    orphan.touch()
    code = ("import sys\nfrom flashinfer_sm120.safety.fs import lease\nassert lease.hold(sys.argv[1])\n"
            "print('held', flush=True)\nsys.stdin.read()\n")
    p = subprocess.Popen([sys.executable, "-c", code, str(views / "cuda-13.0.88-coming")], env=world["env"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "held"
        prune(world["env"])
        assert not orphan.exists() and (views / ".cuda-13.0.88-coming.lease").exists()
    finally:
        stop(p)
    prune(world["env"])
    assert not (views / ".cuda-13.0.88-coming.lease").exists()


@given(st.text(st.characters(blacklist_characters="/\0", blacklist_categories=("Cs",)), min_size=1, max_size=200))
def test_a_lease_file_lies_beside_its_directory_and_names_it_back(name):
    """Any directory name: its lease file is hidden, beside it, and maps back to it; names that
    are no lease file map to nothing (prune's sweep reads them back)."""
    from flashinfer_sm120.safety.fs import lease

    if name in (".", ".."):
        return
    target = os.path.join("/c/cuda-home", name)
    path = lease.lease_path(target)
    assert os.path.dirname(path) == "/c/cuda-home" and os.path.basename(path).startswith(".")
    assert inuse.target_of(path) == target
    assert inuse.target_of(target) is None or name.startswith(".") and name.endswith(".lease")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory to another uid")
def test_no_lease_or_workspace_is_created_in_a_tree_another_uid_owns(tmp_path, monkeypatch):
    """With ``FLASHINFER_WORKSPACE_BASE`` in a shared place where another uid made the
    ``.cache/flashinfer/<version>/<arch>`` levels (mode 777), importing FlashInfer creates no lease file and
    no workspace directory in that uid's tree, besides warning that the JIT directory "fails the trust
    rule"; a lease file they planted and hold exclusively must not make every import wait 90 s (P4)."""
    from flashinfer_sm120.core.patch import steps
    from flashinfer_sm120.safety.fs import lease

    held = []
    monkeypatch.setattr(lease, "hold", lambda path, *a, **k: held.append(path) or True)
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(tmp_path, 0o755)
    theirs = shared / ".cache" / "flashinfer" / "0.7.4" / "120f"
    theirs.mkdir(parents=True)
    for p in (shared, *theirs.relative_to(shared).parents, theirs.relative_to(shared)):
        os.chown(shared / p, 65534, 65534)
        os.chmod(shared / p, 0o777)
    before = sorted(os.listdir(theirs))
    steps._lease_workspace(str(theirs / "nvcc13.0.88-0123abcd"))
    assert sorted(os.listdir(theirs)) == before
    assert held == []  # no lease taken, so none of theirs waited on


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory to another uid")
def test_no_lease_below_levels_flashinfer_made_inside_another_uids_tree(tmp_path):
    """FlashInfer's import makes the missing workspace levels first (owned by this user) inside the other
    uid's FLASHINFER_WORKSPACE_BASE, so the check looks at every level, not only the deepest (P4)."""
    from flashinfer_sm120.core.patch import steps
    from flashinfer_sm120.safety.fs import lease

    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(tmp_path, 0o755)
    os.chown(shared, 65534, 65534)
    os.chmod(shared, 0o755)
    ours = shared / ".cache" / "flashinfer" / "0.7.4" / "120f"
    ours.mkdir(parents=True)  # as FlashInfer's import would, as this user, inside their tree
    ws = str(ours / "nvcc13.0.88-0123abcd")
    assert "uid 65534" in (lease.place_problem(ws) or "")
    steps._lease_workspace(ws)
    assert os.listdir(ours) == []


def test_no_lease_through_a_planted_link_level(tmp_path):
    """A level of the workspace path that another user could plant as a link (in a directory everyone may
    write) is not followed: no lease file is created where it points (P2, P4)."""
    from flashinfer_sm120.core.patch import steps
    from flashinfer_sm120.safety.fs import lease

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    opened = tmp_path / "open"
    opened.mkdir()
    opened.chmod(0o777)
    (opened / "120f").symlink_to(elsewhere)
    ws = str(opened / "120f" / "nvcc13.0.88-0123abcd")
    assert "writable by other users" in (lease.place_problem(ws) or "")
    steps._lease_workspace(ws)
    assert os.listdir(elsewhere) == []
    assert lease.place_problem(str(elsewhere / "nvcc13.0.88-0123abcd")) is None  # its own place is fine


def test_a_view_on_a_read_only_file_system_is_leased_by_reading_its_lease_file(tmp_path, monkeypatch):
    """A read-only image's FLASHINFER_SM120_CACHE_DIR holding its views left FlashInfer unpatched ("cannot take
    the CUDA_HOME view lock ... read-only file system"): flock needs no write access (P3 holds: nothing on a
    read-only file system can be removed)."""
    import errno
    import fcntl

    from flashinfer_sm120.safety.fs import lease

    view = tmp_path / "view"
    view.mkdir()
    path = lease.lease_path(str(view))
    open(path, "w").close()
    real_open = os.open

    def read_only(p, flags, *mode):
        if flags & (os.O_RDWR | os.O_WRONLY | os.O_CREAT):
            raise OSError(errno.EROFS, "Read-only file system", p)
        return real_open(p, flags, *mode)

    monkeypatch.setattr(lease.os, "open", read_only)
    fd, busy = lease.try_lock(path, fcntl.LOCK_SH)
    assert fd is not None and not busy
    os.close(fd)
    assert lease.try_lock(path, fcntl.LOCK_EX) == (None, False)  # a removal never works read-only
