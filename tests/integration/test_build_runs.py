"""``build`` run as users run it, with a fake compiler (``helpers.warm``)."""

from helpers import child


def test_an_up_to_date_build_says_so_once_per_module(warmed):
    """Nothing to build: each module is reported ``up to date`` once (the report, on stdout), and the
    plan of jobs and memory is not printed; 0.3.0 said it twice, with the plan's lines on stderr."""
    env, manifest, _, _ = warmed
    proc = child.cli(["build", "--from", str(manifest), "-j", "2"], env, fakegpu=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (proc.stdout + proc.stderr).count("up to date") == 2, (proc.stdout, proc.stderr)
    assert proc.stdout.count("up to date") == 2 and "jobs:" not in proc.stderr, proc.stderr
