"""The ``CUDA_HOME`` view FlashInfer can compile and link with (docs/toolkit.md): links into the toolkit plus
what the CUDA 13 wheels lack, adopted only when all of it is ours (P2), never changed once made (P3)."""
