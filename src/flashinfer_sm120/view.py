"""The ``CUDA_HOME`` view: a directory FlashInfer's generated ninja files can compile and link with.

FlashInfer's ``generate_ninja_build_for_op`` (``flashinfer/jit/cpp_ext.py``,
0.6.7 - 0.7.4) compiles with ``$cuda_home/bin/nvcc`` and ``-isystem
$cuda_home/include`` and links with ``-L$cuda_home/lib64
-L$cuda_home/lib64/stubs -lcudart -lcuda``.  The CUDA 13 pip wheels
(``site-packages/nvidia/cu13``) have ``lib/`` (no ``lib64``), only
``libcudart.so.13`` (no unversioned ``libcudart.so``), no ``stubs/libcuda.so``,
and keep ``curand.h`` only if ``nvidia-curand`` is installed (FlashInfer's
sampling kernels include it).  A system toolkit may lack curand too.

When the chosen toolkit lacks any of these, a *view* is assembled: a directory
of symlinks into the real toolkit plus the missing pieces (``libcudart.so``
link, the ``libcuda.so`` link stub of :mod:`flashinfer_sm120.linkstub`, curand
headers from a pip wheel) under ``<cache root>/cuda-home/``.

The view format lives here and only here:

* ``<cache root>/cuda-home/cuda-<nvcc version>-<key>[.N]``: ``key`` hashes the
  layout version, toolkit root, nvcc path and stat fingerprint, and curand
  include dir, so a reinstalled nvcc gets a new view;
* ``flashinfer_sm120_view.json`` in it (:class:`ViewMeta`), validated strictly;
* real directories ``include``, ``lib64``, ``lib64/stubs``; every other entry a
  symlink; regular files only the metadata and our stub.

A view is *adopted* only when :func:`check_view` finds nothing wrong: the
metadata names this toolkit, this nvcc (same stat fingerprint) and this curand
dir; the view, its directories, links and files are owned by the current uid
and not writable by group or others; every symlink points (as written) into
the toolkit, the curand include dir or the view itself; the stub is byte for
byte the one recorded.  Anything else is never used: a new view is built under
the next free name (``.1``, ``.2`` ...), so a view that another process may be
using is never deleted or changed.  Builders take a file lock
(``cuda-home/.lock``, :mod:`filelock`), so exactly one process builds and the
others wait and adopt; the builder first removes ``.tmp-<pid>-*`` directories
left by builders that died (``kill -9``).
"""

from __future__ import annotations

import errno
import glob
import hashlib
import json
import logging
import os
import shutil
import stat
import tempfile
import time
from dataclasses import dataclass

import filelock

from . import linkstub
from .cache import cache_root, read_json
from .errors import CudaHomeError, ViewError
from .toolkit import Toolkit
from .toolkit.sources import site_dirs as _site_dirs

logger = logging.getLogger("flashinfer_sm120")

__all__ = [
    "VIEW_LAYOUT", "META_NAME", "LOCK_TIMEOUT_S", "STALE_TMP_S", "CudaHome", "CudaHomeError", "ViewError",
    "ViewMeta", "cache_root", "check_view", "find_curand_include", "linkable_home", "views_dir",
]

#: Bumped whenever the view layout or metadata changes, so old views are not reused.
VIEW_LAYOUT = 2
#: The metadata file in every view.
META_NAME = "flashinfer_sm120_view.json"
#: Seconds a process waits for another to finish building a view (a build
#: takes milliseconds; only a C-compiler fallback for the stub takes longer).
LOCK_TIMEOUT_S = 300.0
#: A ``.tmp-*`` build directory older than this (seconds) is abandoned even if
#: its pid is alive (pid reuse, another PID namespace).
STALE_TMP_S = 300.0
#: Most views kept per toolkit (``name``, ``name.1`` ...) before asking for cleanup.
MAX_VIEW_NAMES = 16
#: What a view may add to its toolkit.
ADDED_ITEMS = ("lib64/libcudart.so", "lib64/stubs/libcuda.so", "include/curand.h")
_STUB = "lib64/stubs/libcuda.so"
_DIRS = ("", "include", "lib64", "lib64/stubs")
_REQUIRED = ("bin/nvcc", "include/cuda_runtime_api.h", "lib64/libcudart.so", _STUB)


