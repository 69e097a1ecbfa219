"""The manifest: ``FLASHINFER_SM120_RECORD=/abs/manifest.jsonl`` records each JIT module built or loaded as its
``gen_*_module`` and arguments, never source text (P2), for ``build --from``; :func:`parse_entry` is its grammar."""

from __future__ import annotations

import contextlib
import dis
import inspect
import json
import logging
import os
import re
import stat
import sys
import threading
from typing import Any

from flashinfer_sm120.errors import FormatError, PlaceError
from flashinfer_sm120.safety.formats.reads import env_flag
from flashinfer_sm120.safety.formats.fields import field

ENV = "FLASHINFER_SM120_RECORD"
FORMAT = 1
MAX_TARGETS = 32
_LOCK_TIMEOUT_S = 10.0
_FIX = "record the manifest again with FLASHINFER_SM120_RECORD"
_OWN = f"set {ENV} to a file in a directory of your own, or unset it"
#: Attribute of a ``JitSpecNvcc`` that holds ``{"generator", "params"}`` or why there is none.
ORIGIN = "_flashinfer_sm120_origin"
_GEN_RE = re.compile(r"_?gen_[a-z0-9_]+_module")
_STORES = {"STORE_FAST", "DELETE_FAST", "STORE_DEREF", "DELETE_DEREF", "STORE_NAME", "DELETE_NAME"}
logger = logging.getLogger("flashinfer_sm120")
_state = {"installed": False, "seen": set(), "warned": False}
_mutex = threading.Lock()


def install_if_enabled() -> None:
    """Register the recorder if ``FLASHINFER_SM120_RECORD`` names a file by an absolute path; never raises."""
    try:
        path = os.environ.get(ENV, "").strip()
        if not path or env_flag("FLASHINFER_SM120_DISABLE") or _state["installed"]:
            return
        if not os.path.isabs(path):  # workers start in other directories: each would write its own file
            logger.warning("flashinfer-sm120: %s=%r is a relative path, so nothing is recorded: worker processes "
                           "that start elsewhere would each write their own manifest. Fix: give an absolute path "
                           "(export %s=%s)", ENV, path, ENV, os.path.join(os.getcwd(), path))
            return
        import wrapt

        wrapt.register_post_import_hook(_on_core_import, "flashinfer.jit.core")
        _state["installed"] = True
    except Exception as exc:  # never break the host
        logger.warning("flashinfer-sm120: cannot record JIT modules (%s=%s): %r", ENV, os.environ.get(ENV), exc)


def _on_core_import(core) -> None:
    """Wrap, on FlashInfer 0.7.4's classes (``flashinfer/jit/core.py``), every path a module is built or loaded by."""
    try:
        import wrapt

        # threat-model: P2 (the generator and its parameters are recorded, so replay never needs source text)
        wrapt.wrap_function_wrapper(core.JitSpecNvcc, "__init__", _init_wrapper)
        wrapt.wrap_function_wrapper(core.JitSpec, "build_and_load", _record_wrapper)
        wrapt.wrap_function_wrapper(core.JitSpecNvcc, "build", _record_wrapper)
        wrapt.wrap_function_wrapper(core.JitSpecNvcc, "load", _record_wrapper)
        wrapt.wrap_function_wrapper(core, "build_jit_specs", _record_wrapper)
    except Exception as exc:
        logger.warning("flashinfer-sm120: cannot record JIT modules: %r", exc)


def _init_wrapper(wrapped, instance, args, kwargs):
    result = wrapped(*args, **kwargs)
    capture(instance)
    return result


def _record_wrapper(wrapped, instance, args, kwargs):
    """A spec's method records its instance; ``build_jit_specs(specs)`` (a function: no instance) each spec."""
    specs = [instance] if instance is not None else (args[0] if args else kwargs.get("specs")) or ()
    for spec in list(specs):
        _record(spec)
    return wrapped(*args, **kwargs)


