"""``status``'s one line shows what the last-status record says without the terminal acting on it
(threat-model P8)."""

from __future__ import annotations

import argparse

from flashinfer_sm120.cli import status


def test_a_record_with_escape_sequences_is_shown_not_acted_on(capsys):
    """A tampered last-status.json put terminal escape sequences on the screen raw."""
    st = {"mode": "\x1b]0;PWNED\x07", "toolkit": None, "targets": [], "error": "\x1b[31mEVIL"}
    status._say(argparse.Namespace(json=False), st, "record")
    out = capsys.readouterr().out
    assert "PWNED" in out and "EVIL" in out and "\x1b" not in out and "\x07" not in out
