#!/usr/bin/env bash
# Opt-in check against the REAL servers from the registry (not run in CI: ~20 GB of venvs).
#
#   tests/integration/real_servers.sh            # install, check, delete the venvs
#   KEEP=1 tests/integration/real_servers.sh     # keep the venvs (re-runs skip the install)
#   tests/integration/real_servers.sh install    # only create the venvs
#   tests/integration/real_servers.sh check      # only the checks (venvs must exist)
#
# For each of vLLM (VLLM_SPEC, default vllm==0.34.0; FLASHINFER_SUBSTITUTE below) and SGLang (SGLANG_SPEC, default
# sglang==0.5.23): a venv with the server from the registry plus this checkout, the .pth autoload
# enabled, then, with the system toolkits hidden (unshare -m --propagation private: tmpfs over
# /usr/local/cuda*, an empty non-executable file over /usr/local/bin/nvcc) and the venv's bin
# off PATH (systemd's default PATH), it checks:
#   has_flashinfer    vLLM's own has_flashinfer() (vllm/utils/flashinfer.py) is False with the
#                     shim disabled and True with it (Debian's /usr/bin/ninja hidden too, as in
#                     an image without ninja-build); SGLang: its cuda_home() and
#                     _jit_cuda_version() find the exported pip nvcc
#   export            after `import <server>`: CUDA_HOME, `which nvcc` and `which ninja` are the
#                     shim's choice (ninja: the wheel's, even with Debian's ninja on PATH)
#   workers           a spawned worker sees the same CUDA_HOME, ninja and FlashInfer targets
#   jit_dir           the server's JIT directory (SGLang: under ~/.cache/sglang)
#   own_targets       in a model process (SGLang: the real set_cuda_arch() of ModelRunner.load_model,
#                     torch.cuda answering for the first GPU of $ARCH), FLASHINFER_CUDA_ARCH_LIST
#                     becomes what flashinfer-sm120 reads from the installed source (12.0a)
#   warm              `flashinfer-sm120 build --arch $ARCH $MODULE` (no --for: the installed
#                     server is detected, and SGLang's own targets applied), then, in a model
#                     process (SGLang: after its set_cuda_arch()), FlashInfer's own write_ninja +
#                     `ninja -n` (the ninja on the server's PATH) in the module's build
#                     directory says "no work to do"
#   fallbacks         the guard's serving fallbacks (VLLM_USE_FLASHINFER_SAMPLER=0 ...) are
#                     defined in the installed server's source; vLLM: every vllm/envs.py
#                     FLASHINFER variable that defaults to True has one
#   doctor            `flashinfer-sm120 doctor --verbose` names the ninja, the server's JIT dir
#                     and vLLM's has_flashinfer()
# 8 checks per server, 16 in all. Results: $WORK/summary.txt (PASS/FAIL per check, versions,
# date); exit status 1 on any FAIL.
# Needs root (unshare -m) and network access to the package index.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WORK=${WORK:-/tmp/flashinfer-sm120-real-servers}
PYTHON=${PYTHON:-python3}
VLLM_SPEC=${VLLM_SPEC:-vllm==0.34.0}
# vLLM 0.34.0 pins flashinfer-python==0.7.3, which this index does not serve: OLD=NEW, empty for none
FLASHINFER_SUBSTITUTE=${FLASHINFER_SUBSTITUTE-0.7.3=0.7.4}
SGLANG_SPEC=${SGLANG_SPEC:-sglang==0.5.23}
SERVERS=${SERVERS:-vllm sglang}
MODULE=${MODULE:-activation}
ARCH=${ARCH:-12.0}
KEEP=${KEEP:-0}
PHASE=${1:-all}
SYS_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin   # systemd's default
export PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1

mkdir -p "$WORK"
SUMMARY="$WORK/summary.txt"

spec_of() { case "$1" in vllm) echo "$VLLM_SPEC" ;; sglang) echo "$SGLANG_SPEC" ;; esac; }

