"""Messages for OSErrors are chosen by errno from one table (flashinfer_sm120.safety.oserrors.BY_ERRNO), on
real errors: a full file system, another uid's directory, a too-long name, an existing file.
threat-model: P8.  Regression: any OSError was reported as free space."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys

import pytest

from flashinfer_sm120.safety import oserrors

#: Makes the error argv[1] for real and prints its description as JSON.
PROVOKE = r"""
import errno, json, os, sys
from flashinfer_sm120.safety import oserrors
what, where = sys.argv[1], sys.argv[2]
try:
    if what == "full":
        with open(os.path.join(where, "big"), "wb") as f:
            while True:
                f.write(bytes(1 << 20))
                f.flush()
    elif what == "inodes":
        for i in range(1000):
            open(os.path.join(where, str(i)), "wb").close()
    elif what == "denied":
        open(os.path.join(where, "x"), "wb")
    elif what == "long":
        open(os.path.join(where, "n" * 300), "wb")
    elif what == "exists":
        os.mkdir(where)
except OSError as exc:
    p = oserrors.describe(exc, elsewhere="set FLASHINFER_WORKSPACE_BASE elsewhere")
    print(json.dumps({"errno": exc.errno, "kind": p.kind, "message": p.message, "fix": p.fix}))
"""


def _provoke(what, where, prefix=()):
    proc = subprocess.run([*prefix, sys.executable, "-c", PROVOKE, what, str(where)], capture_output=True,
                          text=True, timeout=120)
    assert proc.stdout, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_a_full_disk_is_free_space(tmp_path):
    d = tmp_path / "small"
    d.mkdir()
    code = f'mount -t tmpfs -o size=2m tmpfs {d} && exec "$@"'
    res = _provoke("full", d, prefix=("unshare", "-m", "sh", "-c", code, "sh"))
    assert res["errno"] == errno.ENOSPC and res["kind"] == "space"
    assert "full" in res["message"] and "FLASHINFER_WORKSPACE_BASE" in res["fix"]


def test_a_file_system_out_of_inodes_is_not_called_full(tmp_path):
    """ENOSPC with free blocks and no free inodes says "out of inodes" and that files must go (P8)."""
    d = tmp_path / "few-inodes"
    d.mkdir()
    code = f'mount -t tmpfs -o size=10m,nr_inodes=8 tmpfs {d} && exec "$@"'
    res = _provoke("inodes", d, prefix=("unshare", "-m", "sh", "-c", code, "sh"))
    assert res["errno"] == errno.ENOSPC and res["kind"] == "space", res
    assert "inodes" in res["message"] and "full" not in res["message"], res
    assert "delete files" in res["fix"] and "FLASHINFER_WORKSPACE_BASE" in res["fix"], res


def test_another_users_directory_is_permissions_naming_the_path(tmp_path):
    d = tmp_path / "root-only"
    d.mkdir(mode=0o755)
    os.chmod(tmp_path, 0o755)
    res = _provoke("denied", d, prefix=("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"))
    assert res["errno"] == errno.EACCES and res["kind"] == "permission"
    assert str(d / "x") in res["message"] and "free" not in res["message"] + res["fix"]


def test_a_too_long_name_says_so(tmp_path):
    res = _provoke("long", tmp_path)
    assert res["errno"] == errno.ENAMETOOLONG and res["kind"] == "path" and "longer than the file system allows" in res["message"]


def test_an_existing_path_says_so(tmp_path):
    res = _provoke("exists", tmp_path)
    assert res["errno"] == errno.EEXIST and res["kind"] == "exists" and str(tmp_path) in res["message"]


@pytest.mark.parametrize("code", sorted(oserrors.BY_ERRNO))
def test_every_row_formats(code):
    p = oserrors.describe(OSError(code, os.strerror(code), "/some/path"))
    assert p.kind == oserrors.BY_ERRNO[code][0] and "{" not in str(p)
