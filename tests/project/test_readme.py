import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _setup_commands():
    text = (ROOT / "README.md").read_text()
    section = text.split("## Set-up", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.*?)\n```", section, re.S)


def test_readme_has_exactly_two_setup_commands():
    cmds = _setup_commands()
    assert len(cmds) == 2 and all("\n" not in c for c in cmds)
    assert "flashinfer-sm120 build" in cmds[0] and "pytest" in cmds[1]


def test_ci_runs_the_readme_test_command():
    # besides set-up lines, CI may install system packages real-component tests use (redis-server)
    ci_lines = [l for l in (ROOT / ".ci" / "run").read_text().splitlines()
                if l and not l.startswith("#") and not l.startswith(("set ", "cd ", "apt-get install -y -q "))]
    assert ci_lines == [_setup_commands()[1]]


README = (ROOT / "README.md").read_text()


def test_readme_is_a_short_guide():
    lines = README.splitlines()
    assert len(lines) <= 250, f"README has {len(lines)} lines; move detail into docs/"
    long = [i + 1 for i, line in enumerate(lines) if len(line) > 200]
    assert long == [], f"lines over 200 characters: {long}"


def test_readme_says_to_clone_and_cd_before_the_two_commands():
    before = README.split("## Set-up", 1)[0]
    assert "git clone " in before and "\ncd flashinfer-sm120" in before


def test_readme_states_the_footprint():
    section = README.split("## Requirements and footprint", 1)[1].split("\n## ", 1)[0]
    for what in ("GB virtual environment", "MB", "minutes", "test-wheels", "FLASHINFER_SM120_TEST_WHEELS"):
        assert what in section, what
    assert not re.search(r"\b[A-Z]+(?:_[A-Z]+)+_(?:MIN|MB)\b", README), "a measurement placeholder is left"


def test_readme_links_point_at_files_that_exist():
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README)
    local = [t for t in targets if not t.startswith(("http://", "https://"))]
    assert local, "the README links to the docs"
    missing = [t for t in local if not (ROOT / t).exists()]
    assert missing == []


def test_readme_lists_five_errors_with_their_fix():
    section = README.split("## The five errors people hit most", 1)[1].split("\n## ", 1)[0]
    entries = re.findall(r"^\*\*`[^`]+`\*\*", section, re.M)
    assert len(entries) == 5
    assert "pytest -q -m \"not slow\"" in README  # the contributors' quick run is said
