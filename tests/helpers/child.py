"""Child Pythons: :func:`run_code` and :func:`run_py` (a fresh process, forked from the session's fork
server where the environment allows it) and :func:`cli` (the ``flashinfer-sm120`` command in one)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Sequence

#: The session's forkserver.Client, started on first use; ``[None]`` when off (``pytest --no-forkserver``).
_SERVER: list = []

#: ``python -m flashinfer_sm120`` as code for :func:`run_code` (its arguments follow in ``args``).
RUN_MODULE = "import runpy\nrunpy.run_module('flashinfer_sm120', run_name='__main__', alter_sys=True)\n"


def forkserver_off() -> None:
    """Every child a new interpreter (``pytest --no-forkserver``)."""
    _SERVER[:] = [None]


def forkserver():
    """The session's fork server (started on first call), or ``None`` when off or it cannot start."""
    if not _SERVER:
        try:
            from helpers import forkserver as fs

            _SERVER.append(fs.Client())
        except Exception:  # no fork server: new interpreters, as before
            _SERVER.append(None)
    return _SERVER[0]


def close_forkserver() -> None:
    if _SERVER and _SERVER[0] is not None:
        _SERVER[0].close()


def run_code(code: str, env: dict, timeout: float = 600, args: tuple = ()) -> subprocess.CompletedProcess:
    """``python -c code *args`` with ``env``, captured as text: a fresh process, forked from the
    session's fork server (torch and FlashInfer's dependencies already imported, FlashInfer and
    flashinfer_sm120 not) when the environment allows it, else a new interpreter."""
    code = textwrap.dedent(code)
    server = forkserver()
    if server is not None and server.usable_for(env):
        return server.run(code, env, timeout, args=list(args))
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


def run_py(code: str, env: dict, timeout: float = 600) -> tuple[dict, subprocess.CompletedProcess]:
    """Run ``code`` in a fresh Python (:func:`run_code`); it must print one JSON line prefixed ``@@``."""
    proc = run_code(code, env, timeout)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("@@"):
            return json.loads(line[2:]), proc
    raise AssertionError(f"child printed no result (exit {proc.returncode}):\n"
                         f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-5000:]}")


def cli(args, env: dict, timeout: float = 600, *, fakegpu: bool = False, python: str | None = None,
        prefix: Sequence[str] = ()) -> subprocess.CompletedProcess:
    """``flashinfer-sm120 ARGS`` with ``env``, captured as text: forked where the environment allows
    (:func:`run_code`); with ``python``, ``python -m flashinfer_sm120`` as a new process of that
    interpreter (another venv's, or ``sys.executable`` where a test needs a real start-up), run by
    ``prefix`` if given (``setpriv ...``, ``unshare ...``, ``nice -n 10``).  ``fakegpu`` imports
    ``helpers.fakegpu`` first (``FAKE_GPU_CAPS`` then says what GPUs there are)."""
    code = ("import helpers.fakegpu\n" if fakegpu else "") + RUN_MODULE
    if python is None:
        assert not prefix, "a prefix runs a new process: pass python= too"
        return run_code(code, env, timeout, tuple(args))
    argv = [python, "-c", code] if fakegpu else [python, "-m", "flashinfer_sm120"]
    return subprocess.run([*prefix, *argv, *args], env=env, capture_output=True, text=True, timeout=timeout)