@dataclass(frozen=True)
class CudaHome:
    """What ``CUDA_HOME`` is set to for FlashInfer.

    Attributes:
        path: the directory FlashInfer gets as ``CUDA_HOME`` (absolute).
        toolkit_root: the real toolkit behind it.
        is_view: ``True`` when ``path`` is an assembled view of symlinks.
        added: what the view supplies that the toolkit lacks, e.g.
            ``("lib64/libcudart.so", "lib64/stubs/libcuda.so", "include/curand.h")``.
        curand_include: where ``curand.h`` comes from, or ``None`` if nowhere
            (FlashInfer's sampling module will then fail to compile).
    """

    path: str
    toolkit_root: str
    is_view: bool
    added: tuple[str, ...]
    curand_include: str | None

    def to_dict(self) -> dict:
        """JSON-ready form."""
        return {"path": self.path, "toolkit_root": self.toolkit_root, "is_view": self.is_view,
                "added": list(self.added), "curand_include": self.curand_include}


@dataclass(frozen=True)
class ViewMeta:
    """The metadata of a view (``flashinfer_sm120_view.json``).

    Attributes:
        layout: :data:`VIEW_LAYOUT` when written.
        toolkit: the real toolkit root the view's links point into.
        nvcc: real path of that toolkit's nvcc.
        nvcc_full: its full version, e.g. ``"13.0.88"``, or ``None``.
        nvcc_fingerprint: ``(st_dev, st_ino, st_size, st_mtime_ns)`` of ``nvcc``.
        curand_include: directory the ``curand*.h`` links point into, or ``None``.
        added: what the view adds, a subset of :data:`ADDED_ITEMS`.
        stub_sha256: SHA-256 of our ``lib64/stubs/libcuda.so``, or ``None``
            when that entry is a link to the toolkit's own stub.
        owner_uid: the uid that built it.
    """

    layout: int
    toolkit: str
    nvcc: str
    nvcc_full: str | None
    nvcc_fingerprint: tuple[int, ...]
    curand_include: str | None
    added: tuple[str, ...]
    stub_sha256: str | None
    owner_uid: int

    def to_json(self) -> dict:
        """The JSON object written to disk."""
        return {"layout": self.layout, "toolkit": self.toolkit, "nvcc": self.nvcc, "nvcc_full": self.nvcc_full,
                "nvcc_fingerprint": list(self.nvcc_fingerprint), "curand_include": self.curand_include,
                "added": list(self.added), "stub_sha256": self.stub_sha256, "owner_uid": self.owner_uid}

    @classmethod
    def from_json(cls, data: object) -> tuple[ViewMeta | None, str | None]:
        """Validate a decoded metadata object: ``(meta, None)`` or ``(None, what is wrong)``."""
        if not isinstance(data, dict):
            return None, f"is a JSON {type(data).__name__}, not an object"
        types = {"layout": (int,), "toolkit": (str,), "nvcc": (str,), "nvcc_full": (str, type(None)),
                 "nvcc_fingerprint": (list,), "curand_include": (str, type(None)), "added": (list,),
                 "stub_sha256": (str, type(None)), "owner_uid": (int,)}
        if set(data) != set(types):
            return None, f"has keys {sorted(data)}, expected {sorted(types)}"
        for key, ok in types.items():
            if not isinstance(data[key], ok) or isinstance(data[key], bool):
                return None, f"has {key}={data[key]!r} ({type(data[key]).__name__})"
        fp, added = data["nvcc_fingerprint"], data["added"]
        if len(fp) != 4 or not all(isinstance(x, int) and not isinstance(x, bool) for x in fp):
            return None, f"has nvcc_fingerprint={fp!r}, expected 4 integers"
        if not all(isinstance(a, str) and a in ADDED_ITEMS for a in added):
            return None, f"has added={added!r}, expected items of {list(ADDED_ITEMS)}"
        return cls(data["layout"], data["toolkit"], data["nvcc"], data["nvcc_full"], tuple(fp),
                   data["curand_include"], tuple(added), data["stub_sha256"], data["owner_uid"]), None


