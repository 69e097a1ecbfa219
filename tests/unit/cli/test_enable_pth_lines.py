"""The ``.pth``: lines someone added to it are never lost (P5).

``disable`` does not delete ``flashinfer_sm120_autoload.pth`` whole, nor ``enable`` overwrite it:
either would lose lines a user (or another tool) had added to it.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from flashinfer_sm120.core import autoload_hook as autoload
from flashinfer_sm120.diagnose.autoload import hook_source, pth_files
from flashinfer_sm120.cli import main


def test_lines_added_to_the_pth_survive_enable_and_disable(site_packages, capsys):
    pth = site_packages / autoload.PTH_NAME
    assert main(["enable", "--site-dir", str(site_packages)]) == 0
    with open(pth, "a") as fh:
        fh.write("import os\n")
    assert main(["enable", "--site-dir", str(site_packages)]) == 0  # enable again keeps it
    assert pth.read_text() == autoload.PTH_LINE + "import os\n"
    assert main(["disable", "--site-dir", str(site_packages)]) == 0  # disable drops only our line
    assert pth.read_text() == "import os\n"
    assert not (site_packages / autoload.HOOK_FILE).exists()
    assert main(["disable", "--site-dir", str(site_packages)]) == 0  # nothing of ours left: untouched
    assert pth.read_text() == "import os\n"
    capsys.readouterr()


def test_a_pth_of_ours_alone_is_removed(site_packages):
    assert main(["enable", "--site-dir", str(site_packages)]) == 0
    assert (site_packages / "__pycache__").is_dir()  # enable compiled the hook, as pip does
    assert main(["disable", "--site-dir", str(site_packages)]) == 0
    assert not (site_packages / autoload.PTH_NAME).exists()
    assert os.listdir(site_packages) == []  # its __pycache__ too (no /etc/__pycache__ left behind)


def test_files_of_our_names_whose_content_is_not_ours_are_never_removed_or_overwritten(site_packages, capsys):
    """``disable`` removes neither a ``flashinfer_sm120_autoload.py`` of your own nor a .pth over 64 KiB
    of your own lines (P5)."""
    hook, pth = site_packages / autoload.HOOK_FILE, site_packages / autoload.PTH_NAME
    mine = "# my own module of that name\nVALUE = 1\n"
    big = "".join(f"import os  # line {i}\n" for i in range(4000)).encode()  # 88 KiB, all lines yours
    huge = b"#" * (300 << 10) + b"\n"  # past what is read to tell
    blob = b"\xff\xfe not text"
    for hook_text, pth_bytes in ((mine, None), (None, big), (None, huge), (None, blob), (mine, big)):
        for p in (hook, pth):
            p.unlink(missing_ok=True)
        if hook_text is not None:
            hook.write_text(hook_text)
        if pth_bytes is not None:
            pth.write_bytes(pth_bytes)
        assert main(["disable", "--site-dir", str(site_packages)]) == 0
        out = capsys.readouterr().out
        assert "kept " in out and "not written by 'flashinfer-sm120 enable'" in out, out
        assert hook_text is None or hook.read_text() == hook_text
        assert pth_bytes is None or pth.read_bytes() == pth_bytes
        code = main(["enable", "--site-dir", str(site_packages)])
        err = capsys.readouterr().err
        if hook_text is None and pth_bytes == big:  # your lines are kept after ours, and given back whole
            assert code == 0 and pth.read_bytes() == autoload.PTH_LINE.encode() + big
            assert main(["disable", "--site-dir", str(site_packages)]) == 0 and pth.read_bytes() == big
            capsys.readouterr()
            continue
        assert code != 0 and "Fix: move it away" in err, err  # nor overwritten by enable
        assert hook_text is None or hook.read_text() == hook_text
        assert pth_bytes is None or pth.read_bytes() == pth_bytes


def _hook_texts_in_history() -> list[str]:
    """Every text the hook module had in git history (each is what some version of enable wrote)."""
    root = Path(__file__).resolve().parents[3]
    paths = ["src/flashinfer_sm120/core/autoload_hook.py", "src/flashinfer_sm120/autoload_hook.py"]
    try:
        commits = subprocess.run(["git", "-C", str(root), "log", "--format=%H", "--", *paths], capture_output=True,
                                 text=True, timeout=60, check=True).stdout.split()
    except (OSError, subprocess.SubprocessError):
        commits = []
    texts = set()
    for c in commits:
        for p in paths:
            r = subprocess.run(["git", "-C", str(root), "show", f"{c}:{p}"], capture_output=True, text=True, timeout=60)
            if r.returncode == 0:
                texts.add(r.stdout)
    if len(texts) < 2:
        pytest.skip("no git history of the hook module here (a shallow clone or an sdist)")
    return sorted(texts)


def test_a_hook_any_earlier_version_wrote_is_still_removed(site_packages, capsys):
    hook = site_packages / autoload.HOOK_FILE
    for text in _hook_texts_in_history():
        hook.write_text(text)
        assert main(["disable", "--site-dir", str(site_packages)]) == 0
        assert not hook.exists(), text[:200]
    capsys.readouterr()


def test_an_edited_hook_is_kept_by_disable_and_replaced_by_enable_only_with_force(site_packages, capsys):
    """A file starting with our first line is not ours by that alone: ``enable`` does not overwrite an
    edited hook module without ``--force``, ``disable`` does not remove it (P5)."""
    hook = site_packages / autoload.HOOK_FILE
    assert main(["enable", "--site-dir", str(site_packages)]) == 0
    edited = hook.read_text() + "print('my local tweak')\n"
    hook.write_text(edited)
    assert main(["disable", "--site-dir", str(site_packages)]) == 0
    assert hook.read_text() == edited and "its content is not ours" in capsys.readouterr().out
    assert main(["enable", "--site-dir", str(site_packages)]) != 0
    assert hook.read_text() == edited and "--force" in capsys.readouterr().err
    assert main(["enable", "--force", "--site-dir", str(site_packages)]) == 0
    assert hook.read_text() == hook_source()
    capsys.readouterr()


def test_enable_user_as_root_with_a_users_home_creates_nothing_there(tmp_path, monkeypatch, capsys):
    """``sudo -E flashinfer-sm120 enable --user`` makes no root-owned ``~/.local/lib/python3.X/site-packages``
    chain in the user's home, which their own ``disable`` could not then change (P4)."""
    import site

    import pytest

    if os.geteuid() != 0:
        pytest.skip("needs root to act with another user's home")
    home = tmp_path / "home"
    home.mkdir()
    os.chown(home, 4321, 4321)
    monkeypatch.setenv("HOME", str(home))  # sudo -E: run as the user whose home it is (sudo -u) is a fix
    user_site = home / ".local" / "lib" / "python3" / "site-packages"
    monkeypatch.setattr(site, "getusersitepackages", lambda: str(user_site))
    monkeypatch.setattr(site, "ENABLE_USER_SITE", True)
    monkeypatch.setattr("flashinfer_sm120.cli.enable.user_site_problem", lambda: None)
    assert main(["enable", "--user"]) != 0
    err = capsys.readouterr().err
    assert "owned by uid 4321" in err and "sudo -u" in err, err
    assert os.listdir(home) == []


def test_disable_as_root_keeps_another_uids_copies_of_our_files(tmp_path, capsys):
    """``disable --site-dir`` on a sticky shared directory keeps exact copies of our files that another uid
    put there, although root may remove anything in it (P5)."""
    if os.geteuid() != 0:
        import pytest

        pytest.skip("needs root to own files as another uid")
    shared = tmp_path / "site-packages"
    shared.mkdir()
    shared.chmod(0o1777)
    for name, text in pth_files().items():  # exact copies of what enable writes, theirs
        (shared / name).write_text(text)
        os.chown(shared / name, 4321, 4321)
    capsys.readouterr()
    assert main(["disable", "--site-dir", str(shared)]) == 0
    out = capsys.readouterr().out
    assert (shared / autoload.PTH_NAME).exists() and (shared / autoload.HOOK_FILE).exists()
    assert "owned by uid 4321" in out, out
