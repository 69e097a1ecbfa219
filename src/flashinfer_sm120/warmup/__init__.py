"""Warm-up builds: compile FlashInfer JIT modules ahead of time into FlashInfer's JIT cache.

- :mod:`.modules`   named modules and their variants (``build --list``)
- :mod:`flashinfer_sm120.core.jitenv.record`    the manifest recorder (``FLASHINFER_SM120_RECORD``)
- :mod:`flashinfer_sm120.core.jitenv.manifest`  manifest entries: encode a spec, turn an entry back into a spec
- :mod:`.replay`    ``build --from MANIFEST``
- :mod:`.session`   set FlashInfer up for a build; build specs in one pool
- :mod:`.pool`      the job pool (admission by slots and memory); :mod:`.jobserver` the
  jobserver its ninjas share (ninja 1.13+); :mod:`.progress` its progress display
- :mod:`flashinfer_sm120.core.jitenv.memory`    the memory this process may use (cgroups, MemAvailable, unified-memory GPUs)
- :mod:`flashinfer_sm120.core.jitenv.estimates` what one compile of a module family takes (defaults, recorded peaks)
- :mod:`flashinfer_sm120.core.jitenv.jobs`      the jobs/threads policy for ``build`` and the server's ``MAX_JOBS``
- :mod:`flashinfer_sm120.core.jitenv.launcher`  the compiler cache (sccache): find, probe, remember, stats
- :mod:`flashinfer_sm120.safety.compilers` FlashInfer's compiler variables under the trust rule
- :mod:`flashinfer_sm120.core.jitenv.toolchain` what FlashInfer's builds get once it is loaded (the three above)
- :mod:`flashinfer_sm120.cli.buildopts` ``build``'s cache and memory flags; :mod:`.buildreport` doctor's "Builds"
- :mod:`.cacheexport` ``cache export``; :mod:`.cachebuilt` its manifest entries for modules built here
- :mod:`.cachepack` ``cache import``; :mod:`.cacheinstall` its verified install step
- :mod:`.cachemeta` the export format and its caps; :mod:`.cacheread` reading an export (archive or directory)
- :mod:`.ninjadeps` restamp outputs in a ninja deps log (used by cache import)

Importing this package imports nothing from FlashInfer.
"""
