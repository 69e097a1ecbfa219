"""The docs site cannot drift from the code: it builds with ``mkdocs build --strict`` (broken links
and anchors fail), and its reference pages name exactly what the code has."""

import argparse
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
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
    from flashinfer_sm120.core.facts import releases

    page = _page("releases.md")
    rows = [line for line in page.splitlines() if line.startswith("| `>=")]
    assert len(rows) == len(releases.RELEASES)
    for (spec, row), line in zip(releases.RELEASES, rows):
        assert f"`{row['era']}`" in line and all(str(s) in line for s in spec)
    assert str(releases.TESTED_UP_TO) in page


def test_status_modes_page_lists_exactly_the_modes():
    from flashinfer_sm120.core.patch.state import Mode

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
    from flashinfer_sm120.core.facts import arch

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


def test_committed_generated_blocks_are_what_the_code_makes_now():
    """The reference pages read whole in the repository (they held only markers until the site
    was built); `python docs/gen_ref.py` rewrites a stale block."""
    pages = gen_ref.pages(DOCS)
    assert {p.relative_to(DOCS).as_posix() for p in pages} >= {
        "reference/api.md", "reference/cli.md", "reference/environment.md"}
    for page in pages:
        text = page.read_text()
        assert text.count("<!-- gen:") == text.count("<!-- /gen:"), f"{page}: a marker without its block"
        assert gen_ref.render(text) == text, f"{page.relative_to(ROOT)} is stale: run python docs/gen_ref.py"


def test_a_stale_block_is_rewritten_and_a_bare_marker_filled():
    fresh = gen_ref.render("a\n<!-- gen:targets -->\nb")
    assert "| Targets | Minimum nvcc |" in fresh and fresh.endswith("<!-- /gen:targets -->\nb")
    stale = fresh.replace("| Targets |", "| Old |")
    assert stale != fresh and gen_ref.render(stale) == fresh
    assert "gen:" not in gen_ref.on_page_markdown(fresh)


#: How docs/toolkit.md names each find step.
_FIND_STEP_WORDS = {"FLASHINFER_NVCC": "`FLASHINFER_NVCC`", "CUDA_HOME": "`CUDA_HOME`", "CUDA_PATH": "`CUDA_PATH`",
                    "pip": "pip wheels", "PATH": "`nvcc` on `PATH`", "/usr/local/cuda": "`/usr/local/cuda`",
                    "versioned": "`/usr/local/cuda-X.Y`", "conda": "`$CONDA_PREFIX`"}


def test_toolkit_page_lists_the_find_steps_in_the_code_s_order():
    from flashinfer_sm120.core.toolkit.sources import FIND_STEPS

    page = _page("toolkit.md")
    steps = page.split("## Where toolkits are looked for", 1)[1].split("Details that matter", 1)[0]
    where = [steps.find(_FIND_STEP_WORDS[label]) for label, _ in FIND_STEPS]
    assert -1 not in where and where == sorted(where), list(zip([label for label, _ in FIND_STEPS], where))


def test_contributing_map_names_existing_paths_and_every_package():
    page = (DOCS / "contributing.md").read_text()
    table = page.split("## Where things are", 1)[1]
    for row in re.findall(r"^\| (`src/.*?) \|", table, re.M):
        paths = re.findall(r"`([^`]+)`", row)
        base = ROOT / paths[0]
        for p in [base, *(base.parent / q for q in paths[1:])]:
            assert p.exists(), f"docs/contributing.md names {p.relative_to(ROOT)}, which does not exist"
    for pkg in sorted(d.name for d in SRC.iterdir() if (d / "__init__.py").exists()):
        assert f"`{pkg}/`" in table or f"/{pkg}/`" in table, f"docs/contributing.md does not place {pkg}/"


def test_every_test_the_safety_page_names_exists():
    """docs/safety.md names the tests that hold each promise of docs/threat-model.md: each must exist."""
    import ast
    import re

    text = (ROOT / "docs" / "safety.md").read_text()
    named = re.findall(r"`(tests/[\w/]+\.py)::(\w+)", text)
    assert len(named) >= 8
    missing = []
    for path, name in named:
        f = ROOT / path
        defs = {n.name for n in ast.walk(ast.parse(f.read_text())) if isinstance(n, ast.FunctionDef)} if f.exists() else set()
        if name not in defs:
            missing.append(f"{path}::{name}")
    assert missing == []
    for p in ("P1", "P2", "P3", "P4", "P5", "P6", "P7", "P8"):
        assert f"**{p}**" in text, p
