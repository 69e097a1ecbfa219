"""Where ``enable`` writes, and what it reads there (threat-model P4, P6)."""

from __future__ import annotations

import builtins
import os

import pytest

from helpers.untrusted import make_unsafe

from flashinfer_sm120.cli import enable, main


@pytest.mark.parametrize("how", ["world-writable", "another user's"])
def test_enable_refuses_a_site_directory_another_user_controls(tmp_path, how, capsys):
    """As root, ``enable --site-dir`` wrote root's .pth and module into a directory uid 65534 owned, who
    could then swap the module every Python reading that site directory imports."""
    site = tmp_path / "site-packages"
    site.mkdir()
    make_unsafe(site, how)
    assert main(["enable", "--site-dir", str(site)]) == 1  # a refusal, not bad usage
    err = capsys.readouterr().err
    assert f"the site directory {site} is not safe to write into" in err and "Fix: enable in a site directory" in err
    assert list(site.iterdir()) == []


def test_a_huge_file_in_place_of_ours_is_not_read_to_compare_it(tmp_path, monkeypatch):
    """A 10 GB sparse .pth was read whole (21 GB of memory) to see whether it already held our text."""
    big = tmp_path / "flashinfer_sm120_autoload.pth"
    with open(big, "wb") as fh:
        fh.truncate(1 << 30)
    os.chmod(big, 0o644)
    opened = []
    real_open = builtins.open
    monkeypatch.setattr(builtins, "open", lambda *a, **k: opened.append(a[0]) or real_open(*a, **k))
    assert enable.holds(str(big), "import flashinfer_sm120_autoload\n") is False
    assert opened == []


def test_enables_undo_is_one_command_that_removes_both_files(site_packages, capsys):
    """The undo said 'or delete that file', naming one of the two files enable wrote."""
    import shlex

    assert main(["enable", "--site-dir", str(site_packages)]) == 0
    out = capsys.readouterr().out
    undo = f"flashinfer-sm120 disable --site-dir {shlex.quote(str(site_packages))}"
    assert f"Undo: '{undo}' removes both files;" in out and "delete that file" not in out
    assert main(shlex.split(undo)[1:]) == 0
    assert not [p for p in site_packages.iterdir() if p.name != "__pycache__"]


@pytest.mark.parametrize("cmd", ["enable", "disable"])
@pytest.mark.parametrize("where", ["typo", "elsewhere", "empty"])
def test_site_dir_that_python_never_reads_is_bad_usage_for_both_commands(site_packages, tmp_path, cmd, where, capsys,
                                                                         monkeypatch):
    """``disable --site-dir .venv/lib/python3.11/site-package`` (a typo) said 'nothing to remove', exit 0, while
    ``enable`` refused the same path with exit 2: one check of ``--site-dir`` for both.  An empty one (an unset
    variable) is not the current directory, even a site directory."""
    monkeypatch.chdir(site_packages)
    bad = {"typo": str(site_packages)[:-1], "elsewhere": str(tmp_path), "empty": ""}[where]
    assert main([cmd, "--site-dir", bad]) == 2
    err = capsys.readouterr().err
    assert repr(bad) in err and "Fix: give one of those, or leave --site-dir out" in err
