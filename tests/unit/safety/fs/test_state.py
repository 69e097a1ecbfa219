"""On-disk state: the per-uid cache root and the nvcc memo (issue 5 items 5, 7, 8, 11)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from helpers import abandoned
from helpers.toolkits import make_toolkit
from flashinfer_sm120.safety.fs import atomic, statedir
from flashinfer_sm120.core.toolkit.probe import inspect
from flashinfer_sm120.core.toolkit import memo
from flashinfer_sm120.safety.ownership import fingerprint
from helpers.probing import OTHER_UID, PY, as_uid, need_root


@pytest.fixture(autouse=True)
def _fresh(monkeypatch, tmp_path):
    statedir.forget_cache_root(notes=True)
    for k in ("FLASHINFER_SM120_CACHE_DIR", "XDG_CACHE_HOME"):
        monkeypatch.delenv(k, raising=False)
    (tmp_path / "home").mkdir()  # a user with a home (one that does not exist is never created)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    yield
    statedir.forget_cache_root()


@pytest.mark.parametrize("name,char", [("my cache", " "), ("a$b", "$"), ("x:y", ":"), ("t\tab", "\t")])
def test_cache_path_ninja_cannot_carry_is_refused_and_named(tmp_path, monkeypatch, name, char):
    monkeypatch.setenv("FLASHINFER_SM120_CACHE_DIR", str(tmp_path / name))
    root = statedir.cache_root()
    assert char not in root and root == str(tmp_path / "home" / ".cache" / "flashinfer-sm120")
    (note,) = statedir.cache_root_notes()
    from flashinfer_sm120.safety.fs.statedir import PATH_RULE

    assert "FLASHINFER_SM120_CACHE_DIR" in note and repr(char) in note and PATH_RULE in note
    assert not (tmp_path / name).exists()


@pytest.mark.parametrize("var,value", [("FLASHINFER_SM120_CACHE_DIR", "relcache"), ("XDG_CACHE_HOME", "rel")])
def test_relative_cache_dir_is_refused(tmp_path, monkeypatch, var, value):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(var, value)
    root = statedir.cache_root()
    assert os.path.isabs(root)
    assert not (tmp_path / value).exists()
    assert any("relative path" in n and "absolute" in n for n in statedir.cache_root_notes())


def test_home_empty_does_not_use_filesystem_root(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", "")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    root = statedir.cache_root()
    assert not root.startswith("/.cache")


@pytest.mark.parametrize("mode,owner", [(0o777, None), (0o770, None), (0o700, OTHER_UID)])
def test_cache_dir_shared_or_foreign_is_refused(tmp_path, monkeypatch, mode, owner):
    if owner is not None:
        need_root()
    d = tmp_path / "shared"
    d.mkdir()
    os.chmod(d, mode)
    if owner is not None:
        os.chown(d, owner, owner)
    monkeypatch.setenv("FLASHINFER_SM120_CACHE_DIR", str(d))
    root = statedir.cache_root()
    assert root != str(d)
    (note,) = statedir.cache_root_notes()
    assert str(d) in note and ("writable by other users" in note or f"uid {owner}" in note)


def test_cache_dir_under_a_replaceable_parent_is_refused(tmp_path, monkeypatch):
    parent = tmp_path / "open"
    (parent / "mine").mkdir(parents=True)
    os.chmod(parent / "mine", 0o700)
    os.chmod(parent, 0o777)  # anyone could rename 'mine' away and put their own there
    monkeypatch.setenv("FLASHINFER_SM120_CACHE_DIR", str(parent / "mine"))
    assert statedir.cache_root() != str(parent / "mine")
    assert any("could replace it" in n and f"{parent} is writable by other users" in n
               for n in statedir.cache_root_notes())


def test_cache_dir_writable_by_the_users_private_group_is_refused(tmp_path, monkeypatch):
    """What we keep as ours is writable by no one else, group included (the strictest of the former
    checks: the view's), even a user-private group the trust rule accepts for programs."""
    from flashinfer_sm120.safety import ownership

    d = tmp_path / "mine"
    d.mkdir()
    os.chmod(d, 0o770)
    monkeypatch.setattr(ownership, "_private_gid", lambda uid: d.stat().st_gid)
    assert ownership.trust_reason(str(d)) is None  # the trust rule takes it
    monkeypatch.setenv("FLASHINFER_SM120_CACHE_DIR", str(d))
    assert statedir.cache_root() != str(d)
    assert any(str(d) in n and "writable by other users" in n for n in statedir.cache_root_notes())


def test_home_unset_without_passwd_entry_creates_no_tilde_dir(tmp_path):
    need_root()
    work = tmp_path / "work"
    work.mkdir()
    os.chmod(tmp_path, 0o755)
    os.chown(work, OTHER_UID, OTHER_UID)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": os.environ.get("PYTHONPATH", ""), "TMPDIR": "/tmp"}
    code = "from flashinfer_sm120.safety.fs import statedir; print('@@' + statedir.cache_root())"
    proc = as_uid(OTHER_UID, [PY, "-c", code], env, cwd=str(work))
    assert proc.returncode == 0, proc.stderr[-2000:]
    root = proc.stdout.strip().rsplit("@@", 1)[-1]
    assert root == f"/tmp/flashinfer-sm120-{OTHER_UID}"
    assert not (work / "~").exists()
    subprocess.run(["rm", "-rf", root])


# --------------------------------------------------------------------------- the memo


@pytest.fixture
def memo_dir(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("FLASHINFER_SM120_CACHE_DIR", str(d))
    return d


def _counting_toolkit(tmp_path, name="cuda-12.8"):
    count = tmp_path / f"{name}.runs"
    root = make_toolkit(tmp_path / name, nvcc_script=(
        f"#!/bin/sh\necho x >> {count}\necho 'Cuda compilation tools, release 12.8, V12.8.93'\n"))
    return root, count


def _runs(count):
    return len(count.read_text().splitlines()) if count.exists() else 0


def test_fifo_at_memo_path_does_not_hang(tmp_path, memo_dir):
    root, count = _counting_toolkit(tmp_path)
    memo_dir.mkdir(mode=0o700)
    os.mkfifo(memo_dir / "nvcc-version.json")
    done = {}
    t = threading.Thread(target=lambda: done.setdefault("tk", inspect(str(root))), daemon=True)
    t.start()
    t.join(20)
    assert not t.is_alive(), "a FIFO at the memo path hung inspect()"
    assert done["tk"].nvcc_full == "12.8.93"
    assert os.path.isfile(memo_dir / "nvcc-version.json")  # replaced by a regular file


def test_symlink_at_memo_path_or_old_temp_name_never_writes_through(tmp_path, memo_dir):
    root, _ = _counting_toolkit(tmp_path)
    memo_dir.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("precious")
    path = memo_dir / "nvcc-version.json"
    path.symlink_to(victim)
    os.symlink(victim, f"{path}.{os.getpid()}.tmp")  # the name the old code used
    assert inspect(str(root)).nvcc_full == "12.8.93"
    assert victim.read_text() == "precious"
    assert not path.is_symlink() and json.loads(path.read_text())["schema"] == memo.Memo.SCHEMA


def test_huge_memo_is_not_read(tmp_path, memo_dir, caplog, monkeypatch):
    """Reading 130 MB of JSON took 5-19 s: no more than the cap is read of it."""
    root, count = _counting_toolkit(tmp_path)
    memo_dir.mkdir(mode=0o700)
    huge = memo_dir / "nvcc-version.json"
    with open(huge, "wb") as fh:
        fh.truncate(130 << 20)  # 130 MB (sparse)
    data, why = atomic.read_json(str(huge), max_bytes=memo.MAX_MEMO_BYTES)
    assert data is None and "more than the" in why
    read, real_read, st = [], os.read, huge.stat()

    def counting_read(fd, n):
        data = real_read(fd, n)
        here = os.fstat(fd)
        if (here.st_dev, here.st_ino) == (st.st_dev, st.st_ino):
            read.append(len(data))
        return data

    with monkeypatch.context() as m, caplog.at_level(logging.INFO, logger="flashinfer_sm120"):
        m.setattr(os, "read", counting_read)
        tk = inspect(str(root))
    assert sum(read) <= memo.MAX_MEMO_BYTES + (1 << 16), sum(read)  # the cap, and at most one read past it
    assert tk.nvcc_full == "12.8.93"
    assert os.path.getsize(memo_dir / "nvcc-version.json") < memo.MAX_MEMO_BYTES
    assert "nvcc-version.json" in caplog.text


@pytest.mark.parametrize("bad", [
    "a string", [1, 2], {"stat": "x"}, {"stat": [1, 2, 3, 4, 5], "full": 123, "problem": None, "at": 1.0},
    {"stat": [1, 2, 3, 4, 5], "full": None, "problem": "hung", "at": "yesterday"},
])
def test_wrong_typed_entries_are_dropped_and_rewritten(tmp_path, memo_dir, caplog, bad):
    root, count = _counting_toolkit(tmp_path)
    memo_dir.mkdir(mode=0o700)
    nvcc = str(root / "bin" / "nvcc")
    (memo_dir / "nvcc-version.json").write_text(json.dumps({"schema": memo.Memo.SCHEMA, "entries": {nvcc: bad}}))
    with caplog.at_level(logging.INFO, logger="flashinfer_sm120"):
        tk = inspect(str(root))
    assert tk.nvcc_full == "12.8.93" and tk.problem is None
    assert str(memo_dir / "nvcc-version.json") in caplog.text
    entry = json.loads((memo_dir / "nvcc-version.json").read_text())["entries"][nvcc]
    assert entry["full"] == "12.8.93"
    assert inspect(str(root)).nvcc_full == "12.8.93" and _runs(count) == 1  # now remembered


@pytest.mark.parametrize("bad_file", ['"just a string"', "[1]", '{"entries": 5}', "{not json"])
def test_wrong_typed_memo_file_is_rewritten(tmp_path, memo_dir, bad_file):
    root, count = _counting_toolkit(tmp_path)
    memo_dir.mkdir(mode=0o700)
    (memo_dir / "nvcc-version.json").write_text(bad_file)
    assert inspect(str(root)).nvcc_full == "12.8.93"
    assert json.loads((memo_dir / "nvcc-version.json").read_text())["schema"] == memo.Memo.SCHEMA


def test_failure_entry_dated_in_the_future_expires(tmp_path, memo_dir):
    root = make_toolkit(tmp_path / "cuda-x", nvcc_script="#!/bin/sh\necho garbage\n")
    tk = inspect(str(root))
    assert "printed no 'release" in tk.problem
    path = memo_dir / "nvcc-version.json"
    data = json.loads(path.read_text())
    nvcc = str(root / "bin" / "nvcc")
    data["entries"][nvcc]["at"] = time.time() + 10 * 365 * 86400
    path.write_text(json.dumps(data))
    (root / "bin" / "nvcc").write_text("#!/bin/sh\necho garbage again\n")  # would be memo'd otherwise
    os.utime(root / "bin" / "nvcc", ns=(0, data["entries"][nvcc]["stat"][3]))
    assert memo.VERSIONS.lookup(nvcc, fingerprint(nvcc)) is None


def test_memo_size_is_capped(tmp_path, memo_dir):
    for i in range(memo.VERSIONS.cap + 5):
        memo.VERSIONS.store(f"/nowhere/{i}/nvcc", None, {"full": "12.8.93", "problem": None})
    entries = json.loads((memo_dir / "nvcc-version.json").read_text())["entries"]
    assert len(entries) == memo.VERSIONS.cap and "/nowhere/0/nvcc" not in entries


def test_concurrent_workers_probe_a_hung_nvcc_once(tmp_path, memo_dir):
    count = tmp_path / "runs"
    root = make_toolkit(tmp_path / "cuda-hang", nvcc_script=f"#!/bin/sh\necho x >> {count}\n/usr/bin/sleep 30\n")
    code = ("import sys, json; from flashinfer_sm120.core.toolkit.probe import inspect; "
            "tk = inspect(sys.argv[1], timeout=2.0); print('@@' + json.dumps(tk.problem))")
    env = dict(os.environ, FLASHINFER_SM120_CACHE_DIR=str(memo_dir))
    procs = [subprocess.Popen([sys.executable, "-c", code, str(root)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(6)]
    outs = [p.communicate(timeout=60) for p in procs]
    problems = [json.loads(o.rsplit("@@", 1)[-1]) for o, _ in outs]
    assert all(p and "did not answer" in p for p in problems), outs
    assert _runs(count) == 1, "every worker waited for the hung nvcc instead of one"


def test_stale_memo_temp_files_are_cleaned(tmp_path, memo_dir):
    memo_dir.mkdir(mode=0o700)
    old = memo_dir / ".tmp-nvcc-version.json.abc123"
    fresh = memo_dir / ".tmp-nvcc-version.json.def456"
    old.write_text("{")
    fresh.write_text("{")
    abandoned(old)
    memo.VERSIONS.store("/nowhere/nvcc", None, {"full": "12.8.93", "problem": None})
    assert not old.exists() and fresh.exists()  # a concurrent writer's file is left alone


def test_symlink_planted_by_another_uid_in_a_shared_cache_dir_is_never_written_through(tmp_path, monkeypatch):
    need_root()
    base = Path(tempfile.mkdtemp(prefix="sm120-cache-"))  # reachable by the other uid
    try:
        os.chmod(base, 0o755)
        shared = base / "shared"
        shared.mkdir()
        os.chmod(shared, 0o777)
        victim = tmp_path / "victim"
        victim.write_text("precious")
        for name in ("nvcc-version.json", f"nvcc-version.json.{os.getpid()}.tmp"):
            proc = as_uid(OTHER_UID, ["ln", "-s", str(victim), str(shared / name)], {"PATH": "/usr/bin:/bin"})
            assert proc.returncode == 0, proc.stderr
        monkeypatch.setenv("FLASHINFER_SM120_CACHE_DIR", str(shared))
        root, _ = _counting_toolkit(tmp_path)
        assert inspect(str(root)).nvcc_full == "12.8.93"
        assert victim.read_text() == "precious"
        assert statedir.cache_root() != str(shared)
        assert any(str(shared) in n and "writable by other users" in n for n in statedir.cache_root_notes())
    finally:
        shutil.rmtree(base, ignore_errors=True)