def find_curand_include(toolkit: Toolkit) -> str | None:
    """Directory holding ``curand.h``: the toolkit's own include dirs first, then
    pip wheels (``nvidia/cu13/include``, ``nvidia/curand/include``) of the same
    CUDA major, then ``/usr/include``.  ``None`` when there is none."""
    dirs = list(toolkit.include_dirs)
    major = toolkit.nvcc_version.major if toolkit.nvcc_version else 13
    for sd in _site_dirs():
        dirs += [os.path.join(sd, "nvidia", f"cu{major}", "include"),
                 os.path.join(sd, "nvidia", "curand", "include")]
    dirs.append("/usr/include")
    for d in dirs:
        if os.path.isfile(os.path.join(d, "curand.h")):
            return d
    return None


def _missing(root: str, curand_inc: str | None) -> list[str]:
    miss = []
    if not os.path.exists(os.path.join(root, "lib64", "libcudart.so")):
        miss.append("lib64/libcudart.so")
    if not os.path.exists(os.path.join(root, "lib64", "stubs", "libcuda.so")):
        miss.append("lib64/stubs/libcuda.so")
    if curand_inc and not os.path.isfile(os.path.join(root, "include", "curand.h")):
        miss.append("include/curand.h")
    return miss


def _fingerprint(path: str) -> tuple[int, ...] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _inside(path: str, roots: list[str]) -> bool:
    return any(r and (path == r or path.startswith(r.rstrip("/") + "/")) for r in roots)


def _owned_problem(path: str, st: os.stat_result, uid: int) -> str | None:
    if st.st_uid != uid:
        return f"{path} is owned by uid {st.st_uid}, not you (uid {uid})"
    if not stat.S_ISLNK(st.st_mode) and st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{path} is writable by other users (mode {stat.filemode(st.st_mode)})"
    return None


def _walk_problem(path: str, meta: ViewMeta, roots: list[str], uid: int) -> str | None:
    """Ownership, entry kinds and link targets of every entry of the view."""
    files = {META_NAME} | ({_STUB} if meta.stub_sha256 else set())
    for rel_dir in _DIRS:
        d = os.path.join(path, rel_dir) if rel_dir else path
        try:
            st = os.lstat(d)
            names = os.listdir(d)
        except OSError as exc:
            return f"{d} cannot be read ({exc.strerror})"
        if not stat.S_ISDIR(st.st_mode):
            return f"{d} is not a directory"
        bad = _owned_problem(d, st, uid)
        if bad:
            return bad
        for name in names:
            rel = f"{rel_dir}/{name}" if rel_dir else name
            entry = os.path.join(d, name)
            try:
                est = os.lstat(entry)
            except OSError as exc:
                return f"{entry} cannot be read ({exc.strerror})"
            bad = _owned_problem(entry, est, uid)
            if bad:
                return bad
            if stat.S_ISLNK(est.st_mode):
                target = os.path.normpath(os.path.join(d, os.readlink(entry)))
                if not _inside(target, roots):
                    return f"{entry} points to {target}, outside the toolkit {meta.toolkit}"
            elif stat.S_ISDIR(est.st_mode) and rel in _DIRS:
                continue
            elif not (stat.S_ISREG(est.st_mode) and rel in files):
                return f"{entry} is not a symlink into the toolkit (unexpected {stat.filemode(est.st_mode)})"
    return None