def capture(spec) -> None:
    """Note on ``spec`` the outermost FlashInfer ``gen_*_module`` call on the stack (0.7.4 ``gen_batch_decode_module(
    dtype_q, ...)``) and its arguments, or why they cannot be carried.  Never raises."""
    try:
        frame, outermost = sys._getframe(1), None
        while frame is not None:
            module, name = frame.f_globals.get("__name__") or "", frame.f_code.co_name
            if (module == "flashinfer" or module.startswith("flashinfer.")) and _GEN_RE.fullmatch(name) \
                    and "customize" not in name:
                outermost = frame
            frame = frame.f_back
        origin: Any = "no FlashInfer gen_*_module function made it" if outermost is None else _origin(outermost)
    except Exception as exc:  # recording never breaks a build
        origin = f"its generator's arguments could not be read ({type(exc).__name__})"
    with contextlib.suppress(Exception):
        object.__setattr__(spec, ORIGIN, origin)


def _origin(frame) -> dict | str:
    from flashinfer_sm120.safety.formats.params import parse_generator, parse_params

    code = frame.f_code
    where = f"{frame.f_globals.get('__name__')}:{code.co_name}"
    fn = frame.f_globals.get(code.co_name)
    if fn is None or getattr(inspect.unwrap(fn), "__code__", None) is not code:
        return f"{where} is not reachable by its name in its module"
    names, varargs, varkw, values = inspect.getargvalues(frame)
    positional, kwonly = names[:code.co_argcount], names[code.co_argcount:]
    params = {*names, *(p for p in (varargs, varkw) if p)}
    changed = sorted({i.argval for i in dis.get_instructions(code) if i.opname in _STORES and i.argval in params})
    if changed:  # the frame holds the new value, not the argument
        return f"{where} assigns to its parameter {changed[0]!r}, so its arguments cannot be read back"
    try:
        args = [encode_value(values[p]) for p in positional] + [encode_value(v) for v in values.get(varargs, ())]
        kwargs = {k: encode_value(values[k]) for k in kwonly}
        kwargs.update({k: encode_value(v) for k, v in (values.get(varkw) or {}).items()})
        out = {"generator": where, "params": {"args": args, "kwargs": kwargs}}
        parse_generator(out["generator"], where)
        parse_params(out["params"], where)
    except FormatError as exc:
        return f"{where}: {exc}"
    return out


def encode_value(value: Any, depth: int = 0) -> Any:
    """A generator argument as plain JSON (:mod:`.params`); :raises FormatError: another type (enums too)."""
    from flashinfer_sm120.safety.formats.params import PARAM_MAX_DEPTH

    if depth > PARAM_MAX_DEPTH:
        raise FormatError("an argument nests too deep")
    if value is None or type(value) in (bool, int, float, str):
        return value
    if type(value).__name__ == "dtype" and type(value).__module__ == "torch":
        return {"dtype": str(value).split(".", 1)[-1]}
    if type(value) is tuple:
        return {"tuple": [encode_value(v, depth + 1) for v in value]}
    if type(value) is list:
        return [encode_value(v, depth + 1) for v in value]
    raise FormatError(f"an argument is a {type(value).__name__}, not a plain value")


def _record(spec) -> None:
    try:
        path = os.environ.get(ENV, "").strip()
        if not os.path.isabs(path) or spec is None:  # unset, or relative (refused by install_if_enabled)
            return
        from flashinfer import __version__ as fi_version
        from flashinfer.jit import core

        targets = sorted(f"{a}.{b}" for a, b in core.current_compilation_context.TARGET_CUDA_ARCHS)
        with _mutex:
            key = (getattr(spec, "name", None), tuple(targets))
            if key in _state["seen"]:
                return
            _state["seen"].add(key)
        from flashinfer_sm120.core.facts.serverprobe import recorded  # the server and its workspace, for build --from

        entry = dict(encode(spec, str(fi_version), targets), pid=os.getpid(), **recorded())
        parse_entry(entry, f"{ENV}={path}")  # never write a line that replay would refuse
        append(path, entry)
    except Exception as exc:  # recording must never break a build
        if not _state["warned"]:
            _state["warned"] = True
            logger.warning("flashinfer-sm120: could not record JIT module %s in %s: %s (said once: a later module "
                           "this process cannot record is not reported)", getattr(spec, "name", "?"),
                           os.environ.get(ENV), _why(exc, os.environ.get(ENV)))


