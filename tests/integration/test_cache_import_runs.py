"""`cache import`: one verified install step for archive and directory exports (the same caps, free-space
check and locking), temporary files with random names removed only by their creator, FlashInfer's
per-module lock held while installing, so importers in separate PID namespaces (containers, all pid 1)
sharing one JIT dir both succeed.  threat-model: P5, P6, P7.

Export then import: a warmed JIT cache moves to another machine and FlashInfer's own build finds nothing to
do there; mismatches and unsafe archives are refused; an existing different entry is never clobbered
silently.  Compiles with a fake nvcc (ninja files are real)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from helpers.child import cli, run_py
from helpers.exports import TOP, as_archive, make_export, sha, tar_bytes, tar_member
from helpers.host import needs_flashinfer
from helpers.warm import LOAD_AGAIN

pytestmark = needs_flashinfer


#: Installs the export argv[1] with the caps argv[2] (bytes) into this environment's JIT dir, after
#: the go-file argv[3] appears (if given); prints one ``@@`` JSON line.  Settling (regenerating
#: build.ninja, asking ninja) is covered by test_export_then_import_on_a_fresh_machine_is_up_to_date; here it is
#: a no-op.
INSTALL = r"""
import json, os, sys, time
from pathlib import Path
from flashinfer_sm120.warmup import cache, cache_import, session
from flashinfer.jit import env as jit_env
src, max_total = sys.argv[1], int(sys.argv[2])
go = sys.argv[3] if len(sys.argv) > 3 else None
cache_import._settle = lambda entry, sess: {}
cache_import._refusal = lambda *a: None  # entries and sources: the export-then-import test below and safety section 4
out = {"jit_dir": str(jit_env.FLASHINFER_JIT_DIR), "pid": os.getpid()}
try:
    meta = cache_import.check(src)
    fp = meta.fingerprint
    sess = session.Session(fp["flashinfer"], fp["cuda_home"], fp["cuda_version"], fp["targets"],
                           Path(fp["jit_dir"]), "")
    if go:
        Path(go + "." + sys.argv[4]).touch()
        while not os.path.exists(go):
            time.sleep(0.005)
    out["report"] = cache_import.install(src, meta, sess, limits=cache.Limits(max_total=max_total))
except session.BuildError as exc:
    out.update(error=str(exc), kind=getattr(exc, "kind", None))