install_server() {
    local name=$1 venv="$WORK/$1"
    if [ -x "$venv/bin/flashinfer-sm120" ]; then
        echo "== $name: venv exists ($venv)"; return 0
    fi
    echo "== $name: installing $(spec_of "$name") into $venv ($(date -u +%H:%M:%S))"
    "$PYTHON" -m venv "$venv"
    local spec sub note="$WORK/$name-install-note.txt"
    spec=$(spec_of "$name")
    sub=$( [ "$name" = vllm ] && echo "$FLASHINFER_SUBSTITUTE" || true)
    if [ -n "$sub" ]; then
        # The server pins a FlashInfer this index does not serve: install the server without its
        # dependencies, then its own requirements (from the wheel's METADATA, extras left out)
        # with flashinfer-python==${sub#*=} in place of ==${sub%%=*}.
        mkdir -p "$WORK/wheels"
        nice -n 10 "$venv/bin/pip" download -q --no-deps -d "$WORK/wheels" "$spec"
        "$venv/bin/python" - "$WORK/wheels" "$spec" "$sub" > "$WORK/$name-requirements.txt" <<'PY'
import email, pathlib, sys, zipfile
wheels, spec, sub = sys.argv[1:]
name, version = spec.split("==")
old, new = sub.split("=")
whl = next(pathlib.Path(wheels).glob(f"{name}-{version}-*.whl"))
with zipfile.ZipFile(whl) as z:
    meta = email.message_from_bytes(z.read(f"{name}-{version}.dist-info/METADATA"))
for req in meta.get_all("Requires-Dist"):
    if "extra ==" not in req:
        print(req.replace(f"flashinfer-python=={old}", f"flashinfer-python=={new}"))
PY
        grep -q "flashinfer-python==${sub#*=}" "$WORK/$name-requirements.txt"
        nice -n 10 "$venv/bin/pip" install -q -r "$WORK/$name-requirements.txt"
        nice -n 10 "$venv/bin/pip" install -q --no-deps "$spec"
        echo "# $name: $spec installed with --no-deps, then its requirements with flashinfer-python==${sub#*=} in place of its pin ==${sub%%=*} (not served by this index)" > "$note"
    else
        nice -n 10 "$venv/bin/pip" install -q "$spec"
        : > "$note"
    fi
    # this checkout, editable: the checks run the code as it is now
    nice -n 10 "$venv/bin/pip" install -q -e "$ROOT"
    "$venv/bin/flashinfer-sm120" enable
    "$venv/bin/pip" check > "$WORK/$name-pip-check.txt" 2>&1 || true
    echo "== $name: installed ($(date -u +%H:%M:%S))"
}

# Run "$@" with the system toolkits hidden, the venv's bin off PATH, a fresh HOME; $HIDE_NINJA=1
# hides Debian's /usr/bin/ninja as well.
hidden() {
    local name=$1; shift
    local home="$WORK/home-$name"
    mkdir -p "$home"
    unshare -m --propagation private bash -ec '
        for d in /usr/local/cuda*; do [ -d "$d" ] && mount -t tmpfs none "$(readlink -f "$d")"; done
        empty=$(mktemp); chmod 0644 "$empty"
        [ -e /usr/local/bin/nvcc ] && mount --bind "$empty" /usr/local/bin/nvcc
        if [ "${HIDE_NINJA:-0}" = 1 ]; then
            for n in /usr/bin/ninja /usr/local/bin/ninja; do [ -e "$n" ] && mount --bind "$empty" "$n"; done
        fi
        exec env -i HOME="$0" PATH="$1" LANG=C.UTF-8 FLASHINFER_CUDA_ARCH_LIST="$2" "${@:3}"
    ' "$home" "$SYS_PATH" "$ARCH" "$@"
}

result() {  # result NAME CHECK STATUS DETAIL
    printf '%-7s %-15s %-4s %s\n' "$1" "$2" "$3" "$4" | tee -a "$SUMMARY"
}

