"""Facts read from released code (FlashInfer, CUDA, vLLM, SGLang), as data apart from their lookups.

:mod:`.releases` (per FlashInfer release), :mod:`.arch` (targets, arch lists),
:mod:`.gpus`, :mod:`.buildline` (variables in the build line), :mod:`.servers`/:mod:`.serverprobe`
(per server release / what an installed one does), :mod:`.workspace` (FlashInfer's JIT workspace),
:mod:`.refusals` (where we must not import or build), :mod:`.importfail` (why its import failed),
:mod:`.reinstall` (the fix for a broken install of flashinfer-sm120).
"""
