"""What the process exports to FlashInfer's JIT and its children (:mod:`.environ`), what its builds get at the first
one (:mod:`.toolchain`: ``MAX_JOBS`` from :mod:`.memory`, the compiler cache of :mod:`.launcher`), and the manifest
recorder (:mod:`.record`, :mod:`.generators`)."""
