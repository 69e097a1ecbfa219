"""Facts as data read from released code (FlashInfer releases, arch rules, GPUs, servers), with the versions they were verified against.

- :mod:`.releases`    what each FlashInfer release needs from the toolkit, and what to patch in it
- :mod:`.arch`        compute capability -> nvcc target rules; :mod:`.archlist` reading an arch list
- :mod:`.gpus`        the GPUs' compute capabilities
- :mod:`.buildline`   FlashInfer's variables that enter every build line
- :mod:`.servers`     what vLLM and SGLang check, per release; :mod:`.serverprobe` what an installed one
  does in a given environment; :mod:`.serverarch` the targets its model processes set
- :mod:`.workspace`   why FlashInfer's own import failed, and the fix
- :mod:`.reinstall`   the fix for a broken install of flashinfer-sm120 itself
"""
