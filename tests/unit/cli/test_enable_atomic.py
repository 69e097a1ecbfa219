"""``enable``/``disable`` killed between writing and renaming (P5).

An ``enable`` killed with ``kill -9`` (or by the OOM killer) after writing its temporary file
must not leave it in site-packages for good: a later ``enable`` or ``disable`` removes it.
Its temporary files are the atomic writer's, swept by the one rule of
:func:`flashinfer_sm120.safety.fs.atomic.sweep`.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from helpers import abandoned
from helpers.untrusted import give_away
from flashinfer_sm120.cli import main
from flashinfer_sm120.core.autoload_hook import PTH_NAME
from flashinfer_sm120.safety.fs.atomic import temp_prefix

KILLED = ("import os, sys\n"
          "os.replace = lambda *a, **k: os.kill(os.getpid(), 9)  # killed between write and rename\n"
          "from flashinfer_sm120.cli import main\n"
          "main(['enable', '--site-dir', sys.argv[1]])\n")


def _tmps(d) -> list[str]:
    return sorted(n for n in os.listdir(d) if n.startswith(".tmp-"))


@pytest.mark.parametrize("then", ["enable", "disable"])
def test_a_killed_enable_leaves_no_temporary_file_for_good(site_packages, then):
    proc = subprocess.run([sys.executable, "-c", KILLED, str(site_packages)], capture_output=True, timeout=300)
    assert proc.returncode == -9, proc.stderr[-2000:]
    assert len(_tmps(site_packages)) == 1  # what the killed one left
    abandoned(*(site_packages / n for n in _tmps(site_packages)))  # past the grace a live writer has
    assert main([then, "--site-dir", str(site_packages)]) == 0
    assert _tmps(site_packages) == []


def test_another_users_file_of_that_name_is_kept(site_packages):
    prefix = temp_prefix(str(site_packages / PTH_NAME))
    other = site_packages / (prefix + "planted")
    other.write_text("not ours")
    give_away(other, 65534)
    link = site_packages / (prefix + "link")
    link.symlink_to(site_packages / "target")
    abandoned(other, link)
    assert main(["enable", "--site-dir", str(site_packages)]) == 0
    assert other.read_text() == "not ours" and link.is_symlink()
