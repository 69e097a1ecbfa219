"""``cache prune`` stays inside its own files (P3, P2/P4): never across a mount point, never into another
user's files, and it says what it removed when a signal stops it (P8); a removed entry leaves its name at once."""

from __future__ import annotations

import json
import os
import signal
import sys

import pytest

from helpers.child import cli
from helpers.prune import listing, prune as run_prune
from helpers.views import can_unshare


@pytest.mark.skipif(can_unshare() is not None, reason=str(can_unshare()))
@pytest.mark.parametrize("kind", ["tmpfs", "bind"])
def test_a_filesystem_mounted_inside_a_stale_directory_is_never_touched(caches, tmp_path, kind):
    c = caches
    stale = c["ws"]["release gone"]
    point, src = stale / "cached_ops" / "sampling" / "data", tmp_path / "elsewhere"
    point.mkdir()
    src.mkdir()
    mount = "mount -t tmpfs none \"$0\"" if kind == "tmpfs" else "mount --bind \"$1\" \"$0\""
    # the mount lives only in this private namespace: the precious file is written and looked at there
    script = (f'{mount} && echo precious > "$0/precious.txt" && head -c 4000000 /dev/urandom > "$0/big" && "$2" -m flashinfer_sm120 cache prune --yes --json; '
              'rc=$?; ls "$0"; exit $rc')
    proc = cli([], c["env"], 300, python=sys.executable,
               prefix=["unshare", "-m", "--propagation", "private", "sh", "-c", script, str(point), str(src),
                       sys.executable])
    doc = json.loads(proc.stdout[:proc.stdout.rindex("}") + 1])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "precious.txt" in proc.stdout[proc.stdout.rindex("}"):]  # still on the mounted filesystem
    got = {e["path"]: e for e in doc["entries"]}[str(stale)]
    assert got["reason"] and str(point) in got["kept"] and not got["removed"] and not got["error"]
    assert got["bytes"] < 1 << 20  # the mounted filesystem's 4 MB are not this entry's
    assert not c["ws"]["toolkit gone"].exists()  # the other stale entries still go


def test_a_directory_of_another_user_inside_a_stale_entry_keeps_it_and_names_the_owner(caches):
    if os.geteuid() != 0:
        pytest.skip("needs root to give a directory to another uid")
    c = caches
    stale = c["ws"]["release gone"]
    theirs = stale / "cached_ops" / "sampling" / "theirs"
    theirs.mkdir()
    (theirs / "f").write_text("x")
    os.chown(theirs, 65534, 65534)
    got = listing(c)[str(stale)]
    assert got["reason"] and "65534" in got["kept"] and str(theirs) in got["kept"]
    proc = run_prune(c, "--yes")
    assert proc.returncode == 0, proc.stderr
    assert (theirs / "f").exists() and (stale / "cached_ops" / "sampling" / "sampling.so").exists()


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_a_prune_stopped_by_sigterm_says_what_it_removed_and_what_it_left(caches, monkeypatch, capsys, fmt):
    from flashinfer_sm120 import cli as main_cli
    from flashinfer_sm120.diagnose import prune

    c = caches
    calls = []
    real = prune.remove_tree

    def remove_then_stop(path):
        calls.append(path)
        real(path)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGTERM)  # as 'kill' during the removal of the second entry

    monkeypatch.setattr(prune, "remove_tree", remove_then_stop)
    rc = main_cli.main(["cache", "prune", "--yes"] + (["--json"] if fmt == "json" else []))
    out = capsys.readouterr()
    assert rc == 128 + signal.SIGTERM
    stale = [str(p) for k, p in c["ws"].items() if "current" not in k] + [c["gone_view"]]
    gone = [p for p in stale if not os.path.exists(p)]
    assert len(gone) >= 1 and len(gone) < len(stale)
    if fmt == "json":
        doc = json.loads(out.out)
        assert doc["interrupted"] == "SIGTERM"
        entries = {e["path"]: e for e in doc["entries"]}
        assert {p for p in stale if entries[p]["removed"]} == set(gone)
        assert all(entries[p]["removed"] or entries[p]["reason"] for p in stale)
    else:
        for p in gone:
            assert "removed" in out.out and p in out.out
        assert "left" in out.out and "SIGTERM" in out.err


def test_an_entry_leaves_its_name_before_its_files_go_and_a_stopped_removal_is_finished_later(caches, monkeypatch):
    from flashinfer_sm120.diagnose import prune

    c = caches
    stale = c["ws"]["release gone"]
    seen, real = [], prune.remove_tree

    def stop(path):
        seen.append((path, stale.exists()))
        raise KeyboardInterrupt  # stopped before a byte went

    monkeypatch.setattr(prune, "remove_tree", stop)
    report = prune.scan()
    with pytest.raises(KeyboardInterrupt):
        prune.remove(report)
    assert seen and seen[0][0] != str(stale) and not seen[0][1]  # the real name was gone first
    assert os.path.isdir(seen[0][0])
    monkeypatch.setattr(prune, "remove_tree", real)
    hidden = {e.path: e for e in prune.scan()["entries"]}[seen[0][0]]
    assert hidden.reason and not hidden.kept  # the next prune lists what was left and removes it
    run_prune(c, "--yes")
    assert not os.path.exists(seen[0][0])


@pytest.mark.parametrize("ninja", ["none", "garbage", "fifo"])
def test_a_directory_whose_toolkit_cannot_be_read_is_kept_for_that_reason(caches, ninja):
    c = caches
    ws = c["fi_root"] / "0.7.4" / "120f" / "nvcc12.9.41-0badf00d"
    (ws / "cached_ops" / "tmp").mkdir(parents=True)
    if ninja != "none":
        (ws / "cached_ops" / "sampling").mkdir()
        f = ws / "cached_ops" / "sampling" / "build.ninja"
        if ninja == "fifo":
            os.mkfifo(f)
        else:
            f.write_bytes(b"\xff\x00garbage = = $\n")
    got = listing(c)[str(ws)]
    assert got["reason"] is None and "usable" not in got["kept"] and "toolkit" in got["kept"]
