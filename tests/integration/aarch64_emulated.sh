#!/usr/bin/env bash
# Opt-in: the main job on aarch64 (DGX Spark's platform, SM121) under qemu-user emulation, on an
# x86_64 machine without a GPU. Not run in CI, not collected by pytest: root, about 3 GB and 30+ minutes.
#
#   tests/integration/aarch64_emulated.sh           # root (once), install, check
#   tests/integration/aarch64_emulated.sh root      # only the arm64 root
#   tests/integration/aarch64_emulated.sh install   # root + venv (torch, this checkout)
#   tests/integration/aarch64_emulated.sh check     # only the checks (the venv must exist)
#
# Kept in AARCH64_DIR (default ~/.cache/flashinfer-sm120-aarch64): root/, a Debian bookworm arm64
# root made once with debootstrap (mirror: DEBIAN_MIRROR, else the first .../debian URI in apt's
# sources), a venv at /opt/venv inside it, and summary.txt. Re-runs reuse the root and venv, reinstall
# this checkout (bind-mounted read-only at /checkout: `pip install /checkout`, as a user would) and run
# every check in a new, empty HOME. All mounts live in a private mount namespace (unshare -m) and end
# with the script. binfmt_misc is mounted and qemu-aarch64 enabled when needed (fix-binary flag,
# so nothing of qemu is copied into the root).
#
# Checks, as on a DGX Spark without its GPU (--arch 12.1), each timed:
#   status     `flashinfer-sm120 status --arch 12.1` exits 0 and names sm_121a
#   doctor     `doctor --json --arch 12.1`: the chosen nvcc is the pip wheel's (nvidia/cu13) and an
#              AArch64 binary, the targets are sm_121a, the view's lib64/libcudart.so.13 is AArch64
#   build      `build --arch 12.1 $MODULE` (FlashInfer's own build line): cuobjdump finds SASS sm_121a
#              in each module and `file` on its .so says ARM aarch64
#   autoload   `enable`, then (FLASHINFER_CUDA_ARCH_LIST=12.1, no GPU) a multiprocessing 'spawn' worker
#              imports flashinfer and reports flashinfer_sm120.status(): sm_121a, the pip nvcc
#   seed       a fake system toolkit 12.8 (bin/nvcc printing release 12.8) first on PATH is passed
#              over: `status --fresh --arch 12.1` keeps the pip nvcc, and its lines about the 12.8
#              toolkit are the same as the host's (x86_64, HOST_PYTHON with this package) once the
#              paths are made equal
# Results: $AARCH64_DIR/summary.txt (PASS/FAIL with seconds, versions, date); exit status 1 on a FAIL.
# Needs root, qemu-user-static and debootstrap (installed with apt-get when missing), network access
# to a Debian mirror and the package index (pip's cert/index settings of this host are copied in).
set -uo pipefail

CHECKOUT=$(cd "$(dirname "$0")/../.." && pwd)
AARCH64_DIR=${AARCH64_DIR:-$HOME/.cache/flashinfer-sm120-aarch64}
ROOTFS=$AARCH64_DIR/root
SUITE=${SUITE:-bookworm}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
MODULE=${MODULE:-activation}
HOST_PYTHON=${HOST_PYTHON:-$CHECKOUT/.venv/bin/python}
PHASE=${1:-all}
SUMMARY=$AARCH64_DIR/summary.txt
PACKAGES=python3,python3-venv,python3-dev,g++,make,file,binutils,ca-certificates

die() { echo "aarch64_emulated: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "needs root (debootstrap, chroot, mounts)"
case $PHASE in all|root|install|check) ;; *) die "unknown phase '$PHASE' (all, root, install, check)" ;; esac

# Everything below runs in a private mount namespace: the bind mounts vanish when the script ends.
if [ -z "${_AARCH64_NS:-}" ]; then
    _AARCH64_NS=1 exec unshare -m --propagation private "$0" "$@"
fi
mkdir -p "$AARCH64_DIR"

host_setup() {
    if ! command -v qemu-aarch64-static >/dev/null || ! command -v debootstrap >/dev/null; then
        apt-get update -q && apt-get install -y -q qemu-user-static debootstrap || die "apt-get install failed"
    fi
    local bm=/proc/sys/fs/binfmt_misc
    [ -e $bm/register ] || mount -t binfmt_misc binfmt_misc $bm || die "cannot mount binfmt_misc"
    if ! grep -qx enabled $bm/qemu-aarch64 2>/dev/null; then
        update-binfmts --enable qemu-aarch64 || die "cannot enable qemu-aarch64 in binfmt_misc"
    fi
    grep -q '^flags: .*F' $bm/qemu-aarch64 \
        || die "qemu-aarch64 is registered without the fix-binary (F) flag: the chroot cannot find qemu"
}

