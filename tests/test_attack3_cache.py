"""Third attack round, ``cache export``: what already lies beside the output.  Failed before its fix."""

from __future__ import annotations

import os

from conftest import needs_flashinfer
from test_warmup_cachepack import cli, warmed  # noqa: F401  (warmed: a fixture)

pytestmark = needs_flashinfer


def test_export_never_writes_through_or_over_what_lies_beside_its_output(warmed):
    """The archive was written to ``OUT.partial`` with a plain ``open()``: a file of that name was
    truncated and lost, a symlink of that name was followed (the archive written into its target),
    and ``OUT`` appearing meanwhile was replaced."""
    env, manifest, _log, tmp = warmed
    victim = tmp / "victim"
    victim.write_text("precious\n")
    out_link, out_file = tmp / "a.tar.gz", tmp / "b.tar.gz"
    os.symlink(victim, str(out_link) + ".partial")
    (tmp / "b.tar.gz.partial").write_text("mine\n")
    for out in (out_link, out_file):
        proc = cli(["cache", "export", "--from", str(manifest), str(out)], env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert out.is_file() and not out.is_symlink() and out.stat().st_size > 100
    assert victim.read_text() == "precious\n"
    assert os.path.islink(str(out_link) + ".partial")
    assert (tmp / "b.tar.gz.partial").read_text() == "mine\n"
