"""What runs on ``import flashinfer``: facts, the toolkit choice, the ``CUDA_HOME`` view, the patch, the JIT
environment and the ``.pth`` autoload.  Imports only ``safety``, ``errors`` and ``envvars``."""