def check_view(path: str, toolkit: Toolkit, curand_inc: str | None) -> tuple[CudaHome | None, str | None]:
    """Decide whether the view at ``path`` may be adopted for ``toolkit``.

    Args:
        path: the view directory.
        toolkit: the toolkit it must be a view of.
        curand_inc: the curand include dir it must use (:func:`find_curand_include`).

    Returns:
        ``(CudaHome, None)`` when it may be adopted, else ``(None, reason)``
        (``reason`` names the offending file).  Never raises for bad content.
    """
    uid = os.geteuid()
    meta_path = os.path.join(path, META_NAME)
    try:
        st = os.lstat(path)
    except OSError as exc:
        return None, f"{path} cannot be read ({exc.strerror})"
    if not stat.S_ISDIR(st.st_mode):
        return None, f"{path} is not a directory"
    data, problem = read_json(meta_path, max_bytes=64 << 10)
    if data is None:
        return None, problem or f"{meta_path} is missing"
    meta, problem = ViewMeta.from_json(data)
    if meta is None:
        return None, f"{meta_path} {problem}"
    want = {"layout": VIEW_LAYOUT, "toolkit": toolkit.root, "nvcc": toolkit.nvcc,
            "nvcc_fingerprint": _fingerprint(toolkit.nvcc), "curand_include": curand_inc, "owner_uid": uid}
    for key, value in want.items():
        if getattr(meta, key) != value:
            return None, f"{meta_path} has {key}={getattr(meta, key)!r}, this toolkit needs {value!r}"
    roots = [toolkit.root, *toolkit.include_dirs, toolkit.lib_dir or "", curand_inc or "", path]
    problem = _walk_problem(path, meta, roots, uid)
    if problem:
        return None, problem
    for rel in _REQUIRED:
        if not os.path.exists(os.path.join(path, rel)):
            return None, f"{os.path.join(path, rel)} is missing"
    if meta.stub_sha256:
        try:
            with open(os.path.join(path, _STUB), "rb") as fh:
                digest = hashlib.sha256(fh.read(8 << 20)).hexdigest()
        except OSError as exc:
            return None, f"{os.path.join(path, _STUB)} cannot be read ({exc.strerror})"
        if digest != meta.stub_sha256:
            return None, f"{os.path.join(path, _STUB)} was changed after the view was built"
    return CudaHome(path, toolkit.root, True, meta.added, curand_inc), None


# --------------------------------------------------------------------------- building


def _link_entries(src_dir: str, dst_dir: str) -> None:
    for name in sorted(os.listdir(src_dir)):
        dst = os.path.join(dst_dir, name)
        if not os.path.lexists(dst):
            os.symlink(os.path.join(src_dir, name), dst)


