"""Real memory cgroups for tests (root only): v1 under /sys/fs/cgroup/memory, v2 where a
cgroup2 hierarchy has the memory controller.  ``make(version)`` returns a :class:`MemCgroup`
or a reason it cannot (the test skips with that reason, printed by ``pytest -rs``).

Also the fake compiler the cgroup tests run: an nvcc that allocates and touches N MB."""

from __future__ import annotations

import os
import signal
import sys
import time
import uuid

V1_ROOT = "/sys/fs/cgroup/memory"

#: A fake nvcc: ``--version`` answers like nvcc 13.0; a compile allocates and touches
#: $FAKE_NVCC_MB MB, holds it $FAKE_NVCC_HOLD s, logs "start/end TIME PID" to $FAKE_NVCC_LOG,
#: and writes the object (-o) and dependency file (-MF).
FAKE_NVCC = f"""#!/bin/sh
case "$1" in --version) echo "Cuda compilation tools, release 13.0, V13.0.88"; exit 0;; esac
exec {sys.executable} -c '
import os, sys, time
a = sys.argv[1:]
log = os.environ["FAKE_NVCC_LOG"]
with open(log, "a") as f: f.write("start %f %d\\n" % (time.time(), os.getpid()))
block = b"\\x01" * (int(os.environ.get("FAKE_NVCC_MB", "400")) << 20)
time.sleep(float(os.environ.get("FAKE_NVCC_HOLD", "1.5")))
out = a[a.index("-o") + 1]
open(out, "w").write("object")
if "-MF" in a: open(a[a.index("-MF") + 1], "w").write(out + ": \\n")
with open(log, "a") as f: f.write("end %f %d\\n" % (time.time(), os.getpid()))
' "$@"
"""

#: A fake host compiler / linker: writes the file named by -o.
FAKE_CXX = """#!/bin/sh
out=""; while [ $# -gt 0 ]; do [ "$1" = "-o" ] && out="$2"; shift; done
echo linked > "$out"
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
