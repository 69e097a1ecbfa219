"""FLASHINFER_WORKSPACE_BASE as FlashInfer reads it at import: empty is unset, relative is warned about."""

from __future__ import annotations

import json
import os

import pytest

from helpers.child import run_code
from helpers.host import needs_flashinfer

_IMPORT = """
import json, os, sys
os.chdir(sys.argv[1])
import flashinfer_sm120, flashinfer
from flashinfer.jit import env
print("@@" + json.dumps({"ws": str(env.FLASHINFER_WORKSPACE_DIR), "base": os.environ.get("FLASHINFER_WORKSPACE_BASE")}))
"""


def _result(proc):
    line = [x for x in proc.stdout.splitlines() if x.startswith("@@")]
    assert line, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads(line[-1][2:])


@needs_flashinfer
def test_an_empty_workspace_base_writes_nothing_into_the_working_directory(tmp_path, clean_env):
    """An empty FLASHINFER_WORKSPACE_BASE= writes nothing into the working directory: FlashInfer's Path("")
    must not make it the base, with .cache/flashinfer and flashinfer_jit.log written into the checkout; the
    workspace is under HOME (P4)."""
    cwd, home = tmp_path / "cwd", tmp_path / "home"
    cwd.mkdir()
    home.mkdir()
    env = dict(clean_env, FLASHINFER_WORKSPACE_BASE="", HOME=str(home))
    proc = run_code(_IMPORT, env, args=(str(cwd),))
    out = _result(proc)
    assert sorted(p.name for p in cwd.iterdir()) == []
    assert out["ws"].startswith(str(home)), out
    assert out["base"] is None


@needs_flashinfer
def test_a_relative_workspace_base_is_warned_about(tmp_path, clean_env):
    cwd, home = tmp_path / "cwd", tmp_path / "home"
    cwd.mkdir()
    home.mkdir()
    env = dict(clean_env, FLASHINFER_WORKSPACE_BASE="rel-ws", HOME=str(home))
    proc = run_code(_IMPORT, env, args=(str(cwd),))
    _result(proc)
    assert "FLASHINFER_WORKSPACE_BASE='rel-ws' is a relative path" in proc.stderr
    assert "absolute path" in proc.stderr


@needs_flashinfer
def test_umask_000_leaves_no_level_of_flashinfers_workspace_open_to_others(tmp_path, clean_env):
    """Under ``umask 000`` a server's own ``import flashinfer`` made ``.cache/flashinfer/<version>/<arch>`` 0777
    (``jit/core.py``'s ``os.makedirs``), a tree others could write code into: every level is made 0755 first (P2, P4).
    Not 0700: a cache that root builds is read by other users' servers (and FlashInfer's lock files with it)."""
    cwd, home = tmp_path / "cwd", tmp_path / "home"
    cwd.mkdir()
    home.mkdir(mode=0o700)
    env = dict(clean_env, HOME=str(home), FLASHINFER_CUDA_ARCH_LIST="12.0f")
    del env["FLASHINFER_WORKSPACE_BASE"]
    proc = run_code("import os; os.umask(0)\n" + _IMPORT, env, args=(str(cwd),))
    ws = _result(proc)["ws"]
    assert ws.startswith(str(home / ".cache" / "flashinfer")), ws
    levels = [p for p in (home / ".cache" / "flashinfer").rglob("*") if p.is_dir()]
    assert str(ws) in map(str, levels), levels
    for level in [home / ".cache", home / ".cache" / "flashinfer", *levels]:  # readable, as FlashInfer makes them
        assert level.stat().st_mode & 0o777 == 0o755, (level, oct(level.stat().st_mode))


@needs_flashinfer
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory to another uid")
def test_a_server_import_with_another_users_home_creates_nothing_in_it(tmp_path, clean_env):
    """``sudo -E``: root's server with a user's HOME; FlashInfer's import made a root-owned ``~/.cache/flashinfer``
    (and its log) in that user's home, which their own tools then cannot write: it goes to a private directory, and
    the import still says why and the fix (P4, P8)."""
    cwd, theirs = tmp_path / "cwd", tmp_path / "theirs"
    cwd.mkdir()
    theirs.mkdir(mode=0o755)
    os.chmod(tmp_path, 0o755)
    os.chown(theirs, 65534, 65534)
    env = dict(clean_env, HOME=str(theirs), FLASHINFER_CUDA_ARCH_LIST="12.0f")
    del env["FLASHINFER_WORKSPACE_BASE"]
    proc = run_code(_IMPORT, env, args=(str(cwd),))
    assert not _result(proc)["ws"].startswith(str(theirs))
    assert list(theirs.iterdir()) == [], proc.stderr[-2000:]
    assert "sudo -H" in proc.stderr, proc.stderr[-2000:]


