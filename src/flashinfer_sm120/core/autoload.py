"""What the ``.pth`` autoload (:mod:`.autoload_hook`) does once it loaded the package: it records the trigger for
``doctor`` and, for ``vllm`` and ``sglang``, exports the chosen toolkit after their import (:mod:`.early`)."""

from __future__ import annotations

import types

#: Triggers after whose import the chosen toolkit is exported at once.
EXPORT_EARLY = ("vllm", "sglang")


#: What ``doctor`` shows: the import that fired the hook, its ``.pth``, what happened to the early export.
state = types.SimpleNamespace(triggered_by=None, pth=None, early_export=None)


def triggered(name: str, pth: str | None = None) -> None:
    """Called by the hook once the package is imported (``name``: the import that fired it, ``pth``: its
    ``.pth``); records both for ``doctor`` and, for :data:`EXPORT_EARLY`, exports after the server's import."""
    state.triggered_by, state.pth = name, pth
    top = name.partition(".")[0]
    if top not in EXPORT_EARLY:
        return
    try:
        import wrapt

        wrapt.register_post_import_hook(_export_early, top)
    except Exception as exc:  # wrapt missing or broken: FlashInfer's own hooks report it
        state.early_export = f"not done: {exc!r}"


def _export_early(module) -> None:
    from flashinfer_sm120.core.early import export_now  # only vLLM's and SGLang's processes load it

    export_now(f"after importing {getattr(module, '__name__', module)}")
