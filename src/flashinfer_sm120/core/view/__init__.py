"""The ``CUDA_HOME`` view: a directory FlashInfer's generated ninja files can compile and link with.

FlashInfer's ``generate_ninja_build_for_op`` (``flashinfer/jit/cpp_ext.py``,
0.6.7 - 0.7.4) compiles with ``$cuda_home/bin/nvcc`` and ``-isystem
$cuda_home/include`` and links with ``-L$cuda_home/lib64
-L$cuda_home/lib64/stubs -lcudart -lcuda``.  The CUDA 13 pip wheels
(``site-packages/nvidia/cu13``) have ``lib/`` (no ``lib64``), only
``libcudart.so.13`` (no unversioned ``libcudart.so``), no ``stubs/libcuda.so``,
and keep ``curand.h`` only if ``nvidia-curand`` is installed (FlashInfer's
sampling kernels include it).  A system toolkit may lack curand too.

When the chosen toolkit lacks any of these, or its path holds characters
FlashInfer's unquoted ``cuda_home = ...`` ninja line cannot carry (a space), a
*view* is assembled: a directory
of symlinks into the real toolkit plus the missing pieces (``libcudart.so``
link, the ``libcuda.so`` link stub of :mod:`flashinfer_sm120.core.view.stub`, curand
headers from a pip wheel) under ``<cache root>/cuda-home/``.

The view format lives in :mod:`.meta` (building in :mod:`.build`, the stub in :mod:`.stub`):

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
others wait and adopt; ``.tmp-*`` directories left by builders that died (``kill -9``) are
swept by the next (:func:`flashinfer_sm120.safety.fs.atomic.sweep`: only those no live builder holds).
"""

from __future__ import annotations

from flashinfer_sm120.safety.fs.statedir import cache_root
from flashinfer_sm120.errors import ViewError
from flashinfer_sm120.core.view.build import LOCK_TIMEOUT_S, MAX_VIEW_NAMES, find_curand_include, linkable_home, views_dir
from flashinfer_sm120.core.view.meta import META_NAME, VIEW_LAYOUT, CudaHome, ViewMeta, check_view

__all__ = [
    "VIEW_LAYOUT", "META_NAME", "LOCK_TIMEOUT_S", "MAX_VIEW_NAMES", "CudaHome",
    "ViewError", "ViewMeta", "cache_root", "check_view", "find_curand_include", "linkable_home", "views_dir",
]
