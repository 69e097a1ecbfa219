"""Building views (:func:`linkable_home`): under ``cuda-home/.lock``, in a private ``.tmp-*``, renamed to the first
free name (P5), at ``<cache root>/cuda-home/cuda-<nvcc version>-<key>[.N]``."""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import logging
import os
import stat

import filelock

from flashinfer_sm120.safety import oserrors
from flashinfer_sm120.safety.fs.atomic import make_private, sweep, write_atomic
from flashinfer_sm120.safety.fs.statedir import cache_root, path_problem
from flashinfer_sm120.safety.ownership import fingerprint, mine_problem
from flashinfer_sm120.core.toolkit.fixes import consistent_set_fix
from flashinfer_sm120.core.toolkit.model import CudaHome, Toolkit
from flashinfer_sm120.core.toolkit.sources import site_dirs
from flashinfer_sm120.core.view.meta import DIRS, META_NAME, STUB, VIEW_LAYOUT, check_view, lacks, want_meta
from flashinfer_sm120.errors import PlaceError, ViewError

logger = logging.getLogger("flashinfer_sm120")

#: Seconds a process waits for another to finish building a view (a build takes milliseconds).
LOCK_TIMEOUT_S = 90.0
#: Views are assembled in ``.tmp-*`` (:func:`flashinfer_sm120.safety.fs.atomic.make_private`).
_TMP_PREFIX = ".tmp-"
#: Most views kept per toolkit (``name``, ``name.1`` ...) before asking for cleanup.
MAX_VIEW_NAMES = 16


def find_curand_include(toolkit: Toolkit) -> str | None:
    """Directory holding ``curand.h``: the toolkit's, the same major's pip wheels', ``/usr/include``'s, or ``None``."""
    dirs = list(toolkit.include_dirs)
    major = toolkit.nvcc_version.major if toolkit.nvcc_version else 13
    for sd in site_dirs():
        dirs += [os.path.join(sd, "nvidia", f"cu{major}", "include"),
                 os.path.join(sd, "nvidia", "curand", "include")]
    return next((d for d in dirs + ["/usr/include"] if os.path.isfile(os.path.join(d, "curand.h"))), None)


def _link_entries(src_dir: str, dst_dir: str, names: list[str] | None = None) -> None:
    for name in sorted(os.listdir(src_dir) if names is None else names):  # names of a directory: never '..'
        if not os.path.lexists(os.path.join(dst_dir, name)):
            os.symlink(os.path.join(src_dir, name), os.path.join(dst_dir, name))


def _assemble(tmp: str, toolkit: Toolkit, curand_inc: str | None) -> tuple[str, ...]:
    """Fill ``tmp`` with the view: real :data:`DIRS`, links into the toolkit, what it lacks, its metadata last."""
    root = toolkit.root
    added: list[str] = []
    inc, lib64 = os.path.join(tmp, "include"), os.path.join(tmp, "lib64")
    for rel in DIRS[1:]:
        os.mkdir(os.path.join(tmp, rel))
        os.chmod(os.path.join(tmp, rel), 0o755)  # whatever the umask (002 is common)
    _link_entries(root, tmp, [n for n in os.listdir(root) if n not in ("include", "lib64", "lib", META_NAME)])
    for d in toolkit.include_dirs:
        _link_entries(d, inc)
    if curand_inc and not os.path.lexists(os.path.join(inc, "curand.h")):
        _link_entries(curand_inc, inc, [os.path.basename(p) for p in glob.glob(os.path.join(curand_inc, "curand*.h"))])
        added.append("include/curand.h")
    if toolkit.lib_dir:
        _link_entries(toolkit.lib_dir, lib64)
    cudart = os.path.join(lib64, "libcudart.so")
    if os.path.lexists(cudart) and not os.path.isfile(cudart):
        os.unlink(cudart)  # our link to the toolkit's FIFO, device or link loop: never handed to ld
    if not os.path.lexists(cudart):
        versioned = sorted(p for p in glob.glob(os.path.join(lib64, "libcudart.so.*")) if os.path.isfile(p))
        if not versioned:
            fix = (consistent_set_fix(toolkit.nvcc_version, "pip" in toolkit.sources) if toolkit.nvcc_version
                   else "set CUDA_HOME to a complete toolkit")
            raise ViewError(f"toolkit {root} has no libcudart.so* that is a regular file (the CUDA runtime "
                            f"FlashInfer links with -lcudart; a FIFO, device or link loop would hang or fail "
                            f"the link). Fix: {fix}")
        os.symlink(os.path.basename(versioned[0]), os.path.join(lib64, "libcudart.so"))
        added.append("lib64/libcudart.so")
    stub = os.path.join(tmp, STUB)
    sha = None
    if toolkit.lib_dir and os.path.isfile(os.path.join(toolkit.lib_dir, "stubs", "libcuda.so")):
        os.symlink(os.path.join(toolkit.lib_dir, "stubs", "libcuda.so"), stub)
    else:
        cuda_h = next((os.path.join(d, "cuda.h") for d in toolkit.include_dirs
                       if os.path.isfile(os.path.join(d, "cuda.h"))), None)
        from flashinfer_sm120.core.view.stub import write_stub  # building a view only

        sha = write_stub(stub, [toolkit.lib_dir] if toolkit.lib_dir else [], cuda_h)
        os.chmod(stub, 0o644)  # a compiler (the fallback) writes it with the umask's mode
        added.append(STUB)
    meta = dict(want_meta(toolkit, curand_inc), added=added, stub_sha256=sha)
    write_atomic(os.path.join(tmp, META_NAME), json.dumps(meta, indent=1).encode(), mode=0o644)
    return tuple(added)


