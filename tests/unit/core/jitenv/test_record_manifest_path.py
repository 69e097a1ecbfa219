"""Recording: ``FLASHINFER_SM120_RECORD`` never writes outside its manifest (P4, P5).

Opened with a plain ``O_CREAT | O_APPEND``, a symlink of
that name (planted in a shared directory) made every JIT module load append a JSON line to the file
it pointed at, say ``~/.bashrc``; a directory on the way that another user could replace did the same.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import subprocess
import sys
import time

import pytest

from flashinfer_sm120.errors import PlaceError

from helpers.probing import NOBODY, as_uid, lock_held_as, reachable_dir
from helpers.untrusted import give_away
from flashinfer_sm120.core.jitenv import record

ENTRY = {"format": 1, "name": "norm", "flashinfer": "0.7.4", "targets": ["12.0f"]}


def test_a_symlink_at_the_manifest_path_is_never_followed(tmp_path):
    victim = tmp_path / "bashrc"
    victim.write_text("precious\n")
    link = tmp_path / "m.jsonl"
    os.symlink(victim, link)
    with pytest.raises(OSError):
        record.append(str(link), ENTRY)
    assert victim.read_text() == "precious\n"


def test_a_manifest_in_a_directory_others_can_write_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # not sticky: anyone can replace m.jsonl with a link between check and open
    with pytest.raises(PlaceError) as info:
        record.append(str(shared / "m.jsonl"), ENTRY)
    assert "writable by other users" in str(info.value) and "FLASHINFER_SM120_RECORD" in str(info.value)
    # the directory and the fix, said once (P8)
    assert str(shared) in str(info.value) and str(info.value).count("Fix:") == 1
    assert not (shared / "m.jsonl").exists()


def test_a_manifest_another_user_owns_is_refused(tmp_path):
    m = tmp_path / "m.jsonl"
    m.write_text("")
    give_away(m)
    with pytest.raises(OSError, match="owned by uid 4321"):
        record.append(str(m), ENTRY)
    assert m.read_text() == ""


def test_a_manifest_of_your_own_is_appended_and_nothing_is_left_beside_it(tmp_path):
    """Workers serialised on ``m.jsonl.lock``, left beside the manifest (P4, P5): they lock the manifest itself."""
    m = tmp_path / "m.jsonl"
    record.append(str(m), ENTRY)
    record.append(str(m), ENTRY)
    assert len(m.read_text().splitlines()) == 2
    assert [p.name for p in tmp_path.iterdir()] == ["m.jsonl"]


def test_a_relative_record_path_records_nothing_and_names_the_absolute_one(tmp_path, monkeypatch, caplog):
    """``FLASHINFER_SM120_RECORD=rel.jsonl`` was written under each process's working directory, while a relative
    FLASHINFER_WORKSPACE_BASE is refused for that reason: the same rule, with the absolute path as the fix."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(record.ENV, "rel.jsonl")
    monkeypatch.delenv("FLASHINFER_SM120_DISABLE", raising=False)
    monkeypatch.setitem(record._state, "installed", False)
    with caplog.at_level("WARNING", logger="flashinfer_sm120"):
        record.install_if_enabled()
    assert record._state["installed"] is False
    assert "'rel.jsonl'" in caplog.text and f"{record.ENV}={tmp_path / 'rel.jsonl'}" in caplog.text, caplog.text
    record._record(type("Spec", (), {"name": "norm"})())
    assert list(tmp_path.iterdir()) == []


def test_a_record_path_that_is_a_link_fails_at_once_in_words(tmp_path):
    """FLASHINFER_SM120_RECORD=/proc/self/fd/1 is refused at once in words (P6, P8), not after a 10 s stall
    per build with ``Timeout('...1.lock')`` or an ``OSError(6, ...)``."""
    with pytest.raises(OSError) as err:
        record.append("/proc/self/fd/1", {"x": 1})
    assert "Timeout" not in repr(err.value)
    why = record._why(err.value, "/proc/self/fd/1")
    assert "/proc/self/fd/1 is a symbolic link" in why and "OSError" not in why, why


