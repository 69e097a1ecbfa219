"""Find every CUDA toolkit on the machine, read its versions, and choose one (docs/toolkit.md).

FlashInfer's own lookup (``flashinfer/jit/cpp_ext.py`` ``get_cuda_path``: ``CUDA_HOME``, ``CUDA_PATH``,
``dirname(dirname(which nvcc))``, ``/usr/local/cuda``) never looks at the pip nvcc in
``site-packages/nvidia/cu13``.  Here every candidate is gathered (:mod:`.sources`), its version is
what its nvcc says (:mod:`.probe`, remembered per binary in :mod:`.memo`), and the first that builds
the wanted targets in a fixed order wins (:mod:`.policy`, fix lines in :mod:`.fixes`).  :mod:`.ninja`
finds the process's ninja.
"""
