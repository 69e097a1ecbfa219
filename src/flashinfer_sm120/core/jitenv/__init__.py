"""What the process exports to FlashInfer's JIT and its children: CUDA_HOME, PATH (nvcc, ninja), Triton's ptxas, MAX_JOBS, compiler launchers, the memory budget, and recording."""