def _why(exc: BaseException, path: str | None) -> str:
    """What went wrong and the fix, in words (P8: by errno and kind, never an exception's repr)."""
    from flashinfer_sm120.safety import oserrors

    if isinstance(exc, OSError) and exc.errno:
        return str(oserrors.describe(exc, exc.filename or path, _OWN))
    return str(exc) if isinstance(exc, PlaceError) else f"{str(exc) or type(exc).__name__}. Fix: {_OWN}"


def _refuse_target(st: os.stat_result, path: str) -> None:
    """:raises OSError: ``path`` (``st``) is not a regular file of yours to append a manifest to."""
    if stat.S_ISLNK(st.st_mode):  # P2, P5: never followed
        raise OSError(f"{path} is a symbolic link (to {os.readlink(path)}); name the file itself")
    if not stat.S_ISREG(st.st_mode):
        raise OSError(f"{path} is not a regular file (a manifest is appended to a plain file)")
    if st.st_uid != os.geteuid():
        raise OSError(f"{path} is owned by uid {st.st_uid}, not you: record into a file of your own")


def _open(path: str, flags: int) -> int:
    """``path`` opened to append (and ``flags``) if a regular file of yours in a place of your own (P2, P5: else an
    append could write elsewhere); :raises PlaceError, OSError."""
    from flashinfer_sm120.safety.ownership import check_place

    where = os.path.dirname(os.path.abspath(path))
    problem = check_place(where, f"the directory of {ENV}", _OWN)
    if problem:
        raise PlaceError(str(problem))
    os.stat(where)  # a missing directory is named (ENOENT); a file in the way, by lstat's ENOTDIR below
    with contextlib.suppress(FileNotFoundError):  # P4: what would be made is checked before it is, and once open
        _refuse_target(os.lstat(path), path)
    # non-blocking: a FIFO without a reader must not hang FlashInfer's build_and_load; 0600: P6, nobody else can
    # open (and so lock) a manifest this makes
    fd = os.open(path, flags | os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        _refuse_target(os.fstat(fd), path)
        os.write(fd, b"")  # a file that opens but takes no write (/proc/self/environ) fails here
    except OSError:
        os.close(fd)
        raise
    return fd


def setting(path: str) -> str:
    """``ENV=`` the absolute ``path`` where the recorder would append to it, else the rule for a file of your own
    (P8: a fix never names a file the recorder refuses)."""
    path = os.path.abspath(path)
    try:
        os.close(_open(path, 0))  # without O_CREAT: nothing is made
    except FileNotFoundError:
        pass
    except (OSError, PlaceError):
        return f"{ENV} set to the absolute path of a file in a directory of your own"
    return f"{ENV}={path}"


def append(path: str, entry: dict) -> None:
    """Append ``entry`` as one JSON line, whole or not at all, under a ``flock`` of the manifest itself;
    :raises PlaceError, OSError."""
    import fcntl
    import time

    from flashinfer_sm120.safety.fs.proclocks import foreign

    line = (json.dumps(entry, sort_keys=True, separators=(",", ":")) + "\n").encode()
    fd = _open(path, os.O_CREAT)
    try:
        deadline = time.monotonic() + _LOCK_TIMEOUT_S
        while True:  # threat-model: P4, P5: workers serialise on the manifest itself, no lock file beside it
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if (h := foreign(path)) is not None:
                    raise PlaceError(f"{path} is locked by pid {h.pid} of uid {h.uid}, not you, so not waited for. "
                                     f"Fix: set {ENV} to a new file (made 0600: nobody else can open it), or ask "
                                     f"uid {h.uid} to end pid {h.pid} and chmod 600 {path}") from None
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{path} stayed locked by another of your processes for "
                                       f"{_LOCK_TIMEOUT_S:g} s") from None
                time.sleep(0.02)
        os.set_blocking(fd, True)
        start, view = os.fstat(fd).st_size, memoryview(line)
        try:
            while view:  # a short write (a signal) continues, still under the lock
                view = view[os.write(fd, view):]
        except OSError:  # P5: a half line (file-size limit, full disk) would swallow the next process's entry
            os.ftruncate(fd, start)
            raise
    finally:
        os.close(fd)  # releases the lock


