"""Find every CUDA toolkit on the machine, read its versions, and choose one.

FlashInfer's own lookup (``flashinfer/jit/cpp_ext.py``, ``get_cuda_path``) takes
``CUDA_HOME``, else ``CUDA_PATH``, else ``dirname(dirname(which nvcc))``, else
``/usr/local/cuda``, and asks that nvcc for its version.  It never looks at the
CUDA 13 nvcc that pip installs into ``site-packages/nvidia/cu13``, and a wrapper
script at ``/usr/local/bin/nvcc`` makes it pick ``/usr/local``.  Here every
candidate is gathered, its version is what its nvcc says (``nvcc --version``, with a
timeout, remembered per binary; a version file that disagrees is a finding), each is checked against
the targets wanted, and the first acceptable one in a fixed order of sources
wins.  The result says where it came from and why the others were rejected.

- :mod:`.sources`     the find steps, in preference order; :mod:`.candidates` runs them, one entry per nvcc
- :mod:`.probe`       a toolkit's versions (``nvcc --version``), remembered per binary in :mod:`.memo`
- :mod:`.model`       what a toolkit and a choice are (data only)
- :mod:`.policy`      the choice, and why the others lost; :mod:`.fixes` every fix line about toolkits
- :mod:`.naive`       what FlashInfer (and the servers) would find without us, and torch's CUDA
- :mod:`.ninja`       the ninja of the process
"""

from __future__ import annotations

from flashinfer_sm120.errors import ToolkitError
from flashinfer_sm120.core.toolkit.model import Choice, RejectKind, Rejection, Toolkit, VersionDisagreement
from flashinfer_sm120.core.toolkit.policy import choose
from flashinfer_sm120.core.toolkit.probe import FAILURE_MEMORY_S, NVCC_TIMEOUT_S, inspect
from flashinfer_sm120.core.toolkit.candidates import Candidates, discover
from flashinfer_sm120.core.toolkit.naive import flashinfer_naive_root, torch_cuda_version
from flashinfer_sm120.core.toolkit.sources import FIND_STEPS, SOURCES
from flashinfer_sm120.safety.trust import check_executable, trace

__all__ = [
    "NVCC_TIMEOUT_S", "FAILURE_MEMORY_S", "SOURCES", "Toolkit", "Choice", "RejectKind", "Rejection",
    "ToolkitError", "VersionDisagreement",
    "Candidates", "discover", "choose", "inspect", "flashinfer_naive_root",
    "check_executable", "trace", "FIND_STEPS",
    "torch_cuda_version",
]
