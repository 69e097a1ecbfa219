"""The suite's guard against writing into the checkout (tests/conftest.py) sees what it must."""

import subprocess

from helpers.checkout import checkout_entries


def test_a_new_file_in_the_checkout_is_seen_the_tools_caches_are_not(tmp_path):
    """A FlashInfer JIT log once came into the repository from a run in the checkout."""
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text(".cache/\n.venv/\n")
    (tmp_path / "src" / "pkg").mkdir(parents=True)
    (tmp_path / "src" / "pkg" / "__init__.py").write_text("")
    subprocess.run(["git", "-C", str(tmp_path), "add", "."], check=True)
    subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "t"],
                   check=True)
    before = checkout_entries(tmp_path)
    assert before is not None
    for d in (".venv/lib", "src/pkg/__pycache__", "src/pkg.egg-info", ".pytest_cache", ".hypothesis"):
        (tmp_path / d).mkdir(parents=True)
        (tmp_path / d / "f").write_text("x")
    assert checkout_entries(tmp_path) == before
    log = tmp_path / ".cache" / "flashinfer" / "0.7.4" / "flashinfer_jit.log"
    log.parent.mkdir(parents=True)
    log.write_text("")
    (tmp_path / "stray.txt").write_text("x")
    assert checkout_entries(tmp_path) - before == {"!! .cache/", "?? stray.txt"}


def test_outside_a_git_checkout_there_is_nothing_to_compare(tmp_path):
    assert checkout_entries(tmp_path / "missing") is None
