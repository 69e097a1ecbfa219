"""Record every JIT module FlashInfer builds or loads in this process into a manifest
(``FLASHINFER_SM120_RECORD=/path/manifest.jsonl``; ``build --from`` rebuilds them elsewhere).

Hooks (FlashInfer 0.7.4 ``flashinfer/jit/core.py``): ``JitSpec.build_and_load`` (the path every
``get_*_module`` takes), ``JitSpecNvcc.build``/``load`` (direct callers) and ``build_jit_specs`` (the
batch build), wrapped on the classes with wrapt once ``flashinfer.jit.core`` is imported, so names bound
elsewhere see them too.  What is written is data (P2): the ``gen_*_module`` function that made the spec
and its arguments (``JitSpecNvcc.__init__`` is wrapped too: :func:`.generators.capture`), never source
text, paths or flags.  Each entry is one ``write()`` on an ``O_APPEND`` descriptor under a ``filelock``
lock, so appends from many workers never tear; a lock not taken within 10 s skips the entry, said once.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import threading

from flashinfer_sm120.errors import PlaceError
from flashinfer_sm120.safety.formats.reads import env_flag

__all__ = ["ENV", "install_if_enabled", "append"]

ENV = "FLASHINFER_SM120_RECORD"
_LOCK_TIMEOUT_S = 10.0
logger = logging.getLogger("flashinfer_sm120")
_state = {"installed": False, "seen": set(), "warned": False}
_mutex = threading.Lock()


def install_if_enabled() -> None:
    """Register the recorder if ``FLASHINFER_SM120_RECORD`` names a file; never raises."""
    try:
        path = os.environ.get(ENV, "").strip()
        if not path or env_flag("FLASHINFER_SM120_DISABLE") or _state["installed"]:
            return
        import wrapt

        wrapt.register_post_import_hook(_on_core_import, "flashinfer.jit.core")
        _state["installed"] = True
    except Exception as exc:  # never break the host
        logger.warning("flashinfer-sm120: cannot record JIT modules (%s=%s): %r", ENV,
                       os.environ.get(ENV), exc)


def _on_core_import(core) -> None:
    try:
        import wrapt

        # threat-model: P2 (the generator and its parameters are recorded, so replay never needs source text)
        wrapt.wrap_function_wrapper(core.JitSpecNvcc, "__init__", _init_wrapper)
        wrapt.wrap_function_wrapper(core.JitSpec, "build_and_load", _spec_wrapper)
        wrapt.wrap_function_wrapper(core.JitSpecNvcc, "build", _spec_wrapper)
        wrapt.wrap_function_wrapper(core.JitSpecNvcc, "load", _spec_wrapper)
        wrapt.wrap_function_wrapper(core, "build_jit_specs", _batch_wrapper)
    except Exception as exc:
        logger.warning("flashinfer-sm120: cannot record JIT modules: %r", exc)


def _init_wrapper(wrapped, instance, args, kwargs):
    result = wrapped(*args, **kwargs)
    from flashinfer_sm120.core.jitenv.generators import capture

    capture(instance)
    return result


def _spec_wrapper(wrapped, instance, args, kwargs):
    _record(instance)
    return wrapped(*args, **kwargs)


def _batch_wrapper(wrapped, instance, args, kwargs):
    specs = args[0] if args else kwargs.get("specs", ())
    for spec in list(specs or ()):
        _record(spec)
    return wrapped(*args, **kwargs)


def _targets() -> list[str]:
    from flashinfer.jit import core

    return sorted(f"{major}.{minor}" for major, minor in core.current_compilation_context.TARGET_CUDA_ARCHS)


def _record(spec) -> None:
    try:
        path = os.environ.get(ENV, "").strip()
        if not path or spec is None:
            return
        targets = _targets()
        k = (getattr(spec, "name", None), tuple(targets))
        with _mutex:
            if k in _state["seen"]:
                return
            _state["seen"].add(k)
        from flashinfer import __version__ as fi_version

        from flashinfer_sm120.core.jitenv.manifest import encode, parse_entry

        entry = encode(spec, str(fi_version), targets)
        entry["pid"] = os.getpid()
        from flashinfer_sm120.core.facts.serverprobe import recorded  # the server process and its FlashInfer workspace, for build --from

        entry.update(recorded())
        parse_entry(entry, f"{ENV}={path}")  # never write a line that replay would refuse
        append(path, entry)
    except Exception as exc:  # recording must never break a build
        if not _state["warned"]:
            _state["warned"] = True
            fix = "" if isinstance(exc, PlaceError) else \
                f". Fix: set {ENV} to a file in a directory of your own, or unset it"  # a PlaceError names its own
            logger.warning("flashinfer-sm120: could not record JIT module %s in %s: %s%s", getattr(spec, "name", "?"),
                           os.environ.get(ENV), _why(exc), fix)


def _why(exc: BaseException) -> str:
    """What went wrong, in words (threat-model: P8: by errno and kind, never an exception's repr)."""
    from filelock import Timeout

    from flashinfer_sm120.safety import oserrors

    if isinstance(exc, Timeout):
        return f"its lock {exc.lock_file} stayed taken for {_LOCK_TIMEOUT_S:g} s"
    if isinstance(exc, OSError) and exc.errno:
        return oserrors.describe(exc, exc.filename or "it").message
    return str(exc) or type(exc).__name__


def append(path: str, entry: dict) -> None:
    """Append ``entry`` as one JSON line to ``path`` (made mode 0644) under ``path + '.lock'``.

    :raises PlaceError: its directory is another uid's to change.
    :raises OSError: the file cannot be written.
    :raises filelock.Timeout: the lock stayed taken for 10 s.
    """
    from filelock import FileLock

    from flashinfer_sm120.safety.ownership import check_place

    line = (json.dumps(entry, sort_keys=True, separators=(",", ":")) + "\n").encode()
    # where another user can replace the manifest (a link to one of your files) or a directory on
    # the way, an append would write outside it: the directory must pass the trust rule, the file
    # must be yours and is never reached through a symlink
    problem = check_place(os.path.dirname(os.path.abspath(path)), f"the directory of {ENV}",
                          f"set {ENV} to a file in a directory of your own, or unset it", doing="write in")
    if problem:
        raise PlaceError(str(problem))
    # a lock file that cannot be made (/proc/self/fd, a read-only place) fails now, not after filelock's
    # retries for the lock's 10 s
    os.close(os.open(path + ".lock", os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644))
    with FileLock(path + ".lock", timeout=_LOCK_TIMEOUT_S, thread_local=False):
        # non-blocking open: a FIFO without a reader must not hang FlashInfer's build_and_load
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW,
                     0o644)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise OSError(f"{path} is not a regular file (a manifest is appended to a plain file)")
            if st.st_uid != os.geteuid():
                raise OSError(f"{path} is owned by uid {st.st_uid}, not you: record into a file of your own")
            os.set_blocking(fd, True)
            view = memoryview(line)
            while view:  # a short write (disk full, signal) continues, still under the lock
                n = os.write(fd, view)
                view = view[n:]
        finally:
            os.close(fd)