def _assemble(tmp: str, toolkit: Toolkit, curand_inc: str | None) -> ViewMeta:
    """Fill the new directory ``tmp`` with the view of ``toolkit``; write its metadata last."""
    root = toolkit.root
    added: list[str] = []
    for name in sorted(os.listdir(root)):
        if name not in ("include", "lib64", "lib", META_NAME):
            os.symlink(os.path.join(root, name), os.path.join(tmp, name))
    inc = os.path.join(tmp, "include")
    os.mkdir(inc, 0o755)
    for d in toolkit.include_dirs:
        _link_entries(d, inc)
    if curand_inc and not os.path.lexists(os.path.join(inc, "curand.h")):
        for path in sorted(glob.glob(os.path.join(curand_inc, "curand*.h"))):
            os.symlink(path, os.path.join(inc, os.path.basename(path)))
        added.append("include/curand.h")
    lib64 = os.path.join(tmp, "lib64")
    os.makedirs(os.path.join(lib64, "stubs"), 0o755)
    if toolkit.lib_dir:
        _link_entries(toolkit.lib_dir, lib64)
    if not os.path.lexists(os.path.join(lib64, "libcudart.so")):
        versioned = sorted(glob.glob(os.path.join(lib64, "libcudart.so.*")))
        if not versioned:
            raise ViewError(
                f"toolkit {root} has no libcudart.so*; install the CUDA runtime "
                f"(pip install 'cuda-toolkit[nvcc,cccl,curand]=={toolkit.nvcc_version}.*')")
        os.symlink(os.path.basename(versioned[0]), os.path.join(lib64, "libcudart.so"))
        added.append("lib64/libcudart.so")
    stub = os.path.join(tmp, _STUB)
    sha = None
    if toolkit.lib_dir and os.path.exists(os.path.join(toolkit.lib_dir, "stubs", "libcuda.so")):
        os.symlink(os.path.join(toolkit.lib_dir, "stubs", "libcuda.so"), stub)
    else:
        cuda_h = next((os.path.join(d, "cuda.h") for d in toolkit.include_dirs
                       if os.path.isfile(os.path.join(d, "cuda.h"))), None)
        sha = linkstub.write_stub(stub, [toolkit.lib_dir] if toolkit.lib_dir else [], cuda_h)
        added.append(_STUB)
    meta = ViewMeta(VIEW_LAYOUT, root, toolkit.nvcc, toolkit.nvcc_full, _fingerprint(toolkit.nvcc) or (),
                    curand_inc, tuple(added), sha, os.geteuid())
    fd = os.open(os.path.join(tmp, META_NAME), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as fh:
        json.dump(meta.to_json(), fh, indent=1)
    return meta


def _io_error(exc: OSError, directory: str, doing: str) -> ViewError:
    """A :class:`ViewError` for an OS error that names the directory and the fix."""
    full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
    return ViewError(
        f"cannot {doing} in {directory}: {exc.strerror or exc}"
        + (" (the disk or your quota is full)" if full else "")
        + (f": free space in {directory} or" if full else ":")
        + " set FLASHINFER_SM120_CACHE_DIR to a writable directory with free space")


def views_dir() -> str:
    """``<cache root>/cuda-home``, created ``0700``; it must be a directory you own
    that others cannot write.

    Raises:
        ViewError: it cannot be created or is not safe (message names the fix).
        flashinfer_sm120.errors.StateFileError: no usable cache root.
    """
    parent = os.path.join(cache_root(), "cuda-home")
    try:
        os.mkdir(parent, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise _io_error(exc, os.path.dirname(parent), "create the CUDA_HOME view directory") from exc
    try:
        st = os.lstat(parent)
    except OSError as exc:
        raise _io_error(exc, parent, "read the CUDA_HOME view directory") from exc
    bad = (f"{parent} is not a directory" if not stat.S_ISDIR(st.st_mode)
           else _owned_problem(parent, st, os.geteuid()))
    if bad:
        raise ViewError(f"not using the CUDA_HOME view directory: {bad}; remove it or set "
                        f"FLASHINFER_SM120_CACHE_DIR to a directory of your own")
    return parent


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # EPERM: exists, another user's
    return True


def _clean_stale(parent: str) -> None:
    """Remove ``.tmp-*`` build dirs of dead builders (call with the lock held).

    A build dir is named ``.tmp-<pid>-<random>``; it is removed when that pid is
    gone or it is older than :data:`STALE_TMP_S`.  Only our own dirs are touched.
    """
    uid, now = os.geteuid(), time.time()
    for name in os.listdir(parent):
        if not name.startswith(".tmp-"):
            continue
        path = os.path.join(parent, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if st.st_uid != uid or not stat.S_ISDIR(st.st_mode):
            continue
        pid = name.split("-")[1] if name.count("-") >= 2 else ""
        dead = pid.isdigit() and int(pid) != os.getpid() and not _pid_alive(int(pid))
        if dead or now - st.st_mtime > STALE_TMP_S:
            logger.debug("removing an abandoned CUDA_HOME view build %s", path)
            shutil.rmtree(path, ignore_errors=True)


def _names(parent: str, base: str) -> list[str]:
    return [os.path.join(parent, base if i == 0 else f"{base}.{i}") for i in range(MAX_VIEW_NAMES)]


def _adopt_existing(parent: str, base: str, toolkit: Toolkit,
                    curand_inc: str | None) -> tuple[CudaHome | None, str | None]:
    """First adoptable view among ``base``, ``base.1`` ...; else ``(None, first free name)``."""
    for path in _names(parent, base):
        if not os.path.lexists(path):
            return None, path
        home, why = check_view(path, toolkit, curand_inc)
        if home is not None:
            return home, None
        logger.info("flashinfer-sm120: not adopting CUDA_HOME view %s: %s", path, why)
    return None, None


def _lock(parent: str) -> filelock.BaseFileLock:
    return filelock.FileLock(os.path.join(parent, ".lock"), timeout=LOCK_TIMEOUT_S, mode=0o600)


def linkable_home(toolkit: Toolkit) -> CudaHome:
    """A ``CUDA_HOME`` for ``toolkit`` that FlashInfer can compile and link against.

    Returns the toolkit root itself when it already has ``lib64/libcudart.so``,
    ``lib64/stubs/libcuda.so`` and ``curand.h``.  Otherwise an existing view that
    passes :func:`check_view`, or, under the ``cuda-home/.lock`` file lock, a
    new one built in ``.tmp-<pid>-*`` and renamed to the first free name.  Safe
    with many processes at once: one builds, the others wait (at most
    :data:`LOCK_TIMEOUT_S` seconds) and adopt the same view.

    Raises:
        ViewError: the cache directory is not writable or full, the toolkit has
            no ``libcudart.so*``, the lock was not obtained in time, or too many
            damaged views exist (each message names the path and the fix).
        flashinfer_sm120.errors.StateFileError: no usable cache root.
    """
    curand_inc = find_curand_include(toolkit)
    if not _missing(toolkit.root, curand_inc):
        return CudaHome(toolkit.root, toolkit.root, False, (), curand_inc)
    key = hashlib.sha256(json.dumps([VIEW_LAYOUT, toolkit.root, toolkit.nvcc, _fingerprint(toolkit.nvcc),
                                     curand_inc]).encode()).hexdigest()[:12]
    version = "".join(c if c.isalnum() or c == "." else "_" for c in (toolkit.nvcc_full or "x"))
    base = f"cuda-{version}-{key}"
    parent = views_dir()
    home, _ = _adopt_existing(parent, base, toolkit, curand_inc)  # fast path: views never change
    if home is not None:
        if any(n.startswith(".tmp-") for n in os.listdir(parent)):
            _clean_if_free(parent)
        return home
    try:
        with _lock(parent):
            return _build_locked(parent, base, toolkit, curand_inc)
    except filelock.Timeout as exc:
        raise ViewError(f"waited {LOCK_TIMEOUT_S:.0f} s for another process building a CUDA_HOME view "
                        f"(lock {exc.lock_file}); if none is running, remove that file") from exc
    except OSError as exc:  # the lock file itself (disk full, read-only)
        raise _io_error(exc, parent, "take the CUDA_HOME view lock") from exc


def _clean_if_free(parent: str) -> None:
    try:
        with filelock.FileLock(os.path.join(parent, ".lock"), timeout=0, mode=0o600):
            _clean_stale(parent)
    except (filelock.Timeout, OSError):
        pass  # someone is building: they clean up


def _build_locked(parent: str, base: str, toolkit: Toolkit, curand_inc: str | None) -> CudaHome:
    _clean_stale(parent)
    home, free = _adopt_existing(parent, base, toolkit, curand_inc)
    if home is not None:
        return home
    if free is None:
        raise ViewError(f"{MAX_VIEW_NAMES} damaged CUDA_HOME views {os.path.join(parent, base)}*: remove them "
                        f"(rm -r {os.path.join(parent, base)}*) when no process uses them")
    try:
        tmp = tempfile.mkdtemp(prefix=f".tmp-{os.getpid()}-", dir=parent)
    except OSError as exc:
        raise _io_error(exc, parent, "create the CUDA_HOME view") from exc
    try:
        os.chmod(tmp, 0o755)
        meta = _assemble(tmp, toolkit, curand_inc)
        os.rename(tmp, free)  # free does not exist, and only lock holders create views
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise _io_error(exc, parent, "build the CUDA_HOME view") from exc
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    logger.info("flashinfer-sm120: assembled CUDA_HOME view %s for %s (added: %s)", free, toolkit.root,
                ", ".join(meta.added) or "nothing")
    return CudaHome(free, toolkit.root, True, meta.added, curand_inc)
