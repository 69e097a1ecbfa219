import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


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
