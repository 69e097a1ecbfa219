"""Warm-up builds (CLI only): :mod:`.modules` and :mod:`.replay` make specs, :mod:`.session` sets FlashInfer up,
:mod:`.plan` builds them through :mod:`.pool`, the one scheduler.  Importing this package imports nothing from
FlashInfer."""
