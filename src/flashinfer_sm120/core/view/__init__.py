"""The ``CUDA_HOME`` view: a directory FlashInfer's generated ninja files can compile and link with
(docs/toolkit.md, "The CUDA_HOME view").

FlashInfer (``flashinfer/jit/cpp_ext.py``, 0.6.7 - 0.7.4) compiles with ``$cuda_home/bin/nvcc`` and
links with ``-L$cuda_home/lib64 -L$cuda_home/lib64/stubs -lcudart -lcuda``; the CUDA 13 wheels lack
``lib64``, ``libcudart.so``, the stub and maybe ``curand.h``.  A view is links into the toolkit plus
those pieces, at ``<cache root>/cuda-home/cuda-<nvcc version>-<key>[.N]`` (``key`` hashes layout, root,
nvcc and its stat, curand dir).  Building: :mod:`.build`; format and adoption check: :mod:`.meta`;
the stub: :mod:`.stub`.

threat-model: P2 -- a view is adopted only when its metadata names this toolkit, nvcc and curand dir,
everything in it is ours and not writable by others, every link points into the toolkit, the curand
dir or the view, and the stub is byte for byte the one recorded; else the next name is built.  P3 --
views are never changed or deleted once made; one builder at a time (``cuda-home/.lock``), and a
lease held while a process uses one.
"""
