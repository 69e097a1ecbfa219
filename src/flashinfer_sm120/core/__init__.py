"""What runs on ``import flashinfer``: facts read from released code (:mod:`.facts`), the toolkit choice
(:mod:`.toolkit`), the ``CUDA_HOME`` view (:mod:`.view`), the patch (:mod:`.patch`), the JIT environment
(:mod:`.jitenv`) and the ``.pth`` autoload.  Imports only ``safety``, ``errors`` and ``envvars``."""