print("@@" + json.dumps(out))
"""



def _run(env, *args, prefix=(), preexec_fn=None):
    return subprocess.Popen([*prefix, sys.executable, "-c", INSTALL, *map(str, args)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=preexec_fn)


def _result(proc, timeout=300) -> dict:
    out, err = proc.communicate(timeout=timeout)
    for line in reversed(out.splitlines()):
        if line.startswith("@@"):
            return json.loads(line[2:])
    raise AssertionError(f"no result (exit {proc.returncode}):\n{out[-2000:]}\n{err[-4000:]}")


@pytest.mark.parametrize("form", ["directory", "archive"])
def test_max_bytes_holds_for_both_forms_before_anything_is_written(clean_env, tmp_path, form):
    """--max-bytes holds for a directory export as for an archive: 120 MiB of sparse files against a 64M cap
    is refused before anything is written (P6, P7)."""
    src = make_export(tmp_path / "exp", {"jit/m/m.so": 60 << 20, "jit/m/a.o": 60 << 20})
    if form == "archive":
        src = as_archive(src, tmp_path / "exp.tar.gz")
    res = _result(_run(clean_env, src, 64 << 20))
    assert res.get("kind") == "limit" and "64" in res["error"] and "--max-bytes" in res["error"], res
    assert not (Path(res["jit_dir"]) / "m").exists()


@pytest.mark.parametrize("form", ["directory", "archive"])
def test_free_space_is_checked_for_both_forms_before_anything_is_written(clean_env, tmp_path, form):
    src = make_export(tmp_path / "exp", {"jit/m/m.so": 40 << 20})
    if form == "archive":
        src = as_archive(src, tmp_path / "exp.tar.gz")
    ws = tmp_path / "ws"
    ws.mkdir()
    # a 16 MiB file system for the JIT dir (a private mount namespace; the unpack dir stays on /tmp)
    code = f"mount -t tmpfs -o size=16m tmpfs {ws} && exec \"$@\""
    res = _result(_run(dict(clean_env, FLASHINFER_WORKSPACE_BASE=str(ws)), src, 1 << 30,
                       prefix=("unshare", "-m", "sh", "-c", code, "sh")))
    assert res.get("kind") == "space" and "free" in res["error"], res
    assert "FLASHINFER_WORKSPACE_BASE must be the same" in res["error"], res  # P8: the real fix, not "set it elsewhere"


@pytest.mark.parametrize("form", ["directory", "archive"])
def test_a_file_over_the_file_size_limit_is_refused_naming_the_export_and_the_limit(clean_env, tmp_path, form):
    """Under `ulimit -f` a module file larger than the limit was refused naming only the unpack directory,
    with "set TMPDIR to another directory", which cannot help with a file-size limit (P8)."""
    import resource

    src = make_export(tmp_path / "exp", {"jit/m/m.so": 2 << 20})
    if form == "archive":
        src = as_archive(src, tmp_path / "exp.tar.gz")
    limit = 1 << 20
    res = _result(_run(clean_env, src, 1 << 30,
                       preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))))
    assert res.get("kind") == "limit", res
    assert str(src) in res["error"] and "RLIMIT_FSIZE" in res["error"] and str(limit) in res["error"], res
    assert "ulimit -f" in res["error"] and "TMPDIR" not in res["error"], res
    assert not (Path(res["jit_dir"]) / "m").exists()


def _race(env, src, tmp_path, rounds=2):
    for r in range(rounds):
        go = tmp_path / f"go{r}"
        procs = [_run(env, src, 1 << 30, go, i, prefix=("unshare", "-pf", "--mount-proc")) for i in (0, 1)]
        while not all(Path(f"{go}.{i}").exists() for i in (0, 1)):
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
            time.sleep(0.01)
        go.touch()
        yield [_result(p) for p in procs]


@pytest.mark.slow  # over 4 s in the quick run (--durations, 2026-12-02)
def test_importers_in_separate_pid_namespaces_both_succeed(clean_env, tmp_path):
    """Two containers (both pid 1) importing one export into a shared JIT dir both succeed: part files must
    not be named by pid (`.{name}.import-{pid}` collides across pid namespaces), and only their creator
    removes them, never whichever importer failed (P5)."""
    files = {f"jit/m/p{i}.o": os.urandom(1 << 20) * 8 for i in range(4)}
    files["jit/m/m.so"] = os.urandom(1 << 20) * 8
    src = make_export(tmp_path / "exp", files)
    for r, results in enumerate(_race(clean_env, src, tmp_path)):
        assert [res.get("error") for res in results] == [None, None], results
        assert {res["pid"] for res in results} == {1}
        statuses = sorted(res["report"][0]["status"] for res in results)
        assert statuses == ["already present", "installed"], (r, results)
        jit = Path(results[0]["jit_dir"]) / "m"
        assert sorted(p.name for p in jit.iterdir()) == sorted(Path(f).name for f in files)  # no part left
        for rel, data in files.items():
            assert (jit / Path(rel).name).read_bytes() == data
        for p in jit.iterdir():
            p.unlink()


@pytest.mark.slow  # over 4 s in the quick run (--durations, 2026-12-02)
def test_a_kill_9_leftover_part_file_does_not_fail_the_next_import(clean_env, tmp_path):
    """A part file left by a killed importer (pid 1 in its container) must not make the next import fail
    with EEXIST; it is not this importer's file, so it is left alone (P5)."""
    src = make_export(tmp_path / "exp", {"jit/m/m.so": b"module"})
    probe = _result(_run(clean_env, tmp_path / "none", 1))  # where the JIT dir is
    jit = Path(probe["jit_dir"]) / "m"
    jit.mkdir(parents=True)
    leftover = jit / ".m.so.import-1"
    leftover.write_bytes(b"half")
    res = _result(_run(clean_env, src, 1 << 30, prefix=("unshare", "-pf", "--mount-proc")))
    assert res["pid"] == 1 and res.get("error") is None, res
    assert res["report"][0]["status"] == "installed"
    assert (jit / "m.so").read_bytes() == b"module" and leftover.read_bytes() == b"half"


