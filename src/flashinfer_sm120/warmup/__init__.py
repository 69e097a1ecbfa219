"""Warm-up builds: compile FlashInfer JIT modules ahead of time into FlashInfer's JIT cache.

- :mod:`.modules`   named modules and their variants (``build --list``)
- :mod:`.replay`    ``build --from MANIFEST``; :mod:`.regenerate` reading a manifest and remaking its specs
- :mod:`.session`   set FlashInfer up for a build; build specs in one pool
- :mod:`.plan`      jobs, threads and memory budget of a build; per-family estimates and recorded peaks
- :mod:`.pool`      the job pool, the one scheduler (admission by slots and memory), and its
  progress display; :mod:`.ninjacmd` one module's ninja as FlashInfer runs it
- :mod:`.buildreport` doctor's "Builds"
- :mod:`.cache_format` what an export is (layout, meta.json, caps) and reading one as untrusted input
- :mod:`.cache_export` ``cache export``
- :mod:`.cache_import` ``cache import``: its one install step (archive or directory)
- :mod:`.ninjadeps` restamp outputs in a ninja deps log (used by cache import)

What a build gets from the process (the memory read, MAX_JOBS and threads as FlashInfer reads them, the
compiler cache, FlashInfer's compiler variables) and the manifest grammar and recorder are in
:mod:`flashinfer_sm120.core.jitenv`; ``build``'s flags in :mod:`flashinfer_sm120.cli.buildopts`.

Importing this package imports nothing from FlashInfer.
"""
