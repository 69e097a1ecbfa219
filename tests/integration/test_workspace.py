"""What is said (and done) after FlashInfer's import failed for its workspace (P4, P8).

``workspace_problem`` finds out by checking, not by ``os.makedirs``: with no home directory
(``HOME`` unset and a uid without a passwd entry: a container run with ``--user 12345``) ``~``
stays ``~``, so ``import flashinfer`` would make ``./~/.cache/flashinfer`` in the working directory;
the message gives the fix, not "please report" (FlashInfer 0.7.4 reads ``Path.home()`` even when
``FLASHINFER_WORKSPACE_BASE`` is set: the fix is ``HOME``).
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys

import pytest

from flashinfer_sm120.core.facts import refusals
from helpers.host import needs_flashinfer


def _tree(root) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, n), root) for d, ds, fs in os.walk(root) for n in ds + fs)


def test_no_home_is_named_and_nothing_is_created(monkeypatch, tmp_path):
    monkeypatch.delenv("HOME", raising=False)
    monkeypatch.delenv("FLASHINFER_WORKSPACE_BASE", raising=False)
    monkeypatch.setattr(pwd, "getpwuid", lambda uid: (_ for _ in ()).throw(KeyError(uid)))
    monkeypatch.chdir(tmp_path)
    msg = refusals.workspace_problem()
    assert msg and "Fix: HOME=" in msg and "no passwd entry" in msg, msg
    assert _tree(tmp_path) == []


def test_the_workspace_is_checked_not_made(monkeypatch, tmp_path):
    monkeypatch.setenv("FLASHINFER_WORKSPACE_BASE", str(tmp_path / "a" / "b"))
    assert refusals.workspace_problem() is None and _tree(tmp_path) == []  # creatable: no problem, nothing made
    (tmp_path / "file").write_text("x")
    monkeypatch.setenv("FLASHINFER_WORKSPACE_BASE", str(tmp_path / "file" / "sub"))
    msg = refusals.workspace_problem()
    assert msg and "not a directory" in msg.lower() and "FLASHINFER_WORKSPACE_BASE=" in msg, msg
    assert _tree(tmp_path) == ["file"]


def test_a_workspace_on_a_file_system_out_of_inodes_says_so(monkeypatch, tmp_path):
    """FlashInfer's import failing with ENOSPC on a disk with blocks but no inodes: the autoload said "please
    report"; it names the place and "out of inodes" (P8)."""
    real = os.statvfs(tmp_path)
    fake = os.statvfs_result((*real[:5], 1000, 0, 0, *real[8:]))  # f_files 1000, f_ffree and f_favail 0
    monkeypatch.setattr(os, "statvfs", lambda p: fake)
    monkeypatch.setenv("FLASHINFER_WORKSPACE_BASE", str(tmp_path / "ws"))
    msg = refusals.workspace_problem()
    assert msg and "inodes" in msg and str(tmp_path) in msg and "FLASHINFER_WORKSPACE_BASE=" in msg, msg


@needs_flashinfer
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run as a uid without a passwd entry")
def test_import_as_a_uid_without_home_makes_no_tilde_directory(request):
    uid = 54321
    while True:
        try:
            pwd.getpwuid(uid)
            uid += 1
        except KeyError:
            break
    import tempfile
    from pathlib import Path

    top = Path(tempfile.mkdtemp(prefix="a5-nohome-", dir="/tmp"))  # pytest's tmp is 0700: not reachable by uid
    request.addfinalizer(lambda: shutil.rmtree(top, ignore_errors=True))
    os.chmod(top, 0o755)
    cwd = top / "cwd"
    cwd.mkdir()
    os.chown(cwd, uid, uid)
    env = {k: v for k, v in os.environ.items() if k not in ("HOME", "FLASHINFER_WORKSPACE_BASE")}
    env.update(FLASHINFER_SM120_CACHE_DIR=str(cwd / "cache"), PYTHONPATH=os.pathsep.join(sys.path))
    code = ("import pathlib, flashinfer_sm120\ntry:\n    import flashinfer\nexcept RuntimeError:\n    pass\n"
            "import os\nprint(os.path.expanduser('~'))\nflashinfer_sm120.status()\n")
    proc = subprocess.run(["setpriv", "--reuid", str(uid), "--regid", str(uid), "--clear-groups",
                           sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.stdout.strip() == "~", (proc.returncode, proc.stdout, proc.stderr[-3000:])  # no home
    assert "Fix: HOME=" in proc.stderr and "Please report" not in proc.stderr, proc.stderr[-3000:]
    assert not (cwd / "~").exists()
    assert "not using $FLASHINFER_SM120_CACHE_DIR" not in proc.stderr  # it used the cache given, no /tmp fallback


@needs_flashinfer
def test_a_home_where_nothing_can_be_made_is_named_with_its_fix(clean_env):
    """With ``HOME=/proc`` the JSON error names the home and its fix, not only ``FileNotFoundError(2, 'No such
    file or directory')``: the repr of an OSError drops its path, and root "may write" /proc by ``access()`` (P8)."""
    from helpers.child import cli

    env = {k: v for k, v in clean_env.items() if k != "FLASHINFER_WORKSPACE_BASE"}
    proc = cli(["status", "--json"], dict(env, HOME="/proc"))
    doc = json.loads(proc.stdout)
    assert doc["ok"] is False and "'/proc/.cache'" in doc["error"], doc
    assert "Fix: FLASHINFER_WORKSPACE_BASE=" in doc["error"], doc
