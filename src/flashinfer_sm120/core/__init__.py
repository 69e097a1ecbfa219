"""What runs on ``import flashinfer``: facts read from released code, the toolkit choice, the CUDA_HOME view, the patch, and the JIT environment it exports.

- :mod:`.facts`    FlashInfer releases, arch rules, GPUs, servers: data read from released code, and its lookups
- :mod:`.toolkit`  find every CUDA toolkit, read its versions, choose one
- :mod:`.view`     the ``CUDA_HOME`` view FlashInfer's ninja files can compile and link with
- :mod:`.patch`    FlashInfer's hooks, their state and undo log
- :mod:`.jitenv`   what the process exports to FlashInfer's JIT and its children
- :mod:`.autoload` the ``.pth`` autoload; :mod:`.autoload_hook` its start-up hook (standard library only)

Imports only ``safety`` and the package's root modules (``errors``, ``envvars``).
"""
