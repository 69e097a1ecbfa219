"""``status``'s one line shows what the last-status record says without the terminal acting on it
(threat-model P8)."""

from __future__ import annotations

import argparse

from flashinfer_sm120.cli import status


#: What a user without a GPU sets: the variable for a server, --arch for an image; doctor --arch checks it.
FIX = ("FLASHINFER_CUDA_ARCH_LIST=12.0 for a server, build --arch 12.0 for an image (12.1 on DGX Spark); "
       "check with flashinfer-sm120 doctor --arch 12.0")

def test_a_record_with_escape_sequences_is_shown_not_acted_on(capsys):
    """A tampered last-status.json put terminal escape sequences on the screen raw."""
    st = {"mode": "\x1b]0;PWNED\x07", "toolkit": None, "targets": [], "error": "\x1b[31mEVIL"}
    status._say(argparse.Namespace(json=False), st, "record")
    out = capsys.readouterr().out
    assert "PWNED" in out and "EVIL" in out and "\x1b" not in out and "\x07" not in out


def test_json_from_a_record_has_no_unlabeled_fingerprint_and_says_why_nothing_builds(capsys):
    """``status --json`` showed the record's ``"stat": [65024, ...]`` and said ``no targets: none``."""
    import json

    tk = {"nvcc_full": "13.0.88", "root": "/tk", "nvcc": "/tk/bin/nvcc", "stat": [65024, 2533605, 1, 2, 3]}
    st = {"mode": "patched", "error": None, "toolkit": tk, "targets": [], "arch_list_error": None}
    assert status._say(argparse.Namespace(json=True), st, "record") == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["toolkit"] == {"nvcc_full": "13.0.88", "root": "/tk", "nvcc": "/tk/bin/nvcc"}
    assert doc["error"] == ("no targets, so nothing can be built: no GPU visible and no FLASHINFER_CUDA_ARCH_LIST; "
                            f"fix: {FIX}"), doc
    status._say(argparse.Namespace(json=False), st, "record")
    assert capsys.readouterr().out == ("patched: nvcc 13.0.88 at /tk; targets none, nothing can be built (no GPU "
                                       f"visible and no FLASHINFER_CUDA_ARCH_LIST; fix: {FIX})\n")


def test_a_refused_toolkit_setting_is_on_the_status_line(capsys):
    """CUDA_HOME=/opt/nope: status named another toolkit and not why (P8): the line names it and the fix."""
    note = {"variable": "CUDA_HOME", "value": "/opt/nope", "why": "directory does not exist", "fix": "unset CUDA_HOME"}
    tk = {"nvcc_full": "13.0.88", "root": "/tk", "nvcc": "/tk/bin/nvcc", "stat": [1]}
    st = {"mode": "patched", "error": None, "toolkit": tk, "targets": ["sm_120f"], "settings": [note]}
    assert status._say(argparse.Namespace(json=False), st, "record") == 0
    line = capsys.readouterr().out
    assert line.startswith("patched: nvcc 13.0.88 at /tk; targets sm_120f; CUDA_HOME='/opt/nope'"), line
    assert "directory does not exist" in line and line.endswith("Fix: unset CUDA_HOME\n"), line
    assert status._well_formed(st)
    for bad in (None, ["CUDA_HOME='/opt/nope' ..."], [dict(note, fix=None)], [{"variable": "CUDA_HOME"}]):
        assert not status._well_formed(dict(st, settings=bad)), bad  # a record of another shape is none