check_server() {
    local name=$1 venv="$WORK/$1" py="$WORK/$1/bin/python" out
    local log="$WORK/$name-check.log"
    : > "$log"
    rm -rf "${WORK:?}/home-$name"   # a fresh HOME: empty JIT cache, no CUDA_HOME view yet
    echo "== $name: checks (log: $log)"
    cat "$WORK/$name-install-note.txt" >> "$SUMMARY" 2>/dev/null || true
    "$py" "$ROOT/tests/integration/server_probe.py" versions "$name" >> "$SUMMARY"

    # has_flashinfer: off with the shim disabled, on with it (no system toolkit, no system ninja)
    out=$(HIDE_NINJA=1 hidden "$name" FLASHINFER_SM120_DISABLE=1 "$py" "$ROOT/tests/integration/server_probe.py" has_flashinfer "$name" 2>>"$log" | tail -1)
    local off=$out
    out=$(HIDE_NINJA=1 hidden "$name" "$py" "$ROOT/tests/integration/server_probe.py" has_flashinfer "$name" 2>>"$log" | tail -1)
    echo "has_flashinfer: disabled -> $off; enabled -> $out" >> "$log"
    case "$name:$off:$out" in
        vllm:False*:True*) result "$name" has_flashinfer PASS "without the shim $off; with it $out" ;;
        sglang:torch-fallback*:nvcc:13.*) result "$name" has_flashinfer PASS "without the shim $off; with it $out" ;;
        *) result "$name" has_flashinfer FAIL "without the shim $off; with it $out" ;;
    esac

    # export, workers, jit dir, with Debian's ninja visible
    for check in export workers jit_dir fallbacks own_targets; do
        out=$(hidden "$name" "$py" "$ROOT/tests/integration/server_probe.py" "$check" "$name" 2>>"$log" | tail -1)
        echo "$check: $out" >> "$log"
        case "$out" in PASS*) result "$name" "$check" PASS "${out#PASS }" ;; *) result "$name" "$check" FAIL "$out" ;; esac
    done

    # warm: build, then FlashInfer's own ninja -n in the server's process
    if hidden "$name" "$venv/bin/flashinfer-sm120" build --arch "$ARCH" "$MODULE" >> "$log" 2>&1; then
        out=$(hidden "$name" "$py" "$ROOT/tests/integration/server_probe.py" warm "$name" "$MODULE" 2>>"$log" | tail -1)
    else
        out="FAIL: flashinfer-sm120 build failed (see $log)"
    fi
    echo "warm: $out" >> "$log"
    case "$out" in PASS*) result "$name" warm PASS "${out#PASS }" ;; *) result "$name" warm FAIL "$out" ;; esac

    # doctor --verbose names the ninja, the server's JIT dir and (vLLM) has_flashinfer (plain doctor: one screen)
    hidden "$name" "$venv/bin/flashinfer-sm120" doctor --verbose --timeout 60 > "$WORK/$name-doctor.txt" 2>&1 || true
    if grep -q "^Ninja" "$WORK/$name-doctor.txt" && grep -qi "JIT dir" "$WORK/$name-doctor.txt" \
        && { [ "$name" != vllm ] || grep -q "has_flashinfer" "$WORK/$name-doctor.txt"; }; then
        result "$name" doctor PASS "$(grep -m1 '^Ninja' "$WORK/$name-doctor.txt")"
    else
        result "$name" doctor FAIL "see $WORK/$name-doctor.txt"
    fi
}

if [ "$PHASE" = install ] || [ "$PHASE" = all ]; then
    for s in $SERVERS; do install_server "$s"; done
fi
if [ "$PHASE" = check ] || [ "$PHASE" = all ]; then
    {
        echo "# flashinfer-sm120 real-server check, $(date -u +%Y-%m-%dT%H:%MZ), $(uname -m), arch $ARCH, module $MODULE"
        echo "# checkout $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')"
    } > "$SUMMARY"
    for s in $SERVERS; do check_server "$s"; done
    echo "== summary ($SUMMARY):"; cat "$SUMMARY"
fi
if [ "$KEEP" != 1 ] && [ "$PHASE" = all ]; then
    for s in $SERVERS; do rm -rf "${WORK:?}/$s" "${WORK:?}/home-$s"; done
fi
! grep -q " FAIL " "$SUMMARY" 2>/dev/null
