"""A ``CUDA_HOME`` that FlashInfer's generated ninja files can compile and link with.

FlashInfer's ``generate_ninja_build_for_op`` (``flashinfer/jit/cpp_ext.py``,
0.6.7 - 0.7.4) compiles with ``$cuda_home/bin/nvcc`` and ``-isystem
$cuda_home/include`` and links with ``-L$cuda_home/lib64
-L$cuda_home/lib64/stubs -lcudart -lcuda``.  The CUDA 13 pip wheels
(``site-packages/nvidia/cu13``) have ``lib/`` (no ``lib64``), only
``libcudart.so.13`` (no unversioned ``libcudart.so``), no ``stubs/libcuda.so``,
and keep ``curand.h`` only if ``nvidia-curand`` is installed (FlashInfer's
sampling kernels include it).  A system toolkit may lack curand too.

When the chosen toolkit lacks any of these, we assemble a *view*: a directory of
symlinks into the real toolkit, plus the missing pieces (``libcudart.so`` link,
a ``libcuda.so`` link stub with ``SONAME libcuda.so.1`` built by the host C
compiler, curand headers from a pip wheel), under the user cache directory.  The
real ``libcuda.so.1`` comes from the driver at load time, as with NVIDIA's own
``lib64/stubs/libcuda.so``.
"""

from __future__ import annotations

import glob
import hashlib
import json
import logging
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass

from .cache import cache_root
from .errors import CudaHomeError
from .toolkit import Toolkit, is_trusted
from .toolkit.sources import site_dirs as _site_dirs

logger = logging.getLogger("flashinfer_sm120")

__all__ = ["CudaHome", "CudaHomeError", "cache_root", "find_curand_include", "linkable_home"]

#: Bumped whenever the view layout changes, so old views are not reused.
VIEW_LAYOUT = 1


