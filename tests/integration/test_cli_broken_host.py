"""The command line in a broken host: a dependency of FlashInfer missing, standard descriptors
closed (P8).

``status`` and ``status --json`` end in no ``ModuleNotFoundError`` traceback when torch (or another
of FlashInfer's dependencies) cannot be imported, and ``build`` says more than ``importing FlashInfer
failed: ModuleNotFoundError(...)``; no command run with stdout closed (``>&-``) ends in
``AttributeError: 'NoneType' object has no attribute 'flush'``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from helpers.child import cli
from helpers.host import needs_flashinfer


@needs_flashinfer
@pytest.mark.parametrize("missing", ["torch", "numpy"])
def test_status_names_a_missing_dependency_of_flashinfer(hiding, missing):
    env = hiding(missing)
    plain = cli(["status"], env, timeout=300)
    assert plain.returncode == 1, plain.stderr[-3000:]
    assert "Traceback" not in plain.stdout + plain.stderr, plain.stderr[-3000:]
    assert plain.stdout.startswith("failed:") and f"pip install {missing}" in plain.stdout, plain.stdout

    as_json = cli(["status", "--json"], env, timeout=300)
    assert as_json.returncode == 1 and "Traceback" not in as_json.stderr, as_json.stderr[-3000:]
    st = json.loads(as_json.stdout)
    assert st["mode"] == "failed" and f"module '{missing}'" in st["error"], st["error"]


@needs_flashinfer
def test_build_names_a_missing_dependency_of_flashinfer(hiding):
    proc = cli(["build", "sampling", "--arch", "12.0", "--ninja-only"], hiding("torch"), timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "Fix: install it there (pip install torch" in proc.stderr, proc.stderr[-2000:]


def _closed(redirs: str, args: list[str], env: dict, code: str | None = None) -> subprocess.CompletedProcess:
    """Run the command (or ``python -c code``) from a shell with ``redirs`` (``>&-``) applied."""
    argv = [sys.executable, "-m", "flashinfer_sm120", *args] if code is None else [sys.executable, "-c", code]
    return subprocess.run(["/bin/sh", "-c", f'exec "$@" {redirs}', "sh", *argv], capture_output=True,
                          text=True, env=env, timeout=300)


@pytest.mark.parametrize("args,rc", [(["build", "--list"], 0), (["build", "--from", "/nonexistent"], 2),
                                     (["nosuchcommand"], 2)])
def test_closed_stdout_is_not_a_traceback(clean_env, args, rc):
    proc = _closed(">&-", args, clean_env)
    assert proc.returncode == rc and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    everything = _closed(">&- 2>&- <&-", args, clean_env)
    assert everything.returncode == rc


def test_closed_descriptors_are_not_handed_to_the_next_file(clean_env, tmp_path):
    """With fd 1 or 2 closed the next ``open`` got it: output meant for the terminal went into that file."""
    code = ("import os, sys\n"
            "from flashinfer_sm120.cli import main\n"
            "rc = main(['build', '--list'])\n"
            "fd = os.open(os.devnull, os.O_RDONLY)\n"
            "targets = [os.readlink(f'/proc/self/fd/{n}') for n in (0, 1, 2)]\n"
            "open(os.environ['A5_OUT'], 'w').write(repr((rc, fd, targets)))\n")
    out = tmp_path / "result"
    proc = _closed(">&- 2>&- <&-", [], dict(clean_env, A5_OUT=str(out)), code=code)
    assert proc.returncode == 0, proc
    rc, fd, targets = eval(out.read_text())  # noqa: S307 (our own repr)
    assert rc == 0 and fd > 2 and targets == [os.devnull] * 3, (rc, fd, targets)
