"""``doctor``'s "FlashInfer alone" child must not run what the trust policy
refused (issue 5 item 12)."""

from __future__ import annotations

import os

from helpers.toolkits import make_toolkit, script
from flashinfer_sm120.diagnose.verify import report as doctor


def test_alone_child_skips_an_untrusted_nvcc_on_path(tmp_path, monkeypatch):
    marker = tmp_path / "ran"
    shared = tmp_path / "shared"  # world-writable, no sticky bit
    make_toolkit(shared, nvcc_script=f"#!/bin/sh\n/usr/bin/touch {marker}\necho 'release 12.8, V12.8.93'\n")
    os.chmod(shared, 0o777)
    monkeypatch.setattr(doctor, "_ORIGINAL_ENV", {})
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setenv("PATH", f"{shared / 'bin'}:/usr/bin:/bin")
    try:
        out = doctor._flashinfer_alone(timeout=30)
    finally:
        os.chmod(shared, 0o755)
    assert not marker.exists(), "doctor ran an nvcc that the trust policy refused"
    assert "skipped" in out and out["error"].startswith("not run:")
    assert str(shared) in out["skipped"] and "writable by other users" in out["skipped"]


def test_alone_child_skips_an_untrusted_which_on_path(tmp_path, monkeypatch):
    marker = tmp_path / "ran"
    ww = tmp_path / "ww"
    ww.mkdir()
    script(ww / "which", f"#!/bin/sh\n/usr/bin/touch {marker}\n")
    os.chmod(ww, 0o777)
    monkeypatch.setattr(doctor, "_ORIGINAL_ENV", {})
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setenv("PATH", f"{ww}:/usr/bin:/bin")
    try:
        out = doctor._flashinfer_alone(timeout=30)
    finally:
        os.chmod(ww, 0o755)
    assert not marker.exists() and str(ww / "which") in out["skipped"]
