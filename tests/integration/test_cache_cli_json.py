"""`cache export --json` and `cache import --json` print exactly one JSON document on stdout for every
outcome, failures included, with the same fields each time.  threat-model: P8.

Regression: `cache import --json` printed nothing on stdout for a bad archive, a missing manifest,
a bad module or arch (only the ImportError path printed JSON)."""

from __future__ import annotations

import bz2
import json

import pytest

from helpers.child import cli
from helpers.host import needs_flashinfer
from helpers.exports import make_export

pytestmark = needs_flashinfer

FIELDS = {"ok", "error", "modules", "fingerprint"}


def _one_doc(proc, where: str) -> dict:
    doc = json.loads(proc.stdout)  # the whole of stdout: one document, nothing else
    assert set(doc) == FIELDS | {where}, doc
    return doc


def _failure(proc, where: str, kind: str, code: int = 1) -> dict:
    """The one failure document of ``kind``; exit status 2 for the command line's (usage, arch), else 1
    (docs/reference/cli.md)."""
    doc = _one_doc(proc, where)
    assert proc.returncode == code and doc["ok"] is False and doc["modules"] == [], (proc.returncode, doc)
    assert set(doc["error"]) == {"kind", "message", "fix"} and doc["error"]["kind"] == kind, doc
    assert doc["error"]["message"] and len(doc["error"]["message"]) < 5000
    assert doc["error"]["message"] in proc.stderr and doc["error"]["fix"] in proc.stderr  # said to a person too
    assert doc["error"]["fix"], doc  # P8: a module or usage error names its fix too, never "fix": ""
    return doc


@pytest.fixture
def env(clean_env):
    return dict(clean_env, FAKE_GPU_CAPS="")


def test_import_failures_are_one_document_each(env, tmp_path):
    bad = tmp_path / "cache.tar"
    bad.write_bytes(bz2.compress(b"x" * 1000))
    doc = _failure(cli(["cache", "import", str(bad), "--json"], env), "src", "archive")
    assert "bzip2" in doc["error"]["message"]
    missing = tmp_path / "no-such-export"
    doc = _failure(cli(["cache", "import", str(missing), "--json"], env), "src", "archive")
    assert str(missing) in doc["error"]["message"] and doc["error"]["fix"], doc  # P8: never "fix": ""
    good = make_export(tmp_path / "exp", {"jit/m/m.so": b"so"})
    doc = _failure(cli(["cache", "import", str(good), "--arch", "sm_999x", "--json"], env), "src", "arch", 2)
    assert "sm_999x" in doc["error"]["message"]


def test_export_failures_are_one_document_each(env, tmp_path):
    out = str(tmp_path / "out.tar.gz")
    doc = _failure(cli(["cache", "export", out, "--from", str(tmp_path / "none.jsonl"), "--json"], env),
                   "out", "manifest")
    assert "none.jsonl" in doc["error"]["message"]
    doc = _failure(cli(["cache", "export", out, "samplng", "--arch", "12.0", "--json"], env), "out", "usage", 2)
    assert "samplng" in doc["error"]["message"] and "sampling" in doc["error"]["fix"]  # bad usage, as for build
    doc = _failure(cli(["cache", "export", out, "sampling", "--arch", "sm_999x", "--json"], env), "out", "arch", 2)
    assert "sm_999x" in doc["error"]["message"]
    doc = _failure(cli(["cache", "export", out, "--json"], env), "out", "usage", 2)
    assert "--all" in doc["error"]["message"]
    doc = _failure(cli(["cache", "export", "sampling", out, "--json"], env), "out", "usage", 2)  # OUT comes first
    assert "'sampling'" in doc["error"]["message"] and f"cache export '{out}' sampling" in doc["error"]["fix"], doc
    doc = _failure(cli(["cache", "export", out, "sampling", "--json"], env), "out", "usage", 2)  # no GPU, no build
    assert "nothing is built here" in doc["error"]["message"] and "--arch" in doc["error"]["fix"], doc
    doc = _failure(cli(["cache", "export", out, "sampling", "--arch", "12.0", "--json"], env), "out", "export")
    msg = doc["error"]["message"]  # not built for this toolkit: which targets, nvcc and workspace were looked in
    assert "sampling is not built" in msg and "sm_120f with nvcc 13." in msg and "/cached_ops" in msg, msg
    assert "'flashinfer-sm120 build --arch 12.0 sampling'" in doc["error"]["fix"]  # not 'run doctor'
    doc = _failure(cli(["cache", "export", out, "decode", "--dtype", "fp16", "--arch", "12.0", "--json"], env),
                   "out", "export")
    assert "'flashinfer-sm120 build --arch 12.0 decode --dtype fp16'" in doc["error"]["fix"], doc
    (tmp_path / "taken").write_text("")
    doc = _failure(cli(["cache", "export", str(tmp_path / "taken"), "--all", "--json"], env), "out", "exists")
    assert "already exists" in doc["error"]["message"]
    assert doc["error"]["fix"] == "choose a new path (an export never overwrites)"  # P8: never "fix": ""


@pytest.mark.parametrize("name", ["out.tar.xz", "out.zip", "OUT.TBZ2"])
def test_an_archive_name_export_cannot_write_is_refused_naming_those_it_can(env, tmp_path, name):
    """`cache export OUT.tar.xz` exited 0 and wrote a directory named OUT.tar.xz (P8)."""
    out = tmp_path / name
    doc = _failure(cli(["cache", "export", str(out), "sampling", "--arch", "12.0", "--json"], env), "out", "usage", 2)
    assert str(out) in doc["error"]["message"] and ".tar, .tar.gz or .tgz" in doc["error"]["fix"], doc
    assert not out.exists() and not (tmp_path / "ws").exists()


def test_a_refused_import_creates_nothing_and_exits_1(env, tmp_path):
    """An export made with another workspace, imported into an empty one, was refused with the fix but left
    FlashInfer's workspace, a lease and flashinfer_jit.log behind (P4: nothing is created before the checks
    that would refuse it), and exited 2 where docs/warmup.md says 1."""
    src = make_export(tmp_path / "exp", {"jit/m/m.so": b"so"})  # made with jit_dir /nowhere
    doc = _failure(cli(["cache", "import", str(src), "--json"], env), "src", "mismatch")
    assert "jit_dir" in doc["error"]["message"] and "FLASHINFER_WORKSPACE_BASE" in doc["error"]["fix"], doc
    assert not (tmp_path / "ws").exists(), sorted(str(p) for p in (tmp_path / "ws").rglob("*"))
