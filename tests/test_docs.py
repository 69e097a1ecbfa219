"""The docs site cannot drift from the code: it builds with ``mkdocs build --strict`` (broken links
and anchors fail), and its reference pages name exactly what the code has."""

import argparse
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
SRC = ROOT / "src" / "flashinfer_sm120"
sys.path.insert(0, str(DOCS))

import gen_ref  # noqa: E402

NAME = re.compile(r"FLASHINFER_SM120_[A-Z0-9_]*[A-Z0-9]")


def _page(rel: str) -> str:
    """A docs page as the site shows it (markers replaced by the generated tables)."""
    return gen_ref.render((DOCS / rel).read_text())


def _names_in_src() -> set[str]:
    return {n for f in SRC.rglob("*.py") for n in NAME.findall(f.read_text())}


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None,
                    reason="the docs extra is not installed (pip install -e '.[docs]')")
def test_mkdocs_build_strict_passes(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
                           "-d", str(tmp_path / "site")], capture_output=True, text=True, timeout=300,
                          cwd=ROOT, env={**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    env_page = (tmp_path / "site" / "reference" / "environment" / "index.html").read_text()
    assert "FLASHINFER_SM120_CACHE_DIR" in env_page and "gen:envvars" not in env_page
    assert not (tmp_path / "site" / "gen_ref.py").exists()  # the hook is not published as a page


def test_every_variable_in_src_is_in_the_reference_and_back():
    documented = set(NAME.findall(_page("reference/environment.md")))
    used = _names_in_src()
    assert used - documented == set(), f"undocumented: {sorted(used - documented)}"
    assert documented - used == set(), f"documented but not in src/: {sorted(documented - used)}"


def test_docs_and_readme_name_no_variable_the_code_does_not_have():
    used = _names_in_src()
    for page in [ROOT / "README.md", *DOCS.rglob("*.md")]:
        stale = set(NAME.findall(page.read_text())) - used
        assert not stale, f"{page.relative_to(ROOT)} names {sorted(stale)}, which src/ does not use"


def test_cli_reference_has_every_subcommand_and_option():
    from flashinfer_sm120.cli import build_parser

    page = _page("reference/cli.md")
    for path, sub, _ in gen_ref._subcommands(build_parser()):
        assert f"### `flashinfer-sm120 {' '.join(path)}`" in page
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):  # -h is on every subcommand
                continue
            for opt in action.option_strings:
                assert f"`{opt}`" in page, (path, opt)


def test_release_table_is_the_code_s():
    from flashinfer_sm120 import releases

    page = _page("releases.md")
    rows = [line for line in page.splitlines() if line.startswith("| `>=")]
    assert len(rows) == len(releases.RELEASES)
    for (spec, row), line in zip(releases.RELEASES, rows):
        assert f"`{row['era']}`" in line and all(str(s) in line for s in spec)
    assert str(releases.TESTED_UP_TO) in page


def test_status_modes_page_lists_exactly_the_modes():
    from flashinfer_sm120.patch.state import Mode

    page = (DOCS / "reference" / "status.md").read_text()
    listed = set(re.findall(r"^\| `([a-z]+)` \|", page, re.M))
    assert listed == {m.value for m in Mode}


def test_api_page_documents_the_public_api():
    import flashinfer_sm120

    page = _page("reference/api.md")
    for name in flashinfer_sm120.__all__:
        if name != "__version__":
            assert f"### `flashinfer_sm120.{name}(" in page, name


def test_targets_table_is_the_code_s():
    from flashinfer_sm120 import arch

    page = _page("toolkit.md")
    for target, version in arch.MIN_NVCC.items():
        line = next(line for line in page.splitlines() if f"`sm_{target}`" in line and line.startswith("| "))
        assert line.rstrip(" |").endswith(str(version)), (target, line)


def test_an_unknown_marker_fails_the_build():
    with pytest.raises(KeyError, match="nope"):
        gen_ref.render("<!-- gen:nope -->")


def test_every_docs_page_is_in_the_nav():
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    listed = set(re.findall(r":\s+([\w/.-]+\.md)\s*$", nav, re.M))
    assert pages == listed, (sorted(pages - listed), sorted(listed - pages))
