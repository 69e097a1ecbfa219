"""Real memory cgroups for tests (root only): v1 under /sys/fs/cgroup/memory, v2 where a
cgroup2 hierarchy has the memory controller.  ``make(version)`` returns a :class:`MemCgroup`
or a reason it cannot (the test skips with that reason, printed by ``pytest -rs``).

Also the fake compiler the cgroup tests run: an nvcc that allocates and touches N MB."""

from __future__ import annotations

import os
import signal
import time
import uuid

V1_ROOT = "/sys/fs/cgroup/memory"

#: A fake nvcc, in C: a script could not pass the wrapper allowlist (an interpreter's program
#: cannot be checked).  ``--version`` answers like nvcc 13.0; a compile allocates and touches
#: $FAKE_NVCC_MB MB, holds it $FAKE_NVCC_HOLD s, logs "start/end TIME PID" to $FAKE_NVCC_LOG,
#: and writes the object (-o) and dependency file (-MF).
FAKE_NVCC_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>
static double now(void) { struct timeval tv; gettimeofday(&tv, 0); return tv.tv_sec + tv.tv_usec / 1e6; }
static void logline(const char *what) {
    const char *log = getenv("FAKE_NVCC_LOG");
    if (!log) return;
    FILE *f = fopen(log, "a");
    if (f) { fprintf(f, "%s %f %d\n", what, now(), (int)getpid()); fclose(f); }
}
int main(int argc, char **argv) {
    const char *out = 0, *mf = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--version")) { puts("Cuda compilation tools, release 13.0, V13.0.88"); return 0; }
        if (!strcmp(argv[i], "-o") && i + 1 < argc) out = argv[i + 1];
        if (!strcmp(argv[i], "-MF") && i + 1 < argc) mf = argv[i + 1];
    }
    logline("start");
    const char *mb = getenv("FAKE_NVCC_MB"), *hold = getenv("FAKE_NVCC_HOLD");
    size_t n = (size_t)atol(mb ? mb : "400") << 20;
    char *block = malloc(n);
    if (!block) return 3;
    memset(block, 1, n);
    usleep((useconds_t)(atof(hold ? hold : "1.5") * 1e6));
    if (out) { FILE *f = fopen(out, "w"); if (f) { fputs("object", f); fclose(f); } }
    if (mf && out) { FILE *f = fopen(mf, "w"); if (f) { fprintf(f, "%s: \n", out); fclose(f); } }
    logline("end");
    free(block);
    return 0;
}
"""


def install_fake_nvcc(toolkit) -> str:
    """Compile :data:`FAKE_NVCC_C` into ``<toolkit>/bin/nvcc`` (replacing what is there)."""
    import subprocess
    from pathlib import Path

    nvcc = Path(toolkit) / "bin" / "nvcc"
    src = Path(toolkit) / "fake_nvcc.c"
    src.write_text(FAKE_NVCC_C)
    if nvcc.exists():
        nvcc.unlink()
    subprocess.run(["/usr/bin/gcc", "-O1", "-o", str(nvcc), str(src)], check=True, capture_output=True)
    return str(nvcc)


#: A fake host compiler / linker (C, see ``helpers.toolkits.compiled``): writes "linked" to the file
#: named by the last -o.
FAKE_CXX = r"""
#include <stdio.h>
#include <string.h>
int main(int argc, char **argv) {
    const char *out = 0;
    FILE *f;
    for (int i = 1; i + 1 < argc; i++) if (!strcmp(argv[i], "-o")) out = argv[i + 1];
    if (!out || !(f = fopen(out, "w"))) return 1;
    fputs("linked\n", f);
    fclose(f);
    return 0;
}
"""


def max_overlap(log_path) -> int:
    """Most fake compiles running at once, from the start/end lines of FAKE_NVCC's log."""
    events = []
    for line in open(log_path).read().splitlines():
        what, t, _pid = line.split()
        events.append((float(t), 1 if what == "start" else -1))
    cur = peak = 0
    for _, d in sorted(events, key=lambda e: (e[0], e[1])):
        cur += d
        peak = max(peak, cur)
    return peak


class MemCgroup:
    def __init__(self, version: str, path: str) -> None:
        self.version, self.path = version, path

    def _file(self, v1: str, v2: str) -> str:
        return os.path.join(self.path, v1 if self.version == "1" else v2)

    def set_limit(self, nbytes: int) -> None:
        with open(self._file("memory.limit_in_bytes", "memory.max"), "w") as f:
            f.write(str(nbytes))
        if self.version == "2":
            try:
                with open(os.path.join(self.path, "memory.swap.max"), "w") as f:
                    f.write("0")
            except OSError:
                pass

    def prefix(self, cmd: list[str]) -> list[str]:
        """``cmd`` run inside this cgroup (the shell moves itself in, then execs)."""
        return ["/bin/sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', self.path, *cmd]

    def oom_kills(self) -> int:
        name = self._file("memory.oom_control", "memory.events")
        for line in open(name).read().splitlines():
            k, _, v = line.partition(" ")
            if k == "oom_kill":
                return int(v)
        if self.version == "1":  # kernels before 4.13 have no oom_kill line: count limit hits
            return int(open(os.path.join(self.path, "memory.failcnt")).read())
        return 0

    def peak(self) -> int:
        return int(open(self._file("memory.max_usage_in_bytes", "memory.peak")).read())

    def reset_peak(self) -> None:
        with open(self._file("memory.max_usage_in_bytes", "memory.peak"), "w") as f:
            f.write("0")

    def close(self) -> None:
        for _ in range(50):
            try:
                pids = [int(p) for p in open(os.path.join(self.path, "cgroup.procs")).read().split()]
            except OSError:
                return
            for p in pids:
                try:
                    os.kill(p, signal.SIGKILL)
                except OSError:
                    pass
            try:
                os.rmdir(self.path)
                return
            except OSError:
                time.sleep(0.1)


def _v2_root() -> str | None:
    try:
        lines = open("/proc/self/mountinfo").read().splitlines()
    except OSError:
        return None
    for line in lines:
        f = line.split()
        if "-" in f and f[f.index("-") + 1] == "cgroup2":
            return f[4]
    return None


def make(version: str) -> tuple[MemCgroup | None, str | None]:
    """A new, empty memory cgroup of ``version`` ("1" or "2"), or ``(None, why not)``."""
    name = f"flashinfer-sm120-test-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    if os.geteuid() != 0:
        return None, "memory cgroups can be created by root only"
    if version == "1":
        if not os.path.isfile(os.path.join(V1_ROOT, "memory.limit_in_bytes")):
            return None, f"no cgroup v1 memory controller at {V1_ROOT}"
        path = os.path.join(V1_ROOT, name)
    else:
        root = _v2_root()
        if root is None:
            return None, "no cgroup2 hierarchy is mounted"
        try:
            controllers = open(os.path.join(root, "cgroup.controllers")).read().split()
        except OSError as exc:
            return None, f"cannot read {root}/cgroup.controllers ({exc})"
        if "memory" not in controllers:
            return None, (f"the cgroup2 hierarchy at {root} has no memory controller "
                          f"(controllers: {' '.join(controllers) or 'none'}; memory is bound to cgroup v1)")
        try:
            with open(os.path.join(root, "cgroup.subtree_control"), "w") as f:
                f.write("+memory")
        except OSError as exc:
            return None, f"cannot enable the memory controller below {root} ({exc})"
        path = os.path.join(root, name)
    try:
        os.mkdir(path)
    except OSError as exc:
        return None, f"cannot create {path} ({exc})"
    return MemCgroup(version, path), None
