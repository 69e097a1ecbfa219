"""The one JSON document ``build --json`` prints for every outcome, built, failed or refused.

Imports nothing from the package: it must print even when the rest of the install is broken."""

from __future__ import annotations

#: Every key of the document, in order; ``ok`` is true exactly when ``error`` is ``null``.
FIELDS = ("ok", "error", "cuda_home", "cuda_version", "flashinfer", "target_cuda_archs", "jit_dir",
          "server", "server_arch", "targets_from", "pool_wall_s", "modules", "plan", "compiler_cache",
          "cannot_regenerate", "refused_settings")


def document(error: str | None = None, **values) -> dict:
    """The document with ``values`` filled in and every other field empty (``null``, or ``[]``
    for the lists); ``error`` is why the build stopped or which modules failed."""
    return {**dict.fromkeys(FIELDS), "modules": [], "cannot_regenerate": [], "refused_settings": [], **values,
            "ok": error is None, "error": error}


def failure(message: str, kind: str, fix: str) -> dict:
    """The document for a build that never started (a refused command line, a broken install):
    ``error`` is the message and its fix, as for build's other refusals."""
    return document(f"{message}; Fix: {fix}" if fix else message)
