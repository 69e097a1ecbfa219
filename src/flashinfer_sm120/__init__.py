"""flashinfer-sm120: make FlashInfer's JIT kernels build on Blackwell (SM120/SM121) with the right nvcc and
targets.  ``import flashinfer_sm120`` registers import hooks that patch FlashInfer whenever it is imported;
importing never raises (problems go to the ``flashinfer_sm120`` logger and ``doctor``).  docs/using.md."""

from __future__ import annotations

import contextlib
import logging
import os as _os

__version__ = "0.3.0"

__all__ = ["install", "revert", "status", "resolve", "worker_setup", "__version__"]


class _BoundedRecords(logging.Filter):
    """Cuts every record of our logger with :func:`~flashinfer_sm120.safety.formats.base.bounded` (P6: messages
    quote environment values and paths of any size); never raises, never drops a record."""

    def filter(self, record: logging.LogRecord) -> bool:
        with contextlib.suppress(Exception):
            from flashinfer_sm120.safety.formats.base import bounded

            msg = record.getMessage()
            cut = bounded(msg, max_len=16384)
            if cut != msg:
                record.msg, record.args = cut, None
        return True


_LOGGER = logging.getLogger("flashinfer_sm120")
if not any(type(f).__name__ == "_BoundedRecords" for f in _LOGGER.filters):  # once, even when re-imported
    _LOGGER.addFilter(_BoundedRecords())

try:
    from flashinfer_sm120.core.patch import install, revert, status
except Exception as _exc:  # a missing or broken dependency: log once, do nothing else
    from flashinfer_sm120.core.facts.reinstall import unloadable

    install, revert, status, resolve = unloadable(_exc, _LOGGER)
else:
    try:
        install()
    except Exception as _exc:  # pragma: no cover - install() guards itself; importing must never raise
        _LOGGER.error("flashinfer-sm120: install failed: %r", _exc)


def __getattr__(name: str):
    """``resolve`` (:func:`.core.patch.decide.resolve`) and ``worker_setup`` (:func:`.core.early.worker_setup`),
    loaded when used: a later process replays and needs neither."""
    if name == "resolve":
        from flashinfer_sm120.core.patch.decide import resolve

        return resolve
    if name == "worker_setup":
        from flashinfer_sm120.core.early import worker_setup

        return worker_setup
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# record JIT modules when FLASHINFER_SM120_RECORD is set; a process that does not record never loads the recorder
if _os.environ.get("FLASHINFER_SM120_RECORD", "").strip():
    try:
        from flashinfer_sm120.core.jitenv.record import install_if_enabled as _record_if_enabled

        _record_if_enabled()
    except Exception as _exc:  # pragma: no cover - install_if_enabled never raises
        _LOGGER.error("flashinfer-sm120: recorder failed: %r", _exc)
