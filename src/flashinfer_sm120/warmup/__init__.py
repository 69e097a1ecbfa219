"""Warm-up builds (CLI only): :mod:`.modules` and :mod:`.replay` make specs, :mod:`.session` sets FlashInfer up,
:mod:`.plan` builds them through :mod:`.pool`, the one scheduler; :mod:`.cache` and :mod:`.cache_import` move
the result.  Importing this package imports nothing from FlashInfer."""