def encode(spec, flashinfer_version: str, targets: list[str]) -> dict:
    """The entry for a ``JitSpec`` (generator and parameters from :func:`capture`), else ``regenerable: false``, ``why``."""
    entry: dict[str, Any] = {"format": FORMAT, "flashinfer": flashinfer_version, "name": spec.name,
                             "targets": sorted(targets), "toolchain": getattr(spec, "toolchain", "unknown")}
    origin = getattr(spec, ORIGIN, None)
    if entry["toolchain"] != "nvcc" or not hasattr(spec, "sources"):
        why = f"toolchain {entry['toolchain']!r} is not built by nvcc/ninja"
    elif getattr(spec, "embedded_cubin_factory", None) is not None:
        why = "it embeds cubins made by a Python callback at build time"
    elif not isinstance(origin, dict):
        why = origin or "it was made before recording started, so its FlashInfer generator and parameters are unknown"
    else:
        return dict(entry, **origin, regenerable=True)
    return dict(entry, regenerable=False, why=why)


def parse_entry(obj: Any, source: str) -> dict:
    """The fields replay reads of one entry, checked, as a new dict; :raises FormatError: names the key and the fix."""
    from flashinfer_sm120.safety.formats.grammar import parse, parse_version
    from flashinfer_sm120.safety.formats.params import parse_generator, parse_params

    f, fix = field, _FIX
    if not isinstance(obj, dict):
        raise FormatError(f"{source}: holds {type(obj).__name__}, not a JSON object; {fix}")
    fmt = f(obj, "format", int, source, fix=fix)
    if fmt != FORMAT:
        raise FormatError(f"{source}: entry format {fmt} is not {FORMAT}; {fix} with this release")
    out: dict[str, Any] = {"format": fmt}
    out["name"] = parse("name", f(obj, "name", str, source, fix=fix), f"{source} 'name'", fix=fix)
    out["flashinfer"] = str(parse_version(f(obj, "flashinfer", str, source, fix=fix), f"{source} 'flashinfer'", fix=fix))
    targets = f(obj, "targets", list, source, fix=fix, max_len=MAX_TARGETS)
    out["targets"] = [parse("target", t, f"{source} 'targets'", fix=fix) for t in targets]
    out["regenerable"] = f(obj, "regenerable", bool, source, default=False, fix=fix)
    if (why := f(obj, "why", str, source, default=None, fix=fix, max_len=1000)) is not None:
        out["why"] = why
    if (server := f(obj, "server", str, source, default=None, fix=fix)) is not None:
        out["server"] = parse("name", server, f"{source} 'server'", fix=fix)
    if not out["regenerable"]:
        return out
    if "spec" in obj or "generated" in obj:  # 0.2.0 recorded source text, which replay no longer reads
        raise FormatError(f"{source}: written by flashinfer-sm120 0.2 (it carries 'spec' or 'generated' source "
                          f"text), which this release does not read; {fix} with this release")
    generator = f(obj, "generator", str, source, fix=fix)  # threat-model: P2 (a generator and plain parameters)
    out["generator"] = ":".join(parse_generator(generator, f"{source} 'generator'", fix=fix))
    params = f(obj, "params", (dict, type(None)), source, default=None, fix=fix) or {}
    out["params"] = parse_params(params, f"{source} 'params'", fix=fix)
    return out