mirror() {
    if [ -n "${DEBIAN_MIRROR:-}" ]; then echo "$DEBIAN_MIRROR"; return; fi
    # the first http(s) URI ending in /debian of apt's sources (deb822 or one-line)
    cat /etc/apt/sources.list /etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list 2>/dev/null \
        | grep -oE 'https?://[^ ]+/debian/?( |$)' | head -n1 | tr -d ' '
}

make_root() {
    if [ -f "$ROOTFS/.complete" ]; then echo "arm64 root: $ROOTFS (kept)"; return; fi
    local m; m=$(mirror); [ -n "$m" ] || die "no Debian mirror: set DEBIAN_MIRROR"
    echo "arm64 root: debootstrap $SUITE from $m into $ROOTFS (once; 10-20 minutes emulated)"
    rm -rf "$ROOTFS.tmp"
    debootstrap --arch=arm64 --variant=minbase --include=$PACKAGES "$SUITE" "$ROOTFS.tmp" "$m" \
        || die "debootstrap failed (log: $ROOTFS.tmp/debootstrap/debootstrap.log)"
    rm -rf "$ROOTFS" && mv "$ROOTFS.tmp" "$ROOTFS" && touch "$ROOTFS/.complete"
}

mount_root() {
    mount -t proc proc "$ROOTFS/proc"
    # qemu-user passes the host's /sys through: x86_64 CPUs without the AArch64 ID registers, and torch's
    # import then dies in oneDNN's CPU probe ("xbyak_aarch64 ... Can't open MIDR_EL1 sysfs entry", then
    # SIGSEGV). The root gets a /sys of its own with what an arm64 kernel shows of the CPUs: the
    # online/possible/present lists and each CPU's midr_el1 (GB10's Cortex-X925: part 0xd85).
    mount -t tmpfs -o size=1m sysfs-standin "$ROOTFS/sys"
    local cpu=$ROOTFS/sys/devices/system/cpu n i; n=$(nproc)
    mkdir -p "$cpu"
    for f in online possible present; do echo "0-$((n - 1))" > "$cpu/$f"; done
    for ((i = 0; i < n; i++)); do
        mkdir -p "$cpu/cpu$i/regs/identification"
        echo 0x00000000410fd850 > "$cpu/cpu$i/regs/identification/midr_el1"
        echo 0x0000000000000000 > "$cpu/cpu$i/regs/identification/revidr_el1"
    done
    mount --rbind /dev "$ROOTFS/dev"
    mkdir -p "$ROOTFS/checkout"
    mount --bind "$CHECKOUT" "$ROOTFS/checkout" && mount -o remount,bind,ro "$ROOTFS/checkout"
    cp /etc/resolv.conf "$ROOTFS/etc/resolv.conf"
    # pip as configured here: the CA bundle and an http(s) index; local find-links are this host's
    local cert; cert=$(pip config get global.cert 2>/dev/null || echo "${PIP_CERT:-}")
    { echo "[global]"
      if [ -n "$cert" ] && [ -f "$cert" ]; then
          cp "$cert" "$ROOTFS/etc/pip-host-ca.crt"; echo "cert = /etc/pip-host-ca.crt"
      fi
      local idx; idx=${PIP_INDEX_URL:-$(pip config get global.index-url 2>/dev/null)}
      case $idx in http*) echo "index-url = $idx" ;; esac
      local extra; extra=$(for u in ${PIP_EXTRA_INDEX_URL:-$(pip config get global.extra-index-url 2>/dev/null)}; do
          case $u in http*) echo -n "$u " ;; esac; done)
      [ -z "$extra" ] || echo "extra-index-url = $extra"
      echo "default-timeout = 180"; echo "disable-pip-version-check = 1"
    } > "$ROOTFS/etc/pip.conf"
}

# in_root CMD: bash -c CMD inside the root, with a clean environment, HOME=/run-home, the venv on PATH
in_root() {
    chroot "$ROOTFS" /usr/bin/env -i HOME=/run-home LANG=C.UTF-8 TERM=dumb \
        PIP_CACHE_DIR=/var/cache/pip PATH="${IN_PATH:-/opt/venv/bin:/usr/local/bin:/usr/bin:/bin}" \
        /bin/bash -c "$1"
}

install() {
    if ! in_root '/opt/venv/bin/python -c "import torch" 2>/dev/null'; then
        echo "venv: /opt/venv with $TORCH_SPEC"
        in_root "python3 -m venv /opt/venv && pip install '$TORCH_SPEC'" || die "torch install failed"
    fi
    # cuobjdump for the build step's SASS check: the aarch64 13.5.37 wheel is tagged manylinux_2_17 but its
    # cuobjdump needs GLIBC_2.38 (bookworm has 2.36); 13.4.49's needs 2.17 (no 13.0 or 13.1 on PyPI)
    echo "venv: pip install /checkout 'nvidia-cuda-cuobjdump<13.5'"
    in_root "pip install /checkout 'nvidia-cuda-cuobjdump<13.5' && pip install --force-reinstall --no-deps /checkout" \
        || die "pip install /checkout failed"
}