@pytest.mark.slow  # over 4 s in the quick run (--durations, 2026-12-02)
def test_import_waits_for_flashinfers_module_lock(clean_env, tmp_path):
    """A server building the module holds FlashInfer's lock (jit/core.py: FLASHINFER_JIT_DIR/tmp/NAME.lock);
    the importer installs only after it is released."""
    src = make_export(tmp_path / "exp", {"jit/m/m.so": b"module"})
    probe = _result(_run(clean_env, tmp_path / "none", 1))
    jit = Path(probe["jit_dir"])
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, flashinfer_sm120\nfrom filelock import FileLock\nfrom flashinfer.jit import core\n"
        "spec_lock = core.get_tmpdir() / 'm.lock'\n"  # what JitSpec.lock_path is for a module named m
        "with FileLock(str(spec_lock), thread_local=False):\n"
        "    print(core.get_tmpdir(), flush=True)\n    sys.stdin.readline()\n")],
        env=clean_env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == str(jit / "tmp")
    importer = _run(clean_env, src, 1 << 30)
    told = ""  # the importer got as far as the lock, and no further: it says so (moddir.held), then waits
    while "m: waiting for another process building it" not in told:
        line = importer.stderr.readline()
        assert line, f"the importer never waited for the lock: {told[-2000:]}"
        told += line
    assert importer.poll() is None and not (jit / "m" / "m.so").exists()
    holder.communicate("\n", timeout=60)
    res = _result(importer)
    assert res["report"][0]["status"] == "installed" and (jit / "m" / "m.so").read_bytes() == b"module"


@pytest.mark.parametrize("form", ["directory", "archive"])
def test_a_refused_module_creates_nothing_in_the_jit_dir(tmp_path, form):
    """An export whose modules are all refused (no manifest entry: nothing of it is installed) creates nothing
    in the JIT dir: FlashInfer's per-module lock is taken only once the refusal is decided, so no
    ``cached_ops/tmp/<name>.lock`` is made for any of up to 10,000 names of the export's choosing
    (P4, check then create)."""
    from flashinfer_sm120.safety.fs.atomic import make_private
    from flashinfer_sm120.warmup import cache, cache_import, session

    names = ["evil_a", "evil_b"]
    src = make_export(tmp_path / "exp", {f"jit/{n}/x.so": b"E" for n in names}, name="evil_a")
    meta_path = src / TOP / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["modules"] = [{"name": n, "files": {f"jit/{n}/x.so": sha(b"E")}} for n in names]
    meta_path.write_text(json.dumps(meta))
    if form == "archive":
        src = as_archive(src, tmp_path / "exp.tar.gz")
    jit = tmp_path / "ws" / "cached_ops"
    sess = session.Session("0.7.4", "/usr/local/cuda", "13.0", ["12.0f"], jit, "")
    parsed = cache_import.check(str(src))
    with make_private("fi-sm120-test-") as tmp:
        root = cache_import.unpack(str(src), Path(tmp), parsed, cache.Limits())
        report = cache_import._install_from(root, parsed, jit, sess, False,
                                            cache.Limits(), str(src))
    assert [r["status"] for r in report] == ["refused", "refused"], report
    assert not (tmp_path / "ws").exists(), sorted(str(p) for p in (tmp_path / "ws").rglob("*"))


