"""Fourth attack round, the ``.pth``: lines someone added to it are never lost.

Failed before its fix: ``disable`` deleted ``flashinfer_sm120_autoload.pth`` whole and ``enable``
overwrote it, losing lines a user (or another tool) had added to it.
"""

from __future__ import annotations

from flashinfer_sm120.core import autoload
from flashinfer_sm120.cli import main


def test_lines_added_to_the_pth_survive_enable_and_disable(tmp_path, capsys):
    pth = tmp_path / autoload.PTH_NAME
    assert main(["enable", "--site-dir", str(tmp_path)]) == 0
    with open(pth, "a") as fh:
        fh.write("import os\n")
    assert main(["enable", "--site-dir", str(tmp_path)]) == 0  # enable again keeps it
    assert pth.read_text() == autoload.PTH_LINE + "import os\n"
    assert main(["disable", "--site-dir", str(tmp_path)]) == 0  # disable drops only our line
    assert pth.read_text() == "import os\n"
    assert not (tmp_path / autoload.HOOK_FILE).exists()
    assert main(["disable", "--site-dir", str(tmp_path)]) == 0  # nothing of ours left: untouched
    assert pth.read_text() == "import os\n"
    capsys.readouterr()


def test_a_pth_of_ours_alone_is_removed(tmp_path):
    assert main(["enable", "--site-dir", str(tmp_path)]) == 0
    assert main(["disable", "--site-dir", str(tmp_path)]) == 0
    assert not (tmp_path / autoload.PTH_NAME).exists()