# step NAME CMD: run CMD in the root, its output to $AARCH64_DIR/NAME.log, PASS/FAIL with seconds
FAILED=0
step() {
    local name=$1 t0 t1 rc r
    t0=$(date +%s.%N)
    in_root "$2" > "$AARCH64_DIR/$name.log" 2>&1; rc=$?
    t1=$(date +%s.%N)
    local secs; secs=$(awk "BEGIN { printf \"%.1f\", $t1 - $t0 }")
    if [ $rc = 0 ]; then r=PASS
    else r=FAIL; FAILED=1; fi
    printf '%-10s %s %7s s\n' "$name" "$r" "$secs" | tee -a "$SUMMARY.tmp"
    [ $r = PASS ] || sed 's/^/    | /' "$AARCH64_DIR/$name.log" | tail -n 25
}

check() {
    rm -rf "$ROOTFS/run-home" && mkdir -p "$ROOTFS/run-home"
    : > "$SUMMARY.tmp"
    in_root "flashinfer-sm120 disable" >/dev/null 2>&1   # a re-run: the autoload step enables it again
    step status "flashinfer-sm120 status --arch 12.1 | tee /dev/stderr | grep -q sm_121a"
    step doctor "flashinfer-sm120 doctor --arch 12.1 && flashinfer-sm120 doctor --json --arch 12.1 > /tmp/doctor.json && python3 /checkout/tests/integration/aarch64_checks.py doctor /tmp/doctor.json"
    step build "flashinfer-sm120 build --json --arch 12.1 $MODULE > /tmp/build.json && python3 /checkout/tests/integration/aarch64_checks.py build /tmp/build.json"
    step autoload "flashinfer-sm120 enable && cd / && FLASHINFER_CUDA_ARCH_LIST=12.1 python3 /checkout/tests/integration/aarch64_checks.py autoload"
    seed
    local v; v=$(in_root 'echo "uname -m: $(uname -m)"; flashinfer-sm120 --version' 2>&1)
    { echo "flashinfer-sm120 on aarch64 under qemu-user ($(qemu-aarch64-static --version | head -n1)), $(date -u '+%Y-%m-%d %H:%M UTC')"
      echo "host: $(uname -m), $(nproc) CPUs; root: Debian $SUITE arm64; --arch 12.1, module $MODULE"
      echo "$v"
      cat "$SUMMARY.tmp"
      [ $FAILED = 0 ] && echo "all steps passed" || echo "FAILED (logs: $AARCH64_DIR/<step>.log)"
    } > "$SUMMARY"
    rm -f "$SUMMARY.tmp"
    echo; cat "$SUMMARY"
}

# The seed's situation: a system CUDA 12.8 first on PATH, on aarch64 and on this host.
seed() {
    local fake=/opt/fake-cuda-12.8 script
    script='#!/bin/sh
case "$1" in --version) echo "nvcc: NVIDIA (R) Cuda compiler driver"; echo "Cuda compilation tools, release 12.8, V12.8.93";; *) exit 1;; esac'
    for top in "$ROOTFS" "$AARCH64_DIR/host"; do
        mkdir -p "$top$fake/bin" && printf '%s\n' "$script" > "$top$fake/bin/nvcc" && chmod 755 "$top$fake/bin/nvcc"
    done
    # the host's answer: this checkout's package in HOST_PYTHON's environment, the same fake toolkit
    # (its path shown as inside the root)
    rm -f "$ROOTFS/tmp/seed-host.json"
    if [ -x "$HOST_PYTHON" ]; then
        rm -rf "$AARCH64_DIR/host-home" && mkdir -p "$AARCH64_DIR/host-home"
        env -i HOME="$AARCH64_DIR/host-home" LANG=C.UTF-8 \
            PATH="$AARCH64_DIR/host$fake/bin:$(dirname "$HOST_PYTHON"):/usr/bin:/bin" \
            "$(dirname "$HOST_PYTHON")/flashinfer-sm120" status --fresh --json --arch 12.1 \
            | sed "s#$AARCH64_DIR/host$fake#$fake#g" > "$ROOTFS/tmp/seed-host.json"
    fi
    IN_PATH="$fake/bin:/opt/venv/bin:/usr/local/bin:/usr/bin:/bin" step seed "flashinfer-sm120 status --fresh --arch 12.1 \
        && flashinfer-sm120 status --fresh --json --arch 12.1 > /tmp/seed.json \
        && python3 /checkout/tests/integration/aarch64_checks.py seed /tmp/seed.json /tmp/seed-host.json"
}

main() {  # one function, read whole before it runs: editing this file during a run changes nothing
    host_setup
    [ "$PHASE" = check ] || make_root
    [ "$PHASE" = root ] && return 0
    [ -f "$ROOTFS/.complete" ] || die "no arm64 root at $ROOTFS: run the 'root' phase first"
    mount_root
    case $PHASE in all|install) install ;; esac
    case $PHASE in all|check) check; return $FAILED ;; esac
}
main; exit $?
