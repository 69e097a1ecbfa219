"""flashinfer-sm120: make FlashInfer's JIT kernels build on Blackwell (SM120/SM121)
and wherever FlashInfer's CUDA toolkit and architecture detection goes wrong.

``import flashinfer_sm120`` registers import hooks; when FlashInfer is imported
(before or after), it is patched to use the right nvcc (pip CUDA 13 nvcc or a
system toolkit) and the right ``TARGET_CUDA_ARCHS``.  Importing never raises,
not even when a dependency (wrapt, packaging, nvidia-ml-py) is missing or
broken: problems are logged to the ``flashinfer_sm120`` logger and shown by
``flashinfer-sm120 doctor``.  Set ``FLASHINFER_SM120_DISABLE=1`` to turn it off.

When it changes the toolkit FlashInfer would have used, it says so once per
process as a WARNING on the ``flashinfer_sm120`` logger (printed to stderr when
the application configured no logging); ``FLASHINFER_SM120_QUIET=1`` makes that
line INFO.
"""

from __future__ import annotations

import logging
import os as _os

__version__ = "0.3.0"

__all__ = ["install", "revert", "status", "resolve", "__version__"]


class _BoundedRecords(logging.Filter):
    """Every record of the ``flashinfer_sm120`` logger is cut to a bounded size
    (:func:`flashinfer_sm120.safety.formats.base.bounded`: a run of over 1024 non-blank characters to its first
    80 and its length): messages quote environment values and paths, and a 100,000-character
    ``FLASHINFER_SM120_CACHE_DIR`` came back whole in the warning every ``import flashinfer`` printed.
    Never raises, never drops a record."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            from flashinfer_sm120.safety.formats.base import bounded

            msg = record.getMessage()
            cut = bounded(msg, max_len=16384)
            if cut != msg:
                record.msg, record.args = cut, None
        except Exception:
            pass
        return True


_LOGGER = logging.getLogger("flashinfer_sm120")
if not any(type(f).__name__ == "_BoundedRecords" for f in _LOGGER.filters):  # once, even when re-imported
    _LOGGER.addFilter(_BoundedRecords())

try:
    from flashinfer_sm120.core.patch import install, resolve, revert, status
except Exception as _exc:  # a missing or broken dependency: log once, do nothing else
    from flashinfer_sm120.core.facts.reinstall import fix_for as _fix_for

    _missing = getattr(_exc, "name", None) or type(_exc).__name__
    _LOAD_ERROR = (f"flashinfer-sm120 cannot load ({_missing!s}: {_exc}); FlashInfer is left alone. "
                   f"Fix: {_fix_for(_exc)}")
    logging.getLogger("flashinfer_sm120").error("%s", _LOAD_ERROR)

    def status() -> dict:  # type: ignore[misc]
        """Where patching stands: ``failed``, with the load error."""
        return {"mode": "failed", "error": _LOAD_ERROR, "summary": _LOAD_ERROR, "patched_modules": [],
                "steps": {}, "resolution": None, "target_cuda_archs": None, "exported": {}}

    def install() -> dict:  # type: ignore[misc]
        """Does nothing (the package could not load); returns :func:`status`."""
        return status()

    revert = install

    def resolve(*args, **kwargs):  # type: ignore[misc]
        """Raises :class:`~flashinfer_sm120.errors.Sm120Error` with the load error."""
        from flashinfer_sm120.errors import Sm120Error

        raise Sm120Error(_LOAD_ERROR)
else:
    try:
        install()
    except Exception as _exc:  # pragma: no cover - install() already guards; belt and braces
        logging.getLogger("flashinfer_sm120").error("flashinfer-sm120: install failed: %r", _exc)

# warm-up builds: record JIT modules when FLASHINFER_SM120_RECORD is set (never raises); a process
# that does not record never loads the recorder
if _os.environ.get("FLASHINFER_SM120_RECORD", "").strip():
    try:
        from flashinfer_sm120.core.jitenv.record import install_if_enabled as _record_if_enabled

        _record_if_enabled()
    except Exception as _exc:  # pragma: no cover - belt and braces
        logging.getLogger("flashinfer_sm120").error("flashinfer-sm120: recorder failed: %r", _exc)
