"""The one JSON document ``build --json`` prints for every outcome, built, failed or refused.

Imports nothing from the package: it must print even when the rest of the install is broken."""

from __future__ import annotations

__all__ = ["FIELDS", "document"]

#: Every key of the document, in order; ``ok`` is true exactly when ``error`` is ``null``.
FIELDS = ("ok", "error", "cuda_home", "cuda_version", "flashinfer", "target_cuda_archs", "jit_dir",
          "server", "server_arch", "targets_from", "pool_wall_s", "pool_occupancy", "modules", "plan",
          "pool_timeline", "compiler_cache", "cannot_regenerate")


def document(error: str | None = None, **values) -> dict:
    """The document with ``values`` filled in and every other field empty (``null``, or ``[]``
    for the lists); ``error`` is why the build stopped or which modules failed."""
    unknown = set(values) - set(FIELDS)
    if unknown:
        raise TypeError(f"not a build --json field: {sorted(unknown)}")
    doc: dict = dict.fromkeys(FIELDS)
    doc.update(modules=[], cannot_regenerate=[])
    doc.update(values)
    doc.update(ok=error is None, error=error)
    return doc