#: Imports, from an export argv[1] written here, one module per head dim in argv[2:] whose entries are
#: honest (this FlashInfer's generator and name) but which carry no file; prints the report and the
#: JIT dir's listing as one ``@@`` JSON line.
EMPTY_MODULES = r"""
import json, os, sys
from pathlib import Path
from flashinfer_sm120.warmup import cache, cache_import, replay, session
sess = session.prepare("12.0")
from flashinfer.jit import env as jit_env
bf, i32 = {"dtype": "bfloat16"}, {"dtype": "int32"}
gen = "flashinfer.jit.attention.modules:gen_batch_decode_module"
entries, mods = [], []
for hd in map(int, sys.argv[2:]):
    params = {"args": [bf, bf, bf, i32, hd, hd, 0, False, False], "kwargs": {}}
    name = replay.call(gen, params).name
    entries.append({"format": 1, "name": name, "flashinfer": sess.flashinfer, "targets": ["12.0f"],
                    "regenerable": True, "generator": gen, "params": params})
    mods.append({"name": name, "files": {}})
top = Path(sys.argv[1]) / "flashinfer-sm120-cache"
top.mkdir(parents=True)
(top / "meta.json").write_text(json.dumps({"format": 1, "fingerprint": sess.fingerprint(), "modules": mods,
                                            "manifest": entries}))
jit = Path(jit_env.FLASHINFER_JIT_DIR)
report = cache_import.install(sys.argv[1], cache_import.check(sys.argv[1]), sess)
print("@@" + json.dumps({"report": report, "jit": sorted(os.listdir(jit)) if jit.exists() else []}))
"""


def test_an_honest_entry_that_carries_no_library_is_refused_before_anything_is_made(clean_env, tmp_path):
    """An export whose modules carry no file (honest manifest entries, up to 10,000 of them) is refused before
    anything is made: it must not be 'installed' by making a module directory with FlashInfer's
    build.ninja in the JIT dir and running ninja twice per module, only to be reported stale (P4, P6)."""
    proc = subprocess.run([sys.executable, "-c", EMPTY_MODULES, str(tmp_path / "exp"), "64", "96"], env=clean_env,
                          capture_output=True, text=True, timeout=300)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("@@")]
    assert lines, proc.stderr[-3000:]
    res = json.loads(lines[-1][2:])
    assert [r["status"] for r in res["report"]] == ["refused", "refused"], res["report"]
    assert all("library" in r["why"] for r in res["report"])
    assert [n for n in res["jit"] if n != "tmp"] == [], res["jit"]


def test_a_module_that_fails_to_install_is_left_as_it_was_and_the_ones_before_are_reported(clean_env, tmp_path):
    """A disk that fills up while a module is being settled leaves that module as it was and reports the
    ones installed before it, not a failed import with ``modules: []`` while every file of the module stays
    installed (P5, P8)."""
    src = make_export(tmp_path / "exp", {"jit/a/a.so": b"first", "jit/b/b.so": b"second", "jit/b/b.o": b"obj"},
                      name=None)
    env = dict(clean_env)
    code = INSTALL.replace("cache_import._settle = lambda entry, sess: {}",
                           "import errno\n"
                           "calls = []\n"
                           "def _settle(entry, sess):  # the second module's settling finds the disk full\n"
                           "    calls.append(entry)\n"
                           "    if len(calls) == 2:\n"
                           "        raise OSError(errno.ENOSPC, 'No space left on device', '/jit/b/.ninja_deps')\n"
                           "    return {}\n"
                           "cache_import._settle = _settle")
    assert code != INSTALL
    proc = subprocess.run([sys.executable, "-c", code, str(src), str(1 << 30)], env=env, capture_output=True,
                          text=True, timeout=300)
    res = json.loads(next(ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith("@@"))[2:])
    assert [(r["module"], r["status"]) for r in res["report"]] == [("a", "installed"), ("b", "failed")], res
    failed = res["report"][1]
    assert failed["kind"] == "space" and failed["fix"] and "/jit/b/.ninja_deps" in failed["why"], failed
    jit = Path(res["jit_dir"])
    assert (jit / "a" / "a.so").read_bytes() == b"first"
    assert not (jit / "b").exists()  # nothing of b left behind



