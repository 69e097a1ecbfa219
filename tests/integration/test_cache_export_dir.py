"""Fourth attack round, ``cache export`` into a directory: never into one another user controls.

Failed before its fix: an existing empty directory was accepted as the export's destination whoever
owned it, and its files were written with ``shutil.copy2``/``write_bytes``, which follow a link: the
owner of an empty ``/tmp/export`` could plant ``flashinfer-sm120-cache`` (or ``meta.json``) as a link
meanwhile and have the export write into, or over, one of your files.
"""

from __future__ import annotations

import os

import pytest

from helpers.untrusted import make_unsafe
from helpers.child import cli
from helpers.host import needs_flashinfer

pytestmark = needs_flashinfer


@pytest.mark.parametrize("how", ["world-writable", "another user's"])
def test_an_export_directory_another_user_controls_is_refused(warmed, how):
    env, manifest, _log, tmp = warmed
    out = tmp / "export"
    out.mkdir()
    make_unsafe(out, how)
    proc = cli(["cache", "export", "--from", str(manifest), str(out)], env, fakegpu=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "export directory" in proc.stderr and str(out) in proc.stderr
    assert os.listdir(out) == []


def test_an_export_to_a_new_directory_of_your_own_is_written(warmed):
    env, manifest, _log, tmp = warmed
    out = tmp / "mine"
    proc = cli(["cache", "export", "--from", str(manifest), str(out)], env, fakegpu=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    top = out / "flashinfer-sm120-cache"
    assert (top / "meta.json").is_file() and list((top / "jit").iterdir())
    proc = cli(["cache", "import", str(out), "--json"], env, fakegpu=True)  # reads back: everything up to date
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
