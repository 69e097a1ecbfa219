"""A JIT cache warmed with a fake compiler (the ``warmed`` fixture in tests/conftest.py): ninja files and
FlashInfer's own build are real, every compile and link is :data:`FAKE_CC`."""

from __future__ import annotations

from pathlib import Path

from helpers.toolkits import script

#: A fake nvcc launcher and host compiler: logs its arguments to ``$FAKE_CC_LOG`` and writes the
#: ``-o`` file (and the ``-MF`` depfile).
FAKE_CC = """#!/bin/sh
echo "$@" >> "$FAKE_CC_LOG"
out=""; dep=""; src=""
while [ $# -gt 0 ]; do case "$1" in -o) out="$2"; shift;; -MF) dep="$2"; shift;; -c) src="$2"; shift;; esac; shift; done
echo "object of $src" > "$out"
if [ -n "$dep" ]; then echo "$out: $src" > "$dep"; fi
"""

#: Records two modules (silu activation, one decode) into ``FLASHINFER_SM120_RECORD`` without building.
RECORD = """
import json, helpers.fakegpu, flashinfer_sm120, torch
from flashinfer.jit.core import MissingJITCacheError
from flashinfer.activation import get_act_and_mul_module
from flashinfer.decode import get_batch_decode_module
for call in (lambda: get_act_and_mul_module("silu"),
             lambda: get_batch_decode_module(torch.float16, torch.float16, torch.float16, torch.int32,
                                             64, 64, 0, False, False)):
    try:
        call()
    except MissingJITCacheError:
        pass
print("@@{}")
"""

#: Loads the activation module through FlashInfer's own build_and_load; prints ``{"err": ...}``.
LOAD_AGAIN = """
import json, helpers.fakegpu, flashinfer_sm120, torch
from flashinfer.activation import get_act_and_mul_module
try:
    get_act_and_mul_module("silu")   # FlashInfer's own build_and_load: ninja, then load
except Exception as e:
    err = repr(e)
print("@@" + json.dumps({"err": err}))
"""


def fake_compiler_env(env: dict, tmp_path: Path) -> tuple[dict, Path]:
    """``env`` with :data:`FAKE_CC` as nvcc launcher and host compiler and no GPU; returns it and
    the compiler's log."""
    cc = script(tmp_path / "fakecc", FAKE_CC)
    log = tmp_path / "cc.log"
    return dict(env, FLASHINFER_NVCC_LAUNCHER=str(cc), CXX=str(cc), FAKE_CC_LOG=str(log), FAKE_GPU_CAPS=""), log
