#!/bin/sh
# Build stage of examples/Dockerfile, runnable on any GPU-less Linux machine too:
#   1. a venv with torch (cu130 wheel) and flashinfer-sm120 (which pulls the CUDA 13 nvcc wheels),
#   2. the .pth autoload enabled in that venv (every process that imports flashinfer, vllm or
#      sglang is patched; nothing else pays for it),
#   3. `flashinfer-sm120 doctor --arch` for the target GPUs, kept as JSON (fails the build on a
#      PROBLEM verdict: no toolkit fits, no ninja...),
#   4. FlashInfer's JIT cache warmed for the target GPUs with `flashinfer-sm120 build --arch` (fails the
#      build when a module does not compile and link with FlashInfer's own build line).
# Every path is set explicitly so the runtime stage (and a service user without a writable
# HOME) finds the same venv, CUDA_HOME view and JIT cache at the same absolute paths.
set -eu

VENV=${VENV:-/opt/venv}
PYTHON=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC-torch==2.13.0}            # empty: use the torch the venv already sees
TORCH_INDEX_URL=${TORCH_INDEX_URL-https://download.pytorch.org/whl/cu130}
SM120_SPEC=${SM120_SPEC:-.}                       # a checkout path (default: here) or a wheel
PIP_FLAGS=${PIP_FLAGS-}                           # e.g. --no-deps when the image has the rest
ARCHS=${ARCHS:-12.0}                              # compute capabilities of the target GPUs
WARM_MODULES=${WARM_MODULES-sampling decode}      # empty: skip the warm-up compile
export FLASHINFER_WORKSPACE_BASE="${FLASHINFER_WORKSPACE_BASE:-/var/cache/flashinfer}"
export FLASHINFER_SM120_CACHE_DIR="${FLASHINFER_SM120_CACHE_DIR:-/var/cache/flashinfer-sm120}"

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
if [ -n "$TORCH_SPEC" ]; then
    # shellcheck disable=SC2086
    "$VENV/bin/python" -m pip install $PIP_FLAGS --index-url "$TORCH_INDEX_URL" "$TORCH_SPEC"
fi
# shellcheck disable=SC2086
"$VENV/bin/python" -m pip install $PIP_FLAGS "$SM120_SPEC"
"$VENV/bin/flashinfer-sm120" enable
mkdir -p "$FLASHINFER_SM120_CACHE_DIR" "$FLASHINFER_WORKSPACE_BASE"
# No GPU here: the arch list stands for the target GPUs.
"$VENV/bin/flashinfer-sm120" doctor --json --arch "$ARCHS" > "$FLASHINFER_SM120_CACHE_DIR/doctor-build-stage.json"
if [ -n "$WARM_MODULES" ]; then
    # shellcheck disable=SC2086
    "$VENV/bin/flashinfer-sm120" build --arch "$ARCHS" $WARM_MODULES
fi
echo "build stage done: venv $VENV, JIT cache $FLASHINFER_WORKSPACE_BASE, view $FLASHINFER_SM120_CACHE_DIR"
