"""Warm-up builds (CLI only): compile FlashInfer JIT modules ahead of time into FlashInfer's JIT cache.

:mod:`.modules` named modules and their variants; :mod:`.replay` ``build --from MANIFEST``;
:mod:`.session` FlashInfer set up for a build; :mod:`.plan` jobs and memory; :mod:`.pool` the one
scheduler and :mod:`.ninjacmd` one module's ninja; :mod:`.cache_format`, :mod:`.cache_export`,
:mod:`.cache_import` what an export is, writing and installing one.  Importing this package imports
nothing from FlashInfer.
"""
