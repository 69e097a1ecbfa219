"""What the process exports to FlashInfer's JIT and its children, what its builds get at the first one, the recorder."""
