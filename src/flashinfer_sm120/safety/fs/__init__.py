"""Files: the per-uid state directory, atomic state files, one-at-a-time locks, paths FlashInfer's ninja lines can carry, private temporary directories."""
