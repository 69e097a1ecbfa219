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


def _failure(proc, where: str, kind: str) -> dict:
    doc = _one_doc(proc, where)
    assert proc.returncode == 2 and doc["ok"] is False and doc["modules"] == []
    assert set(doc["error"]) == {"kind", "message", "fix"} and doc["error"]["kind"] == kind, doc
    assert doc["error"]["message"] and len(doc["error"]["message"]) < 5000
    assert doc["error"]["message"] in proc.stderr  # and said to a person on stderr
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
    doc = _failure(cli(["cache", "import", str(good), "--arch", "sm_999x", "--json"], env), "src", "arch")
    assert "sm_999x" in doc["error"]["message"]


def test_export_failures_are_one_document_each(env, tmp_path):
    out = str(tmp_path / "out.tar.gz")
    doc = _failure(cli(["cache", "export", out, "--from", str(tmp_path / "none.jsonl"), "--json"], env),
                   "out", "manifest")
    assert "none.jsonl" in doc["error"]["message"]
    doc = _failure(cli(["cache", "export", out, "no_such_module", "--arch", "12.0", "--json"], env), "out", "module")
    assert "no_such_module" in doc["error"]["message"]
    doc = _failure(cli(["cache", "export", out, "sampling", "--arch", "sm_999x", "--json"], env), "out", "arch")
    assert "sm_999x" in doc["error"]["message"]
    doc = _failure(cli(["cache", "export", out, "--json"], env), "out", "usage")
    assert "--all" in doc["error"]["message"]
    (tmp_path / "taken").write_text("")
    doc = _failure(cli(["cache", "export", str(tmp_path / "taken"), "--all", "--json"], env), "out", "exists")
    assert "already exists" in doc["error"]["message"]
    assert doc["error"]["fix"] == "choose a new path (an export never overwrites)"  # P8: never "fix": ""
