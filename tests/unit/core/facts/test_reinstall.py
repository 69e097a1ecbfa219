"""The reinstall fix read from pip's ``direct_url.json`` (PEP 610): a command that is safe to
paste (P8), read bounded (P6).

A checkout under a path with a blank (``/home/me/My Projects/x``) must not give the fix
``pip install --force-reinstall /home/me/My Projects/x`` (two arguments), nor a path with ``;``
a command that runs a second command when pasted; ``file://server/share/x`` is not shown as
``/share/x`` (another machine's path); a ``direct_url.json`` that is a FIFO must not hang the message
(nor the ``import flashinfer_sm120`` that prints it), and a huge one is not read whole.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shlex
import threading
import urllib.parse

from hypothesis import given, strategies as st

from flashinfer_sm120.core.facts import reinstall


def _with_url(monkeypatch, url) -> str:
    class Dist:
        def read_text(self, name):
            return json.dumps({"url": url, "dir_info": {"editable": True}})

    monkeypatch.setattr(importlib.metadata, "distribution", lambda name: Dist())
    return reinstall.source()


def test_a_checkout_path_is_one_shell_word(monkeypatch):
    assert _with_url(monkeypatch, "file:///home/me/My%20Projects/x") == "'/home/me/My Projects/x'"
    shown = _with_url(monkeypatch, "file:///x;%20rm%20-rf%20~")
    assert shlex.split(shown) == ["/x; rm -rf ~"]


def test_another_hosts_path_is_not_shown_as_ours(monkeypatch):
    assert _with_url(monkeypatch, "file://server/share/x") == "/path/to/flashinfer-sm120"
    assert _with_url(monkeypatch, "file://localhost/home/me/x") == "/home/me/x"
    assert _with_url(monkeypatch, "https://example.com/x.tar.gz") == "/path/to/flashinfer-sm120"


@given(st.one_of(st.text(max_size=300), st.binary(max_size=300).map(lambda b: "file:///" + urllib.parse.quote(b))))
def test_any_url_gives_one_shell_word_or_the_placeholder(url):
    class Dist:
        def read_text(self, name):
            return json.dumps({"url": url})

    orig = importlib.metadata.distribution
    importlib.metadata.distribution = lambda name: Dist()
    try:
        shown = reinstall.source()
    finally:
        importlib.metadata.distribution = orig
    words = shlex.split(shown)
    assert len(words) == 1 and words[0].startswith("/") and words[0].isprintable() and len(shown) < 2100


def _dist_info(tmp_path):
    d = tmp_path / "flashinfer_sm120-0.2.0.dist-info"
    d.mkdir()
    (d / "METADATA").write_text("Metadata-Version: 2.1\nName: flashinfer-sm120\nVersion: 0.2.0\n")
    return d


def test_a_fifo_direct_url_json_does_not_block(monkeypatch, tmp_path):
    d = _dist_info(tmp_path)
    os.mkfifo(d / "direct_url.json")
    monkeypatch.setattr(importlib.metadata, "distribution",
                        lambda name: importlib.metadata.PathDistribution(d))
    out: list = []
    t = threading.Thread(target=lambda: out.append(reinstall.source()), daemon=True)
    t.start()
    t.join(120)  # a hang guard only
    if t.is_alive():  # unblock the reader so the test process can end
        os.close(os.open(d / "direct_url.json", os.O_WRONLY | os.O_NONBLOCK))
    assert out == ["/path/to/flashinfer-sm120"]


def test_a_huge_direct_url_json_is_not_read(monkeypatch, tmp_path):
    d = _dist_info(tmp_path)
    with open(d / "direct_url.json", "wb") as f:
        f.truncate(1 << 30)  # sparse: 1 GiB of NULs
    dist = importlib.metadata.PathDistribution(d)
    read: list = []
    real = dist.read_text
    monkeypatch.setattr(dist, "read_text", lambda name: read.append(name) or real(name))
    monkeypatch.setattr(importlib.metadata, "distribution", lambda name: dist)
    assert reinstall.source() == "/path/to/flashinfer-sm120" and read == []