@dataclass(frozen=True)
class CudaHome:
    """What ``CUDA_HOME`` is set to for FlashInfer.

    Attributes:
        path: the directory FlashInfer gets as ``CUDA_HOME``.
        toolkit_root: the real toolkit behind it.
        is_view: ``True`` when ``path`` is an assembled view of symlinks.
        added: what the view supplies that the toolkit lacks, e.g.
            ``("lib64", "lib64/stubs/libcuda.so", "include/curand.h")``.
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
        return {
            "path": self.path,
            "toolkit_root": self.toolkit_root,
            "is_view": self.is_view,
            "added": list(self.added),
            "curand_include": self.curand_include,
        }


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
    if not glob.glob(os.path.join(root, "lib64", "libcudart.so")):
        miss.append("lib64/libcudart.so")
    if not os.path.exists(os.path.join(root, "lib64", "stubs", "libcuda.so")):
        miss.append("lib64/stubs/libcuda.so")
    if curand_inc and not os.path.isfile(os.path.join(root, "include", "curand.h")):
        miss.append("include/curand.h")
    return miss


def _build_stub(dest: str) -> None:
    """Build an empty shared library with ``SONAME libcuda.so.1`` at ``dest``."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise CudaHomeError(
            "no C compiler (cc/gcc, or $CC) to build the libcuda.so link stub; "
            "install gcc (FlashInfer's JIT needs a host compiler anyway)"
        )
    cc_path = shutil.which(cc) or cc
    bad = is_trusted(cc_path)
    if bad:
        raise CudaHomeError(f"not running C compiler {cc_path}: {bad}")
    src = dest + ".c"
    with open(src, "w") as fh:
        fh.write("/* link stub for -lcuda; the driver's libcuda.so.1 is used at run time */\n")
    try:
        proc = subprocess.run(
            [cc_path, "-shared", "-nostdlib", "-Wl,-soname,libcuda.so.1", "-o", dest, src],
            capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CudaHomeError(f"building the libcuda.so link stub with {cc_path} failed: {exc}") from exc
    finally:
        try:
            os.unlink(src)
        except OSError:
            pass
    if proc.returncode != 0:
        raise CudaHomeError(
            f"building the libcuda.so link stub with {cc_path} failed "
            f"(exit {proc.returncode}): {proc.stderr.strip()[:400]}"
        )


def _link_entries(src_dir: str, dst_dir: str) -> None:
    for name in sorted(os.listdir(src_dir)):
        dst = os.path.join(dst_dir, name)
        if not os.path.lexists(dst):
            os.symlink(os.path.join(src_dir, name), dst)


def _assemble(tmp: str, toolkit: Toolkit, curand_inc: str | None) -> list[str]:
    root = toolkit.root
    added: list[str] = []
    for name in sorted(os.listdir(root)):
        if name in ("include", "lib64", "lib"):
            continue
        os.symlink(os.path.join(root, name), os.path.join(tmp, name))
    inc = os.path.join(tmp, "include")
    os.mkdir(inc)
    for d in toolkit.include_dirs:
        _link_entries(d, inc)
    if curand_inc and not os.path.lexists(os.path.join(inc, "curand.h")):
        for path in sorted(glob.glob(os.path.join(curand_inc, "curand*.h"))):
            os.symlink(path, os.path.join(inc, os.path.basename(path)))
        added.append("include/curand.h")
    lib64 = os.path.join(tmp, "lib64")
    os.makedirs(os.path.join(lib64, "stubs"))
    if toolkit.lib_dir:
        _link_entries(toolkit.lib_dir, lib64)
    if not os.path.lexists(os.path.join(lib64, "libcudart.so")):
        versioned = sorted(glob.glob(os.path.join(lib64, "libcudart.so.*")))
        if not versioned:
            raise CudaHomeError(
                f"toolkit {root} has no libcudart.so*; install the CUDA runtime "
                f"(pip install 'cuda-toolkit[nvcc,cccl,curand]=={toolkit.nvcc_version}.*')"
            )
        os.symlink(os.path.basename(versioned[0]), os.path.join(lib64, "libcudart.so"))
        added.append("lib64/libcudart.so")
    stub = os.path.join(lib64, "stubs", "libcuda.so")
    if not os.path.lexists(stub):
        real_stub = os.path.join(toolkit.lib_dir or "", "stubs", "libcuda.so")
        if toolkit.lib_dir and os.path.exists(real_stub):
            os.symlink(real_stub, stub)
        else:
            _build_stub(stub)
            added.append("lib64/stubs/libcuda.so")
    with open(os.path.join(tmp, "flashinfer_sm120_view.json"), "w") as fh:
        json.dump({"layout": VIEW_LAYOUT, "toolkit": root, "nvcc": toolkit.nvcc_full,
                   "curand_include": curand_inc, "added": added}, fh, indent=1)
    return added


def _view_ok(path: str) -> bool:
    try:
        with open(os.path.join(path, "flashinfer_sm120_view.json")) as fh:
            meta = json.load(fh)
    except (OSError, ValueError):
        return False
    return meta.get("layout") == VIEW_LAYOUT and all(
        os.path.exists(os.path.join(path, p))
        for p in ("bin/nvcc", "include/cuda_runtime_api.h", "lib64/libcudart.so", "lib64/stubs/libcuda.so")
    )


def linkable_home(toolkit: Toolkit) -> CudaHome:
    """A ``CUDA_HOME`` for ``toolkit`` that FlashInfer can compile and link against.

    Returns the toolkit root itself when it already has ``lib64/libcudart.so``,
    ``lib64/stubs/libcuda.so`` and ``curand.h``; otherwise a view under
    :func:`cache_root` named by a hash of the toolkit, built atomically (in a
    temporary directory, then renamed), and reused while intact.

    Raises:
        CudaHomeError: the cache directory is not writable, the toolkit has no
            ``libcudart.so*``, or no C compiler can build the ``libcuda.so`` stub.
    """
    curand_inc = find_curand_include(toolkit)
    if not _missing(toolkit.root, curand_inc):
        return CudaHome(toolkit.root, toolkit.root, False, (), curand_inc)
    key = hashlib.sha256(
        json.dumps([VIEW_LAYOUT, toolkit.root, toolkit.nvcc_full, curand_inc]).encode()
    ).hexdigest()[:12]
    parent = os.path.join(cache_root(), "cuda-home")
    path = os.path.join(parent, f"cuda-{toolkit.nvcc_full or 'x'}-{key}")
    if _view_ok(path):
        with open(os.path.join(path, "flashinfer_sm120_view.json")) as fh:
            added = tuple(json.load(fh).get("added", ()))
        return CudaHome(path, toolkit.root, True, added, curand_inc)
    try:
        os.makedirs(parent, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=".tmp-", dir=parent)
    except OSError as exc:
        raise CudaHomeError(
            f"cannot create the CUDA_HOME view under {parent}: {exc.strerror}; set "
            f"FLASHINFER_SM120_CACHE_DIR to a writable directory"
        ) from exc
    try:
        os.chmod(tmp, 0o755)
        added = _assemble(tmp, toolkit, curand_inc)
        if os.path.lexists(path):  # a broken older view: move it aside first
            shutil.rmtree(path, ignore_errors=True)
        try:
            os.rename(tmp, path)
        except OSError:
            if not _view_ok(path):  # someone else won the race with a good view, else fail
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    logger.info("assembled CUDA_HOME view %s for %s (added: %s)", path, toolkit.root,
                ", ".join(added) or "nothing")
    return CudaHome(path, toolkit.root, True, tuple(added), curand_inc)
