"""Warm-up builds (CLI only; imports nothing of FlashInfer): :mod:`.modules` and :mod:`.replay` make specs,
:mod:`.session` sets FlashInfer up, :mod:`.plan` builds them through :mod:`.pool`, the one scheduler."""