@pytest.mark.parametrize("value, fix", [("rel-ws", "$PWD/'rel-ws'"), ("~/ws", "$HOME/'ws'")])
def test_a_relative_workspace_base_gets_an_absolute_path_as_the_fix(monkeypatch, value, fix):
    """``~/ws`` (a tilde no shell expanded: systemd, .env files) got ``$PWD/'~/ws'``, a literal ``~`` directory."""
    from flashinfer_sm120.core.facts.workspace import normalize_base

    monkeypatch.setenv("FLASHINFER_WORKSPACE_BASE", value)
    assert f"export FLASHINFER_WORKSPACE_BASE={fix})" in normalize_base()


def test_workspace_path_reads_an_empty_base_as_the_home_directory(monkeypatch, tmp_path):
    from flashinfer_sm120.core.facts.workspace import workspace_path

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("FLASHINFER_WORKSPACE_BASE", "")
    assert workspace_path() == (str(tmp_path / ".cache" / "flashinfer"), "the home directory")


def test_every_reader_of_the_workspace_base_reads_it_one_way(monkeypatch, tmp_path):
    """One reader of FLASHINFER_WORKSPACE_BASE: a blank value is unset, the home is the given
    environment's, and the sccache base directories follow it (doctor's servers section took an empty
    value as the base itself)."""
    from flashinfer_sm120.core.facts.workspace import workspace_base
    from flashinfer_sm120.core.jitenv.launcher import basedirs

    ws = tmp_path / "ws"
    ws.mkdir()
    assert workspace_base({"FLASHINFER_WORKSPACE_BASE": " ", "HOME": str(tmp_path)}) == (str(tmp_path),
                                                                                        "the home directory")
    assert workspace_base({"FLASHINFER_WORKSPACE_BASE": str(ws)}) == (str(ws), "FLASHINFER_WORKSPACE_BASE")
    assert basedirs({"FLASHINFER_WORKSPACE_BASE": "", "HOME": str(ws)})[0] == os.path.realpath(ws)
    monkeypatch.delenv("HOME")
    monkeypatch.setattr("flashinfer_sm120.safety.fs.statedir.home_dir", lambda: None)
    assert workspace_base({})[0] == "/"  # never a relative '~'


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory to another uid")
def test_no_workspace_is_created_in_a_tree_another_uid_owns(tmp_path):
    """With ``FLASHINFER_WORKSPACE_BASE`` in a shared place where another uid made the
    ``.cache/flashinfer/<version>/<arch>`` levels (mode 777), the patch creates no workspace directory in that
    uid's tree (P4); the JIT-directory warning says why and the fix."""
    from flashinfer_sm120.core.patch import steps

    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(tmp_path, 0o755)
    theirs = shared / ".cache" / "flashinfer" / "0.7.4" / "120f"
    theirs.mkdir(parents=True)
    for p in (shared, *theirs.relative_to(shared).parents, theirs.relative_to(shared)):
        os.chown(shared / p, 65534, 65534)
        os.chmod(shared / p, 0o777)
    steps._make_workspace(str(theirs / "nvcc13.0.88-0123abcd"))
    assert os.listdir(theirs) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory to another uid")
def test_no_workspace_below_levels_flashinfer_made_inside_another_uids_tree(tmp_path):
    """FlashInfer's import makes the missing workspace levels first (owned by this user) inside the other
    uid's FLASHINFER_WORKSPACE_BASE, so the check looks at every level, not only the deepest (P4)."""
    from flashinfer_sm120.core.patch import steps

    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(tmp_path, 0o755)
    os.chown(shared, 65534, 65534)
    os.chmod(shared, 0o755)
    ours = shared / ".cache" / "flashinfer" / "0.7.4" / "120f"
    ours.mkdir(parents=True)  # as FlashInfer's import would, as this user, inside their tree
    steps._make_workspace(str(ours / "nvcc13.0.88-0123abcd"))
    assert os.listdir(ours) == []


def test_no_workspace_through_a_planted_link_level(tmp_path):
    """A level of the workspace path that another user could plant as a link (in a directory everyone may
    write) is not followed: no workspace is created where it points (P2, P4); in a place of its own it is."""
    from flashinfer_sm120.core.patch import steps

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    opened = tmp_path / "open"
    opened.mkdir()
    opened.chmod(0o777)
    (opened / "120f").symlink_to(elsewhere)
    steps._make_workspace(str(opened / "120f" / "nvcc13.0.88-0123abcd"))
    assert os.listdir(elsewhere) == []
    steps._make_workspace(str(elsewhere / "nvcc13.0.88-0123abcd"))
    assert os.listdir(elsewhere) == ["nvcc13.0.88-0123abcd"]
