"""Recording: ``FLASHINFER_SM120_RECORD`` never writes outside its manifest (P4, P5).

Opened with a plain ``O_CREAT | O_APPEND``, a symlink of
that name (planted in a shared directory) made every JIT module load append a JSON line to the file
it pointed at, say ``~/.bashrc``; a directory on the way that another user could replace did the same.
"""

from __future__ import annotations

import errno
import os

import pytest

from flashinfer_sm120.errors import PlaceError

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
    assert "/proc/self/fd/1 is not a regular file" in why and "OSError" not in why, why


@pytest.mark.parametrize("kind", ["fifo", "directory", "symlink"])
def test_a_record_path_that_is_not_a_file_is_refused_before_its_lock_is_made(tmp_path, kind):
    """``FLASHINFER_SM120_RECORD=/dev/null`` made ``/dev/null.lock`` and then refused (P4: check, then create)."""
    path = tmp_path / "m.jsonl"
    {"fifo": lambda: os.mkfifo(path), "directory": path.mkdir,
     "symlink": lambda: path.symlink_to(tmp_path / "elsewhere")}[kind]()
    with pytest.raises(OSError) as err:
        record.append(str(path), ENTRY)
    assert f"{path} is not a regular file" in str(err.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.jsonl"]


def test_a_record_path_in_a_missing_directory_names_the_directory(tmp_path):
    with pytest.raises(OSError) as err:
        record.append(str(tmp_path / "no" / "m.jsonl"), ENTRY)
    assert f"{tmp_path / 'no'} (the directory of FLASHINFER_SM120_RECORD" in str(err.value), err.value


def test_a_failed_write_names_the_manifest_not_it():
    """A write that failed with no file in the error (ENOSPC) said "the disk holding 'it' is full" (P8)."""
    why = record._why(OSError(errno.ENOSPC, "No space left on device"), "/data/m.jsonl")
    assert "/data/m.jsonl" in why and "'it'" not in why, why
