"""A fork server for the tests' child Pythons (:func:`helpers.child.run_py`).

Most tests run FlashInfer in a fresh child Python, because patching is process-wide.
About three quarters of such a child's start-up is importing torch and FlashInfer's
other heavy dependencies (CuTe DSL, CUDA bindings, numpy), not FlashInfer or
flashinfer_sm120. This server imports those once; each child is forked from it,
gets the environment, working directory and ``sys.path`` a ``python -c CODE`` of
that environment would have, and runs its code there. FlashInfer, flashinfer_sm120,
wrapt's import hooks and the tests' ``fakegpu`` are never imported before the fork,
so every child still imports, patches and fakes them afresh, in its own process.

:func:`fresh_env_needed` says when a real interpreter is used instead: when the
environment differs from the server's in what Python or the dynamic loader read at
start-up (``PYTHON*`` variables other than ``PYTHONPATH``, ``HOME``, ``LD_*``).
``pytest --no-forkserver`` turns the server off.

Run as a script, this module is the server: it reads one JSON request per line on
stdin (``code``, ``env``, ``cwd``, ``out``, ``err``), answers ``{"pid": N}`` when the
child is started and ``{"rc": N}`` when it exited.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time

#: Imported once by the server: what a FlashInfer child spends most of its start-up on.
PRELOAD = ("torch", "numpy", "cutlass", "cuda.bindings.runtime", "requests", "jinja2", "einops", "tvm_ffi")
#: Never imported by the server: each child imports these itself, so that a test can also make
#: them missing (``sys.modules["packaging"] = None``) as in a new interpreter.
NEVER = ("flashinfer", "flashinfer_sm120", "fakegpu", "wrapt", "packaging", "filelock")
#: Start-up variables (besides PYTHON*) that must match for a forked child to be faithful.  HOME only where
#: it puts a user site directory on ``sys.path`` (never in a venv); else the child recomputes ``site``'s
#: two HOME paths, the only values derived from HOME that the preloaded modules hold (checked by a scan of them).
STARTUP_VARS = ("LD_LIBRARY_PATH", "LD_PRELOAD", *(("HOME",) if __import__("site").ENABLE_USER_SITE else ()))
#: PYTHON* variables a forked child can honour itself.
HONOURED = ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED")


def fresh_env_needed(env: dict, server_env: dict) -> str | None:
    """Why ``env`` needs a real interpreter rather than a fork of the server, or ``None``."""
    keys = {k for k in (*env, *server_env) if (k.startswith("PYTHON") and k not in HONOURED) or k in STARTUP_VARS}
    for k in sorted(keys):
        if env.get(k) != server_env.get(k):
            return f"{k} differs"
    for d in env.get("PYTHONPATH", "").split(os.pathsep):  # site imports these at start-up
        for name in ("sitecustomize.py", "usercustomize.py", "sitecustomize", "usercustomize"):
            if d and os.path.exists(os.path.join(d, name)):
                return f"{os.path.join(d, name)} runs at start-up"
    return None


# --------------------------------------------------------------------------- client (pytest side)


class Client:
    """One server for the whole session; :meth:`run` is ``subprocess.run([python, '-c', code])``."""

    def __init__(self, python: str = sys.executable):
        self.env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        self.proc = subprocess.Popen([python, "-u", os.path.abspath(__file__)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=self.env, text=True, bufsize=1)
        self.lock = threading.Lock()
        self._buf = b""  # what was read from the server past the last whole line
        self._next_id = 0
        self.cpu_s = 0.0  # CPU seconds of the children this server ran for us (``--cpu-profile``)
        ready = self._read(600)
        if ready.get("ready") is not True:
            raise RuntimeError(f"fork server did not start: {ready}")
        self.server_env = {k: v for k, v in self.env.items() if k != "PYTHONPATH"}

    def _read(self, timeout: float) -> dict:
        """The server's next line.  Read from the descriptor, not through a buffered file: ``pid`` and
        ``rc`` may arrive in one read, and ``select`` does not see a line already in a file's buffer
        (a loaded machine then waited out the whole timeout for an answer it had)."""
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            r, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not r:
                raise subprocess.TimeoutExpired("forkserver", timeout)
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise RuntimeError("fork server exited")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def _answer(self, key: str, rid: int, timeout: float) -> dict:
        """The answer ``key`` to request ``rid``; answers to an earlier, abandoned request are skipped."""
        deadline = time.monotonic() + timeout
        while True:
            msg = self._read(max(0.0, deadline - time.monotonic()))
            if msg.get("id") == rid and key in msg:
                return msg

    def usable_for(self, env: dict) -> bool:
        return self.proc.poll() is None and fresh_env_needed(env, self.server_env) is None

    def run(self, code: str, env: dict, timeout: float, cwd: str | None = None,
            args: list[str] = ()) -> subprocess.CompletedProcess:
        with self.lock, tempfile.TemporaryDirectory(prefix="forkserver-") as tmp:
            out, err = os.path.join(tmp, "out"), os.path.join(tmp, "err")
            self._next_id += 1
            rid = self._next_id
            req = {"id": rid, "code": code, "env": env, "cwd": cwd or os.getcwd(), "out": out, "err": err,
                   "args": list(args)}
            self.proc.stdin.write(json.dumps(req) + "\n")
            self.proc.stdin.flush()
            pid = self._answer("pid", rid, 600)["pid"]  # bounds against a hang, not speed goals
            try:
                done = self._answer("rc", rid, timeout)
                rc = done["rc"]
                self.cpu_s += done.get("cpu", 0.0)
            except subprocess.TimeoutExpired:
                try:
                    os.kill(pid, signal.SIGKILL)  # as subprocess.run does on a timeout: the child only
                except ProcessLookupError:
                    pass  # it ended meanwhile
                self._answer("rc", rid, 600)
                raise subprocess.TimeoutExpired([sys.executable, "-c", code, *args], timeout) from None
            with open(out, encoding="utf-8", errors="replace") as o, open(err, encoding="utf-8", errors="replace") as e:
                return subprocess.CompletedProcess([sys.executable, "-c", code, *args], rc, o.read(), e.read())

    def close(self) -> None:
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
        except Exception:
            self.proc.kill()


# --------------------------------------------------------------------------- server


def _child(req: dict) -> int:
    """In the forked child: become ``python -c code`` in ``req['env']``; returns the exit status."""
    import importlib
    import io
    import tempfile as _tempfile
    import types

    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    out = os.open(req["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    err = os.open(req["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0), os.dup2(out, 1), os.dup2(err, 2)
    for fd in (null, out, err):
        os.close(fd)
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), line_buffering=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), line_buffering=True,
                                  errors="backslashreplace")
    env = req["env"]
    os.environ.clear()
    os.environ.update(env)
    os.chdir(req["cwd"])
    sys.dont_write_bytecode = bool(env.get("PYTHONDONTWRITEBYTECODE"))
    _tempfile.tempdir = None  # TMPDIR is read again
    import site

    site.USER_BASE = site.USER_SITE = None  # read from HOME again when asked (STARTUP_VARS)
    # sys.path of `python -c`: '' first, then PYTHONPATH, then the interpreter's own entries
    # Python puts PYTHONPATH (made absolute) before the standard library; .pth files may have
    # inserted entries before those; and `-c` puts '' first.
    extra = [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = ["", *_SERVER_PATH[1:_STDLIB_AT], *extra, *_SERVER_PATH[_STDLIB_AT:]]
    importlib.invalidate_caches()
    sys.argv = ["-c", *req.get("args", [])]
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = __builtins__
    sys.modules["__main__"] = main
    rc = 0
    try:
        exec(compile(req["code"], "<string>", "exec"), main.__dict__)
    except SystemExit as exc:
        code = exc.code
        if code is None:
            rc = 0
        elif isinstance(code, int):
            rc = code & 0xFF
        else:
            print(code, file=sys.stderr)
            rc = 1
    except BaseException:
        import traceback

        traceback.print_exc()
        rc = 1
    try:  # what interpreter shutdown does: join threads, atexit, flush
        threading._shutdown()
    except Exception:
        pass
    try:
        import atexit

        atexit._run_exitfuncs()
    except Exception:
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    return rc


#: The server's sys.path at start (its [0] is this script's directory, which a child does not
#: have), and where its standard library entries begin (PYTHONPATH goes there).
_SERVER_PATH: list[str] = []
_STDLIB_AT = 1


def serve() -> None:
    global _STDLIB_AT
    _SERVER_PATH[:] = list(sys.path)
    bare = json.loads(subprocess.run([sys.executable, "-S", "-c", "import sys, json; print(json.dumps(sys.path))"],
                                     capture_output=True, text=True, check=True).stdout)[1:]  # no site, no .pth
    _STDLIB_AT = next((i for i, p in enumerate(_SERVER_PATH) if i and p in bare), 1)
    for name in PRELOAD:
        try:
            __import__(name)
        except Exception:  # not installed here: the children import it themselves, if at all
            pass
    loaded = sorted(n for n in sys.modules if n.partition(".")[0] in NEVER)
    if loaded:
        print(json.dumps({"ready": False, "error": f"preloading imported {loaded}"}), flush=True)
        return
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        pid = os.fork()
        if pid == 0:
            rc = 1
            try:
                rc = _child(req)
            finally:
                os._exit(rc)
        print(json.dumps({"pid": pid, "id": req.get("id")}), flush=True)
        _, status, usage = os.wait4(pid, 0)
        rc = os.waitstatus_to_exitcode(status)
        cpu = usage.ru_utime + usage.ru_stime  # the child's and its waited-for children's
        print(json.dumps({"rc": rc, "id": req.get("id"), "cpu": cpu}), flush=True)


if __name__ == "__main__":
    serve()