@pytest.mark.parametrize("kind", ["fifo", "directory", "symlink"])
def test_a_record_path_that_is_not_a_file_is_refused_before_its_lock_is_made(tmp_path, kind):
    """``FLASHINFER_SM120_RECORD=/dev/null`` made ``/dev/null.lock`` and then refused (P4: check, then create)."""
    path = tmp_path / "m.jsonl"
    {"fifo": lambda: os.mkfifo(path), "directory": path.mkdir,
     "symlink": lambda: path.symlink_to(tmp_path / "elsewhere")}[kind]()
    with pytest.raises(OSError) as err:
        record.append(str(path), ENTRY)
    said = f"is a symbolic link (to {tmp_path / 'elsewhere'})" if kind == "symlink" else "is not a regular file"
    assert f"{path} {said}" in str(err.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.jsonl"]


def test_a_record_path_in_a_missing_directory_names_the_directory(tmp_path):
    with pytest.raises(OSError) as err:
        record.append(str(tmp_path / "no" / "m.jsonl"), ENTRY)
    assert err.value.errno == errno.ENOENT and str(tmp_path / "no") in record._why(err.value, None), err.value


@pytest.mark.parametrize("under", ["x", "x/y"])
def test_a_file_in_the_way_of_the_record_path_is_named(tmp_path, under):
    """``FLASHINFER_SM120_RECORD=/dir/file.jsonl/x`` said "/dir/file.jsonl does not exist" (P8: ENOTDIR, the file)."""
    (tmp_path / "file.jsonl").write_text("")
    with pytest.raises(OSError) as err:
        record.append(str(tmp_path / "file.jsonl" / under), ENTRY)
    why = record._why(err.value, None)
    assert err.value.errno == errno.ENOTDIR and f"'{tmp_path / 'file.jsonl'}' is" in why, why
    assert f"{record.ENV} to a file" in why and "does not exist" not in why, why


def test_a_manifest_is_created_mode_600_whatever_the_umask(tmp_path):
    """Made with the umask (0644), any user could open the manifest and so hold its lock (P6)."""
    old = os.umask(0)
    try:
        record.append(str(tmp_path / "m.jsonl"), ENTRY)
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "m.jsonl").stat().st_mode) == 0o600


def test_a_lock_another_uid_holds_on_the_manifest_is_not_waited_for():
    """``flock -s m.jsonl sleep 60`` by another uid on a 0644 manifest made each module load of a root server wait
    10 s, blamed on "another recording process" (P6, P8): it fails at once, naming pid and uid, as the module lock."""
    with reachable_dir() as d:
        m = d / "m.jsonl"
        m.write_text("")
        m.chmod(0o644)  # an older manifest, or one made under another umask
        with lock_held_as(NOBODY, m) as holder:
            t0 = time.monotonic()
            with pytest.raises(PlaceError) as info:
                record.append(str(m), ENTRY)
            assert time.monotonic() - t0 < 3
        msg = str(info.value)
        assert f"pid {holder.pid}" in msg and f"uid {NOBODY}" in msg and msg.count("Fix:") == 1, msg
        assert f"chmod 600 {m}" in msg and m.read_text() == "", msg


def test_another_uid_cannot_open_a_new_manifest_to_lock_it():
    with reachable_dir() as d:
        record.append(str(d / "m.jsonl"), ENTRY)
        proc = as_uid(NOBODY, ["flock", "-n", "-s", str(d / "m.jsonl"), "true"], dict(os.environ), timeout=30)
    assert proc.returncode != 0, proc


APPEND_UNDER_A_LIMIT = """
import resource, sys
from flashinfer_sm120.core.jitenv import record
resource.setrlimit(resource.RLIMIT_FSIZE, (1024, resource.RLIM_INFINITY))
for i in range(20):
    try:
        record.append(sys.argv[1], dict(format=1, name=f"m{i}", flashinfer="0.7.4", targets=["12.0f"], why="x" * 200))
    except OSError as exc:
        sys.exit(record._why(exc, sys.argv[1]))
"""


def test_an_append_over_the_file_size_limit_leaves_no_half_line(tmp_path):
    """Under ``ulimit -f 1`` an append left half a line, and the next process's entry, glued to it, was lost to
    ``build --from`` (P5); the message names the limit and its fix (P8)."""
    m = tmp_path / "m.jsonl"
    proc = subprocess.run([sys.executable, "-c", APPEND_UNDER_A_LIMIT, str(m)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 1 and "ulimit -f: 1)" in proc.stderr and "`ulimit -f unlimited`" in proc.stderr, proc
    record.append(str(m), ENTRY)  # the next process, without the limit
    lines = m.read_text().splitlines()
    assert len(lines) >= 2 and [record.parse_entry(json.loads(x), "m")["name"] for x in lines][-1] == "norm", lines


def test_build_from_names_a_manifest_the_recorder_would_take(tmp_path, monkeypatch):
    """``build --from mf/big.jsonl`` told to record into the relative path, which the recorder refuses; for
    ``/proc/self/environ`` to record into it (P8: a fix that works)."""
    from flashinfer_sm120.warmup import replay

    monkeypatch.chdir(tmp_path)
    (tmp_path / "mf").mkdir()
    (tmp_path / "mf" / "big.jsonl").write_text("\n" * 5)
    monkeypatch.setattr(replay, "MAX_LINES", 3)
    for given, fix in (("mf/big.jsonl", f"{record.ENV}={tmp_path / 'mf' / 'big.jsonl'}"),
                       ("/proc/self/environ", f"{record.ENV} set to the absolute path of a file")):
        with pytest.raises(replay.BuildError) as info:
            replay.load(given)
        assert fix in str(info.value) + info.value.fix and f"{record.ENV}={given}" not in str(info.value), info.value


def test_a_failed_write_names_the_manifest_not_it():
    """A write that failed with no file in the error (ENOSPC) said "the disk holding 'it' is full" (P8)."""
    why = record._why(OSError(errno.ENOSPC, "No space left on device"), "/data/m.jsonl")
    assert "/data/m.jsonl" in why and "'it'" not in why, why
