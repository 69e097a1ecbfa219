"""``flashinfer-sm120 cache prune`` (issue 15 item 4): a dry run changes nothing, held locks and
running processes keep what they hold, and nothing outside the two cache roots is touched,
symlinks or not.  Layouts are FlashInfer 0.7.4's (``<version>/<arch>[/<nvcc tag>]/cached_ops``,
``flashinfer/jit/env.py``) and real CUDA_HOME views built by the library."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.prune import hold, listing, prune, workspace

UID = os.geteuid()


def snapshot(*roots: Path) -> dict:
    """Every entry under ``roots``: kind, size, mtime and link target (links not followed)."""
    out = {}
    for root in roots:
        for dirpath, dirs, files in os.walk(root):
            for n in dirs + files:
                p = os.path.join(dirpath, n)
                st = os.lstat(p)
                out[p] = (stat.S_IFMT(st.st_mode), st.st_size, st.st_mtime_ns,
                          os.readlink(p) if stat.S_ISLNK(st.st_mode) else None)
    return out




def test_dry_run_lists_each_stale_entry_with_its_reason_and_changes_nothing(caches):
    c = caches
    before = snapshot(c["tmp"])
    proc = prune(c)
    assert proc.returncode == 0, proc.stderr
    assert snapshot(c["tmp"]) == before  # not a lock file created, not a byte changed
    out = proc.stdout
    assert "would free" in out and "--yes" in out
    got = listing(c)
    ws = c["ws"]
    reasons = {k: got[str(p)]["reason"] for k, p in ws.items()}
    assert reasons["current"] is None and reasons["unpatched current"] is None
    assert "toolkit is gone" in reasons["toolkit gone"]
    assert "toolkit changed" in reasons["toolkit changed"]
    assert "FlashInfer that built it is gone" in reasons["release gone"]
    assert "0.7.4 is no longer installed" in reasons["release replaced"] and "0.7.5" in reasons["release replaced"]
    assert got[c["keep_view"]]["reason"] is None
    assert "toolkit is gone" in got[c["gone_view"]]["reason"]
    assert all(e["bytes"] > 0 for e in got.values())
    assert "FlashInfer cache: " + str(c["fi_root"]) in out  # sizes of both caches
    assert snapshot(c["tmp"]) == before


def test_yes_removes_what_is_stale_and_nothing_else(caches):
    c = caches
    keep = [c["ws"]["current"], c["ws"]["unpatched current"] / "cached_ops", Path(c["keep_view"]), c["keep_tk"]]
    proc = prune(c, "--yes")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name in ("toolkit gone", "toolkit changed", "release gone", "release replaced"):
        assert not c["ws"][name].exists(), name
    assert not os.path.exists(c["gone_view"])
    for p in keep:
        assert p.exists(), p
    assert os.path.isfile(os.path.join(c["gone_tk"], "lib", "libcudart.so.13"))  # the view's links were not followed
    assert not (c["fi_root"] / "0.6.18").exists()  # emptied parents go too
    assert (c["fi_root"] / "0.7.4" / "120f").is_dir()  # ... but not the shared ones
    assert "freed" in proc.stdout and "removed" in proc.stdout
    again = listing(c)
    assert not [e for e in again.values() if e["reason"]]



def test_a_held_lock_keeps_the_directory(caches):
    c = caches
    stale = c["ws"]["toolkit changed"]
    module_lock = hold(str(stale / "cached_ops" / "tmp" / "sampling.lock"))  # FlashInfer's JitSpec.lock_path
    view_lock = hold(os.path.join(os.path.dirname(c["gone_view"]), ".lock"))  # view/build.py's lock
    try:
        dry = listing(c)
        assert "holds" in dry[str(stale)]["kept"] and "holds" in dry[c["gone_view"]]["kept"]
        proc = prune(c, "--yes")
        assert proc.returncode == 0, proc.stderr
        assert stale.is_dir() and os.path.isdir(c["gone_view"])
        assert not c["ws"]["toolkit gone"].exists()  # others still go
    finally:
        for p in (module_lock, view_lock):
            p.kill()
            p.wait()
    assert prune(c, "--yes").returncode == 0
    assert not stale.exists() and not os.path.exists(c["gone_view"])


def test_a_process_working_in_a_directory_keeps_it(caches):
    c = caches
    stale = c["ws"]["release gone"]
    p = subprocess.Popen([sys.executable, "-c", "import time; print('ok', flush=True); time.sleep(120)"],
                         cwd=stale / "cached_ops" / "sampling", stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ok"
        got = listing(c, "--yes")
        assert got[str(stale)]["kept"] == f"in use: process {p.pid} uses {stale / 'cached_ops' / 'sampling'}"
        assert stale.is_dir()
    finally:
        p.kill()
        p.wait()


def test_a_process_started_with_a_view_as_cuda_home_keeps_it_without_a_lease(caches):
    """A child that inherited CUDA_HOME=<view> but runs without flashinfer-sm120 (FLASHINFER_SM120_DISABLE=1,
    or no autoload) holds no lease; its builds still use the view, so prune keeps it (P3's second opinion)."""
    c = caches
    view = c["gone_view"]
    env = dict(os.environ, CUDA_HOME=view, FLASHINFER_SM120_DISABLE="1")
    p = subprocess.Popen([sys.executable, "-c", "import time; print('ok', flush=True); time.sleep(120)"],
                         env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ok"
        got = listing(c, "--yes")
        assert got[str(view)]["kept"].startswith(f"in use: process {p.pid} "), got[str(view)]
        assert os.path.isdir(view)
    finally:
        p.kill()
        p.wait()


def test_nothing_outside_the_roots_is_touched_even_through_symlinks(caches):
    c = caches
    outside = c["tmp"] / "outside"
    (outside / "dir").mkdir(parents=True)
    (outside / "file").write_text("precious")
    (outside / "dir" / "inner").write_text("precious too")
    # a workspace elsewhere that looks stale, reached only through a link in the root
    elsewhere = workspace(outside / "fi", "0.6.0/120f", "/nonexistent/cuda", outside / "nope" / "flashinfer")
    os.symlink(outside / "fi" / "0.6.0", c["fi_root"] / "0.6.1")
    # links inside a stale workspace, pointing out of it
    stale = c["ws"]["toolkit gone"]
    os.symlink(outside / "file", stale / "cached_ops" / "sampling" / "escape")
    os.symlink(outside / "dir", stale / "cached_ops" / "linked_dir")
    # a "view" that is a link to a directory outside, with metadata saying its toolkit is gone
    fake_view = outside / "viewlike"
    fake_view.mkdir()
    (fake_view / "flashinfer_sm120_view.json").write_text("{}")
    os.symlink(fake_view, Path(c["gone_view"]).parent / "cuda-13.0.1-linked")
    before = snapshot(outside)
    got = listing(c)
    assert str(c["fi_root"] / "0.6.1") not in got and str(elsewhere) not in got  # never followed
    assert "symlink" in got[str(Path(c["gone_view"]).parent / "cuda-13.0.1-linked")]["kept"]
    proc = prune(c, "--yes")
    assert proc.returncode == 0, proc.stderr
    assert not stale.exists()
    assert snapshot(outside) == before
    assert (outside / "file").read_text() == "precious" and os.path.islink(c["fi_root"] / "0.6.1")


def test_older_than_also_lists_what_was_not_used_for_that_long(caches):
    c = caches
    old = time.time() - 40 * 86400
    ws = c["ws"]["unpatched current"]
    for p in (ws / "cached_ops").rglob("*"):
        os.utime(p, (old, old))
    assert listing(c)[str(ws)]["reason"] is None
    assert listing(c, "--older-than", "50")[str(ws)]["reason"] is None
    got = listing(c, "--older-than", "30")
    assert got[str(ws)]["reason"].startswith("not used for 40 days")
    assert got[c["keep_view"]]["reason"] is None  # a kept workspace still builds with it
    assert prune(c, "--older-than", "30", "--yes").returncode == 0
    assert not (ws / "cached_ops").exists() and c["ws"]["current"].exists()  # the tagged one beside it stays


def test_json_says_why_a_current_entry_stays_and_a_view_ages_with_its_workspaces(caches):
    """P8: --json gives every kept entry its reason, as the text does; a view whose every workspace is older
    than --older-than goes with them (it stayed while a workspace that stays builds with it)."""
    c = caches
    now = listing(c)
    assert now[str(c["ws"]["unpatched current"])]["kept"].startswith("still usable")
    assert now[c["keep_view"]]["reason"] is None and now[c["keep_view"]]["kept"].startswith("still usable")
    got = listing(c, "--older-than", "0")
    assert all(e["reason"] and e["reason"].startswith("not used for 0 days") for p, e in got.items()
               if p in (c["keep_view"], str(c["ws"]["unpatched current"]))), got


def test_bad_older_than_is_refused_naming_the_flag(caches):
    proc = prune(caches, "--older-than", "-3")
    assert proc.returncode == 2 and "--older-than" in proc.stderr


@pytest.mark.skipif(UID != 0, reason="needs root to give a directory to another user")
def test_another_users_directory_is_listed_never_removed(caches):
    c = caches
    stale = c["ws"]["release replaced"]
    for p in [stale, *stale.rglob("*")]:
        os.lchown(p, 65534, 65534)
    got = listing(c, "--yes")
    assert got[str(stale)]["kept"] == "owned by uid 65534, not you" and stale.is_dir()


def test_doctor_section_shows_the_size_of_both_caches(caches):
    from flashinfer_sm120.diagnose import prune as pr

    section = pr.doctor_section({})
    paths = {r["what"]: r["path"] for r in section["roots"]}
    assert paths == {"flashinfer-sm120": str(caches["ours"]), "FlashInfer": str(caches["fi_root"])}
    assert section["stale"] == 5 and section["stale_bytes"] > 0
    from flashinfer_sm120.diagnose.verify.diagnosis import diagnose

    (note,) = [f for f in diagnose({"caches": section}).findings if f.code == "stale-caches"]
    assert note.text.startswith("5 stale cache entries hold ") and "cache prune" in note.fix


def test_a_lease_file_that_cannot_be_told_keeps_the_entry_and_says_so(caches):
    """A workspace whose lease file is a symlink (planted, or left by a tool) is kept, and listed as such with
    the fix (remove the link), never as "in use: a running process holds its lease" when no process does
    (P3 kept, P8 told, not guessed)."""
    from flashinfer_sm120.safety.fs import lease

    c = caches
    ws = c["ws"]["toolkit gone"]
    lf = lease.lease_path(str(ws))
    os.symlink(c["tmp"] / "elsewhere", lf)
    got = listing(c)[str(ws)]
    assert got["kept"] and "running process" not in got["kept"] and lf in got["kept"], got
    assert "symlink" in got["kept"] and "remove the link" in got["kept"]
    assert prune(c, "--yes").returncode == 0 and ws.is_dir()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory to another uid")
def test_an_entry_whose_lease_would_lie_in_another_uids_directory_is_never_removed(caches):
    """No process takes a lease inside another uid's directory (threat-model: P4), so a workspace of
    yours there (FlashInfer made it in a shared FLASHINFER_WORKSPACE_BASE whose levels they made) may
    be in use unseen: prune lists it and keeps it.  threat-model: P3"""
    c = caches
    ws = c["ws"]["toolkit gone"]
    os.chown(ws.parent, 65534, 65534)
    got = listing(c)[str(ws)]
    assert got["reason"] and "uid 65534" in (got["kept"] or ""), got
    assert prune(c, "--yes").returncode == 0 and ws.is_dir()


def test_a_root_reached_through_another_uids_link_in_a_shared_base_is_not_pruned(tmp_path, monkeypatch):
    """In a shared FLASHINFER_WORKSPACE_BASE (1777), another uid's link ``.cache/flashinfer`` into the
    victim's home is not followed: ``prune --yes`` removes no directory outside the tree (P2, P3)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to own a link as another uid")
    from flashinfer_sm120.diagnose.prune import find

    shared = tmp_path / "ws"
    (shared / ".cache").mkdir(parents=True)
    for d in (shared, shared / ".cache"):
        d.chmod(0o1777)
    mine = tmp_path / "mine"
    (mine / "0.7.4" / "120f" / "nvcc13.5.37-dead0001" / "cached_ops").mkdir(parents=True)
    link = shared / ".cache" / "flashinfer"
    link.symlink_to(mine)
    os.lchown(link, 4321, 4321)
    monkeypatch.setenv("FLASHINFER_WORKSPACE_BASE", str(shared))
    monkeypatch.setenv("SGLANG_CACHE_DIR", str(tmp_path / "no-sglang"))
    assert str(mine) not in find.fi_roots()
    os.lchown(link, 0, 0)  # the same link, root's: followed as before
    assert str(mine) in find.fi_roots()


def test_a_view_of_another_layout_is_named_so_not_damaged(caches):
    """A view an earlier flashinfer-sm120 wrote (layout 2: a shorter nvcc_fingerprint) is listed as
    another version's, not as "damaged": upgrading is not damage (docs/using.md, cache prune)."""
    import json

    from flashinfer_sm120.core.view.meta import META_NAME, STUB

    old = Path(caches["gone_view"]).parent / "cuda-13.0.88-0123456789ab"
    (old / STUB).parent.mkdir(parents=True)
    (old / STUB).write_bytes(b"\x7fELF" + b"\0" * 100)
    (old / META_NAME).write_text(json.dumps({"layout": 2, "toolkit": "/none", "nvcc": "/none/bin/nvcc",
                                             "nvcc_fingerprint": [1, 2, 3]}))
    reason = listing(caches)[str(old)]["reason"]
    assert "layout 2 of another flashinfer-sm120 version" in reason and "damaged" not in reason, reason


def test_only_directories_named_as_views_are_removed_from_the_views_directory(caches):
    """``cuda-home/`` may hold what someone else put there: only a name ``view/build.py`` gives a view
    (``cuda-<version>-<key>[.N]``) is ever a damaged view; anything else is listed as kept (P3, A2)."""
    parent = Path(caches["gone_view"]).parent
    mine = parent / "myfiles"
    mine.mkdir()
    (mine / "x").write_text("mine")
    damaged = parent / "cuda-13.0.88-0123456789ab.1"
    damaged.mkdir()
    (damaged / "junk").write_text("no meta")
    got = listing(caches, "--yes")
    assert "not named as a view" in got[str(mine)]["kept"], got[str(mine)]
    assert "damaged" in got[str(damaged)]["reason"]
    assert (mine / "x").read_text() == "mine" and not damaged.exists()


def test_what_prune_says_it_removed_is_gone_and_every_other_directory_is_listed(caches):
    """FlashInfer's import writes ``flashinfer_jit.log`` in its workspace: prune said it removed such a workspace,
    yet left it holding the log; and directories with no ``cached_ops`` (a refused build's ``0.7.4/122a``, an
    invalid arch list's ``12O``, a target-less ``0.7.4/nvcc...``) were never listed (P8)."""
    c, root = caches, caches["fi_root"]
    only_log = [root / "0.7.4" / n for n in ("122a", "12O", "nvcc13.0.88-a48c6f5a")]
    for d in only_log:
        d.mkdir(parents=True)
        (d / "flashinfer_jit.log").touch()
    (root / "0.7.4" / "121f").mkdir()  # empty
    theirs = root / "0.7.4" / "120a_120f"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("mine")
    got = listing(c)
    for d in [*only_log, root / "0.7.4" / "121f"]:
        assert got[str(d)]["reason"] and not got[str(d)]["kept"], d
    assert got[str(theirs)]["kept"] and got[str(theirs)]["reason"] is None
    before = snapshot(c["tmp"])
    proc = prune(c, "--yes")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    after = snapshot(c["tmp"])
    removed = [p for p, e in listing(c).items() if e.get("removed")]
    assert not removed  # nothing left to remove: what the first prune listed as removed is gone
    said = [line.split()[-1] for line in proc.stdout.splitlines() if line.strip().startswith("removed")]
    assert said and all(not os.path.lexists(p) for p in said), said
    assert not [p for p in set(after) - set(before)]  # prune's own process made nothing
    assert (theirs / "notes.txt").read_text() == "mine"
    assert not any(os.path.lexists(d) for d in only_log)