def _io_error(exc: OSError, directory: str, doing: str) -> ViewError:
    problem = oserrors.describe(exc, directory, "set FLASHINFER_SM120_CACHE_DIR to a directory of your own")
    return ViewError(f"cannot {doing} in {directory}: {problem}")


def views_dir() -> str:
    """``<cache root>/cuda-home``, created ``0700``, yours and not writable by others, else :class:`ViewError`."""
    parent = os.path.join(cache_root(), "cuda-home")
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(parent, 0o700)
        st = os.lstat(parent)
    except OSError as exc:
        raise _io_error(exc, parent, "create the CUDA_HOME view directory") from exc
    bad = (f"{parent} is not a directory" if not stat.S_ISDIR(st.st_mode)
           else mine_problem(parent, st))
    if bad:
        raise ViewError(f"not using the CUDA_HOME view directory: {bad}; remove it or set "
                        f"FLASHINFER_SM120_CACHE_DIR to a directory of your own")
    return parent


def _adopt_existing(parent: str, base: str, toolkit: Toolkit,
                    curand_inc: str | None) -> tuple[CudaHome | None, str | None]:
    """First adoptable view among ``base``, ``base.1`` ...; else ``(None, first free name)``."""
    for path in (os.path.join(parent, f"{base}.{i}" if i else base) for i in range(MAX_VIEW_NAMES)):
        if not os.path.lexists(path):
            return None, path
        home, why = check_view(path, toolkit, curand_inc)
        if home is not None:
            return home, None
        logger.info("flashinfer-sm120: not adopting CUDA_HOME view %s: %s", path, why)
    return None, None


def _link_new_headers(parent: str, path: str, toolkit: Toolkit) -> None:
    """Link headers the toolkit gained since (``cuda-toolkit[cublas]``): a new view would rebuild every module."""
    inc = os.path.join(path, "include")
    try:
        have = set(os.listdir(inc))
        if all(n in have for d in toolkit.include_dirs for n in os.listdir(d)):
            return
        with _lock(parent):
            for d in toolkit.include_dirs:
                _link_entries(d, inc)
    except (OSError, filelock.Timeout) as exc:
        logger.debug("flashinfer-sm120: could not add new headers to %s: %r", path, exc)


def _lock(parent: str) -> filelock.BaseFileLock:
    return filelock.FileLock(os.path.join(parent, ".lock"), timeout=LOCK_TIMEOUT_S, mode=0o600)


def linkable_home(toolkit: Toolkit) -> CudaHome:
    """The toolkit's root when complete and safe unquoted in ``build.ninja``, else a view; :class:`ViewError` names
    the path and the fix."""
    curand_inc = find_curand_include(toolkit)
    unsafe = path_problem(toolkit.root, "the toolkit path")
    missing = [rel for rel in lacks(toolkit.root) if curand_inc or rel != "include/curand.h"]
    if not missing and unsafe is None:
        return CudaHome(toolkit.root, toolkit.root, False, (), curand_inc)
    if unsafe:  # FlashInfer writes cuda_home unquoted into build.ninja: hand it a view instead
        logger.info("flashinfer-sm120: %s; using a CUDA_HOME view under the cache directory instead", unsafe)
    key = hashlib.sha256(json.dumps([VIEW_LAYOUT, toolkit.root, toolkit.nvcc, fingerprint(toolkit.nvcc),
                                     curand_inc]).encode()).hexdigest()[:12]
    version = toolkit.nvcc_full or "x"  # the canonical form of a parsed Version (Toolkit guarantees it)
    base = f"cuda-{version}-{key}"
    parent = views_dir()
    home, _ = _adopt_existing(parent, base, toolkit, curand_inc)  # fast path: views never change
    if home is not None:
        sweep(_TMP_PREFIX, parent)  # what builders killed mid-build left
        _link_new_headers(parent, home.path, toolkit)
        return home
    try:
        with _lock(parent):
            return _build_locked(parent, base, toolkit, curand_inc)
    except filelock.Timeout as exc:
        raise ViewError(f"waited {LOCK_TIMEOUT_S:.0f} s for another process building a CUDA_HOME view "
                        f"(lock {exc.lock_file}); if none is running, remove that file") from exc
    except OSError as exc:  # the lock file itself (disk full, read-only)
        raise _io_error(exc, parent, "take the CUDA_HOME view lock") from exc


def _build_locked(parent: str, base: str, toolkit: Toolkit, curand_inc: str | None) -> CudaHome:
    home, free = _adopt_existing(parent, base, toolkit, curand_inc)
    if home is not None:
        return home
    if free is None:
        raise ViewError(f"{MAX_VIEW_NAMES} damaged CUDA_HOME views {os.path.join(parent, base)}*: remove them "
                        f"(rm -r {os.path.join(parent, base)}*) when no process uses them")
    try:
        made = make_private(_TMP_PREFIX, parent)  # after sweeping what killed builders left
    except PlaceError as exc:
        raise ViewError(str(exc)) from exc
    except OSError as exc:
        raise _io_error(exc, parent, "create the CUDA_HOME view") from exc
    tmp = made.path
    try:
        os.chmod(tmp, 0o755)
        added = _assemble(tmp, toolkit, curand_inc)
        os.rename(tmp, free)  # threat-model: P3: onto a free name (only lock holders create views here)
    except OSError as exc:
        raise _io_error(exc, parent, "build the CUDA_HOME view") from exc
    finally:
        made.close()  # removes it unless renamed into place
    logger.info("flashinfer-sm120: assembled CUDA_HOME view %s for %s (added: %s)", free, toolkit.root,
                ", ".join(added) or "nothing")
    return CudaHome(free, toolkit.root, True, added, curand_inc)
