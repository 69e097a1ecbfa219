"""Checks of what was built: targets per GPU, what FlashInfer will load, link facts, the smoke check.
Nothing here patches anything."""
