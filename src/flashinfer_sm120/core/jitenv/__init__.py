"""What the process exports to FlashInfer's JIT and its children: CUDA_HOME, PATH (nvcc, ninja), Triton's ptxas, MAX_JOBS, compiler launchers, and recording.

- :mod:`.environ`    the export of the chosen toolkit to the process and its children, and its undo
- :mod:`.ptxas`      Triton's bundled ptxas, and when ours is exported in its place
- :mod:`.toolchain`  what FlashInfer's builds get besides the toolkit: compiler variables, ``MAX_JOBS``, the compiler cache
- :mod:`.launcher`   the compiler cache (sccache): find, probe, remember, stats
- :mod:`.memory`     the memory this process may use (cgroups, MemAvailable, unified-memory GPUs)
- :mod:`.jobs`       the server's ``MAX_JOBS`` from that memory; ``MAX_JOBS`` and nvcc threads as FlashInfer reads them
- :mod:`.record`     the manifest recorder (``FLASHINFER_SM120_RECORD``); :mod:`.manifest` its entries;
  :mod:`.generators` which FlashInfer generator made a module, called again
"""
