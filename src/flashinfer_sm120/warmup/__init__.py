"""Warm-up builds: compile FlashInfer JIT modules ahead of time into FlashInfer's JIT cache.

- :mod:`.modules`   named modules and their variants (``build --list``)
- :mod:`.record`    the manifest recorder (``FLASHINFER_SM120_RECORD``)
- :mod:`.manifest`  manifest entries: encode a spec, turn an entry back into a spec
- :mod:`.replay`    ``build --from MANIFEST``
- :mod:`.session`   set FlashInfer up for a build; build specs in one pool
- :mod:`.pool`      the job pool and its progress display
- :mod:`.cachepack` ``cache export`` / ``cache import``
- :mod:`.ninjadeps` restamp outputs in a ninja deps log (used by cache import)

Importing this package imports nothing from FlashInfer.
"""