@pytest.mark.slow  # seconds: whole builds, servers or worker fleets in child processes
def test_export_then_import_on_a_fresh_machine_is_up_to_date(warmed):
    env, manifest, log, tmp = warmed
    out = tmp / "cache.tar.gz"
    proc = cli(["cache", "export", "--from", str(manifest), str(out)], env, fakegpu=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "exported 2 modules" in proc.stdout
    again = cli(["cache", "export", "--from", str(manifest), str(out)], env, fakegpu=True)
    assert again.returncode == 1 and "already exists" in again.stderr  # never overwritten

    shutil.rmtree(env["FLASHINFER_WORKSPACE_BASE"])  # a fresh machine with the same layout
    target = env
    proc = cli(["cache", "import", str(out), "--json"], target, fakegpu=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert {m["status"] for m in json.loads(proc.stdout)["modules"]} == {"installed"}
    assert "using the archive's targets sm_120f" in proc.stderr
    before = log.read_text()
    res, _ = run_py(LOAD_AGAIN, dict(target, FAKE_GPU_CAPS="12.0", FAKE_TORCH_CUDA="13.0"))
    assert "Ninja build failed" not in (res["err"] or "")
    assert log.read_text() == before  # FlashInfer's own ninja run compiled nothing

    proc = cli(["cache", "import", str(out)], target, fakegpu=True)
    assert proc.returncode == 0 and proc.stdout.count("already present") == 2, proc.stdout + proc.stderr

    so = next(Path(env["FLASHINFER_WORKSPACE_BASE"]).rglob("*silu*.so"))
    so.write_text("a different build\n")
    proc = cli(["cache", "import", str(out)], target, fakegpu=True)
    assert proc.returncode == 1 and "kept existing" in proc.stdout and "--force" in proc.stdout
    assert so.read_text() == "a different build\n"
    proc = cli(["cache", "import", str(out), "--force"], target, fakegpu=True)
    assert proc.returncode == 0 and "replaced" in proc.stdout and so.read_text() != "a different build\n"

    # another toolkit view (another cache dir) or other targets: refused, naming the mismatch and fix
    proc = cli(["cache", "import", str(out)], dict(target, FLASHINFER_SM120_CACHE_DIR=str(tmp / "other")), fakegpu=True)
    assert proc.returncode == 1 and "cuda_home" in proc.stderr and "FLASHINFER_SM120_CACHE_DIR" in proc.stderr
    proc = cli(["cache", "import", str(out)], dict(target, FLASHINFER_WORKSPACE_BASE=str(tmp / "ws2")), fakegpu=True)
    assert proc.returncode == 1 and "jit_dir" in proc.stderr and "FLASHINFER_WORKSPACE_BASE" in proc.stderr
    proc = cli(["cache", "import", str(out), "--arch", "12.1"], target, fakegpu=True)
    assert proc.returncode == 1 and "targets" in proc.stderr and "sm_120f" in proc.stderr


def test_unsafe_archives_are_refused(clean_env, tmp_path, real_nvcc13):
    # a meta.json of the right form: the member after it is what is refused
    meta = json.dumps({"format": 1, "fingerprint": {"flashinfer": "0.7.4", "targets": ["12.0f"], "cuda_version": "13.0",
                                                    "cuda_home": "/c", "jit_dir": "/j"}, "modules": []}).encode()

    cases = {
        "dotdot": [tar_member(f"{TOP}/meta.json", meta), tar_member(f"{TOP}/../../escaped")],
        "absolute": [tar_member(f"{TOP}/meta.json", meta), tar_member("/tmp/escaped-abs")],
        "symlink": [tar_member(f"{TOP}/meta.json", meta),
                    tar_member(f"{TOP}/jit/x/link", kind=tarfile.SYMTYPE, link="/etc/passwd")],
    }
    env = dict(clean_env, FAKE_GPU_CAPS="")
    for name, members in cases.items():
        path = tmp_path / f"{name}.tar"
        path.write_bytes(tar_bytes(members))
        proc = cli(["cache", "import", str(path)], env, fakegpu=True)
        assert proc.returncode == 1, (name, proc.stdout, proc.stderr)
        assert "refusing the whole archive" in proc.stderr, (name, proc.stderr)
    assert not (tmp_path / "escaped").exists() and not os.path.exists("/tmp/escaped-abs")
