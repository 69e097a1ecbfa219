"""flashinfer-sm120: make FlashInfer's JIT kernels build on Blackwell (SM120/SM121) with the right nvcc and
targets.  ``import flashinfer_sm120`` registers import hooks that patch FlashInfer whenever it is imported;
importing never raises (problems go to the ``flashinfer_sm120`` logger and ``doctor``).  docs/using.md."""

from __future__ import annotations

import logging
import os as _os

__version__ = "0.3.0"

__all__ = ["install", "revert", "status", "resolve", "__version__"]


class _BoundedRecords(logging.Filter):
    """Cuts every record of our logger with :func:`~flashinfer_sm120.safety.formats.base.bounded` (P6: messages
    quote environment values and paths of any size); never raises, never drops a record."""

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
    _LOGGER.error("%s", _LOAD_ERROR)

    def status() -> dict:  # type: ignore[misc]
        """Where patching stands: ``failed``, with the load error."""
        return {"mode": "failed", "error": _LOAD_ERROR, "summary": _LOAD_ERROR, "patched_modules": [],
                "steps": {}, "resolution": None, "target_cuda_archs": None, "exported": {}}

    install = revert = status  # type: ignore[assignment]

    def resolve(*args, **kwargs):  # type: ignore[misc]
        """Raises :class:`~flashinfer_sm120.errors.Sm120Error` with the load error."""
        from flashinfer_sm120.errors import Sm120Error

        raise Sm120Error(_LOAD_ERROR)
else:
    try:
        install()
    except Exception as _exc:  # pragma: no cover - install() guards itself; importing must never raise
        _LOGGER.error("flashinfer-sm120: install failed: %r", _exc)

# record JIT modules when FLASHINFER_SM120_RECORD is set; a process that does not record never loads the recorder
if _os.environ.get("FLASHINFER_SM120_RECORD", "").strip():
    try:
        from flashinfer_sm120.core.jitenv.record import install_if_enabled as _record_if_enabled

        _record_if_enabled()
    except Exception as _exc:  # pragma: no cover - install_if_enabled never raises
        _LOGGER.error("flashinfer-sm120: recorder failed: %r", _exc)
