"""The memory policy without root: cgroup v1/v2 and /proc/meminfo read from a copied tree,
unified-memory GPUs through a fake NVML, the jobs/threads plan, recorded estimates, and
the pool admitting modules by their memory estimate."""

import io
import os
import subprocess
import sys
import types

import pytest

from flashinfer_sm120.core.jitenv import memory
from flashinfer_sm120.warmup import moddir, plan, pool

MIB, GIB = 1 << 20, 1 << 30


def _tree(tmp_path, *, v2_path=None, v1_path=None, v2_files=None, v1_files=None, mem_avail_kb=8 << 20,
          mem_total_kb=16 << 20, v2_root="/", v1_root="/"):
    """A /proc and cgroup mounts under tmp_path: ``v2_files``/``v1_files`` map a cgroup
    path (relative to the mount) to {file: text}."""
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    cg_lines, mounts = [], []
    if v2_path is not None:
        cg_lines.append(f"0::{v2_path}")
        point = tmp_path / "cg2"
        mounts.append(f"40 31 0:38 {v2_root} {point} rw,relatime - cgroup2 cgroup2 rw")
        for rel, files in (v2_files or {}).items():
            d = point / rel.strip("/") if rel.strip("/") else point
            d.mkdir(parents=True, exist_ok=True)
            for name, text in files.items():
                (d / name).write_text(text)
    if v1_path is not None:
        cg_lines.append(f"4:memory:{v1_path}")
        point = tmp_path / "cg1 mem"  # a space: mountinfo escapes it as \040
        mounts.append(f"35 31 0:32 {v1_root} {str(point).replace(' ', chr(92) + '040')} rw - cgroup cgroup rw,memory")
        for rel, files in (v1_files or {}).items():
            d = point / rel.strip("/") if rel.strip("/") else point
            d.mkdir(parents=True, exist_ok=True)
            for name, text in files.items():
                (d / name).write_text(text)
    (proc / "self" / "cgroup").write_text("\n".join(cg_lines + ["1:cpu:/"]) + "\n")
    (proc / "self" / "mountinfo").write_text("\n".join(mounts + [
        "22 1 0:21 / /proc rw - proc proc rw"]) + "\n")
    (proc / "meminfo").write_text(f"MemTotal:       {mem_total_kb} kB\nMemFree:        1000 kB\n"
                                  f"MemAvailable:   {mem_avail_kb} kB\n")
    return str(proc)


def test_v2_limit_minus_working_set_lowest_level_wins(tmp_path):
    proc = _tree(tmp_path, v2_path="/kubepods/pod1/ctr", v2_files={
        "/kubepods/pod1/ctr": {"memory.max": "max\n", "memory.current": f"{300 * MIB}\n"},
        "/kubepods/pod1": {"memory.max": f"{1 * GIB}\n", "memory.current": f"{600 * MIB}\n",
                           "memory.stat": f"anon 1\ninactive_file {200 * MIB}\nactive_file 5\n"},
        "/kubepods": {"memory.max": f"{64 * GIB}\n", "memory.current": f"{2 * GIB}\n"},
    })
    view = memory.read_memory(proc_root=proc, gpu=False)
    low = min(view.bounds, key=lambda b: b.available)
    assert low.source.startswith("cgroup v2") and low.source.endswith("kubepods/pod1")
    assert view.available == 1 * GIB - (600 - 200) * MIB  # reclaimable cache is not counted as used
    assert {b.source for b in view.bounds} == {low.source, "MemAvailable"}


def test_v1_unlimited_is_no_limit_and_container_mount_root(tmp_path):
    proc = _tree(tmp_path, v1_path="/docker/abc", v1_root="/docker/abc", v1_files={
        "/": {"memory.limit_in_bytes": "9223372036854771712\n", "memory.usage_in_bytes": "100\n"}})
    view = memory.read_memory(proc_root=proc, gpu=False)
    assert view.source == "MemAvailable" and view.available == (8 << 20) * 1024
    assert any("no memory limit" in n for n in view.notes)
    proc = _tree(tmp_path / "b", v1_path="/docker/abc", v1_root="/docker/abc", v1_files={
        "/": {"memory.limit_in_bytes": f"{2 * GIB}\n", "memory.usage_in_bytes": f"{GIB}\n",
              "memory.stat": f"cache 5\ntotal_inactive_file {256 * MIB}\n"}})
    view = memory.read_memory(proc_root=proc, gpu=False)
    assert view.source.startswith("cgroup v1") and view.available == GIB + 256 * MIB


def test_hostile_files_are_ignored_not_fatal(tmp_path):
    proc = _tree(tmp_path, v2_path="/../../etc", v2_files={"/": {"memory.max": "12abc"}})
    (tmp_path / "proc" / "meminfo").write_text("MemAvailable: lots kB\n" + "x" * 300 + "\n")
    view = memory.read_memory(proc_root=proc, gpu=False)
    assert view.available is None and view.source == "unknown"
    assert "no readable MemAvailable" in " ".join(view.notes)  # there is one: it is not a number (P8)


class _NVMLError(Exception):
    pass


def _fake_nvml(devices):
    """devices: list of (name, (major, minor), memory_used or None=NotSupported, [used per process])."""
    m = types.SimpleNamespace()
    m.nvmlInit = lambda: None
    m.nvmlShutdown = lambda: None
    m.nvmlDeviceGetCount = lambda: len(devices)
    m.nvmlDeviceGetHandleByIndex = lambda i: i
    m.nvmlDeviceGetName = lambda h: devices[h][0]
    m.nvmlDeviceGetCudaComputeCapability = lambda h: devices[h][1]

    def info(h):
        if devices[h][2] is None:
            raise _NVMLError("Not Supported")
        return types.SimpleNamespace(total=128 * GIB, used=devices[h][2], free=0)

    m.nvmlDeviceGetMemoryInfo = info
    m.nvmlDeviceGetComputeRunningProcesses = lambda h: [types.SimpleNamespace(usedGpuMemory=u)
                                                        for u in devices[h][3]]
    m.nvmlDeviceGetGraphicsRunningProcesses = lambda h: []
    return m


def test_gb10_subtracts_what_the_gpu_side_holds_discrete_gpus_do_not(tmp_path, monkeypatch):
    proc = _tree(tmp_path, mem_avail_kb=100 << 20, mem_total_kb=120 << 20)  # 100 of 120 GiB "available"

    def read_memory(proc_root, nvml):
        monkeypatch.setitem(sys.modules, "pynvml", nvml)
        return memory.read_memory(proc_root=proc_root)

    gb10 = _fake_nvml([("NVIDIA GB10", (12, 1), None, [70 * GIB, 10 * GIB])])
    view = read_memory(proc, gb10)
    assert view.source == "unified-memory GPU" and view.available == 40 * GIB
    assert "2 GPU process" in min(view.bounds, key=lambda b: b.available).detail
    rtx = _fake_nvml([("NVIDIA GeForce RTX 5090", (12, 0), 20 * GIB, [])])
    assert read_memory(proc, rtx).source == "MemAvailable"
    unknown = _fake_nvml([("NVIDIA GB10", (12, 1), None, [None])])
    view = read_memory(proc, unknown)
    assert view.source == "MemAvailable" and any("cannot tell" in n for n in view.notes)
    no_nvml = _fake_nvml([("NVIDIA GB10", (12, 1), 70 * GIB, [])])
    no_nvml.nvmlInit = lambda: (_ for _ in ()).throw(_NVMLError("Driver Not Loaded"))
    view = read_memory(proc, no_nvml)  # no NVML: nothing to subtract, nothing to say
    assert view.source == "MemAvailable" and not any("GPU" in n for n in view.notes)
    assert [b.source for b in view.bounds] == ["MemAvailable"]


def test_plan_jobs_threads_and_who_wins(tmp_path):
    view = memory.MemoryView(int(GIB / 0.85) + 10, (memory.Bound("test", int(GIB / 0.85) + 10, "x"),))
    est = memory.Estimate(400 * MIB, "light", "test")
    p = plan.plan(est, env={}, view=view, jobs=8)
    assert (p["jobs"], p["fits"], p["at_once"], p["threads"]) == (8, 2, 2, 1)
    assert "at most 2 of these at once by memory" in " ".join(plan.plan_lines(p))
    p = plan.plan(est, targets=3, env={"FLASHINFER_NVCC_THREADS": "4", "MAX_JOBS": "6"}, view=view)
    assert p["jobs"] == 6 and "yours" in p["jobs_from"] and p["threads"] == 4 and p["per_compile"] == 3 * 400 * MIB
    assert p["at_once"] == 1  # never below one, even when one compile does not fit
    p = plan.plan(est, env={"FLASHINFER_NVCC_THREADS": "x", "MAX_JOBS": "lots"}, view=view)
    assert p["threads"] == 1 and "not >= 1" in p["threads_from"] and "not a positive number" in p["jobs_from"]
    value, why = memory.server_max_jobs(env={"MAX_JOBS": "3"}, view=view)
    assert value is None and "set by you" in why


def test_recorded_peaks_refine_the_family_estimate(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHINFER_SM120_CACHE_DIR", str(tmp_path / "c"))
    from flashinfer_sm120.safety.fs import statedir

    statedir.forget_cache_root()
    assert plan.estimate("sampling").source.startswith("default")
    plan.record_peak("sampling", 900 * MIB)
    plan.record_peak("sampling", 1000 * MIB, threads_factor=2)  # 500 MiB per target
    e = plan.estimate("sampling")
    assert e.family == "sampling" and e.bytes == int(900 * MIB * 1.15) and e.source.startswith("recorded")
    assert plan.estimate("batch_decode_with_kv_cache_dtype_q_bf16").family == "attention"
    assert plan.estimate("fp4_gemm_cutlass_sm120").bytes == 8192 * MIB
    path = memory.ESTIMATES.path()
    with open(path, "w") as fh:
        fh.write('{"schema": 2, "entries": {"sampling": {"peaks": [-5, "x", true], "at": 1}}}')
    assert plan.estimate("sampling").source.startswith("default")  # malformed: dropped
    statedir.forget_cache_root()


def _module(root, name, mem_mb, sleep):
    """A module of one compile step and a link; the step logs start/end with its size."""
    d = root / name
    d.mkdir(parents=True)
    (d / "s.cu").write_text("// src\n")
    log = root / "steps.log"
    lines = ["ninja_required_version = 1.3", "rule cc",
             f"  command = echo start {mem_mb} >> {log}; sleep {sleep}; echo end {mem_mb} >> {log}; cp $in $out",
             "rule link", "  command = cp $in $out", "",
             f"build {d}/s.o: cc {d}/s.cu", f"build {d}/{name}.so: link {d}/s.o", f"default {d}/{name}.so", ""]
    (d / "build.ninja").write_text("\n".join(lines))
    return pool.Job(name, d, d / "build.ninja", None, mem_mb * MIB)


def _peak_mb(log):
    cur = peak = 0
    for line in log.read_text().splitlines():
        what, mb = line.split()
        cur += int(mb) if what == "start" else -int(mb)
        peak = max(peak, cur)
    return peak


def test_pool_admits_by_memory_heavy_and_light_share_the_budget(tmp_path):
    mods = [_module(tmp_path, "heavy1", 700, 1.0), _module(tmp_path, "heavy2", 700, 1.0)]
    mods += [_module(tmp_path, f"light{i}", 100, 0.4) for i in range(4)]
    res = pool.run_pool(mods, 8, io.StringIO(), mem_budget=1000 * MIB)
    assert {r.status for r in res} == {"built"}
    assert _peak_mb(tmp_path / "steps.log") <= 1000  # never more than the budget at once
    log = (tmp_path / "steps.log").read_text().splitlines()
    assert log.index("start 100") < log.index("end 700")  # light ones ran beside a heavy one


def test_pool_starts_one_module_larger_than_the_budget(tmp_path):
    res = pool.run_pool([_module(tmp_path, "huge", 5000, 0.1)], 4, io.StringIO(), mem_budget=100 * MIB)
    assert res[0].status == "built" and res[0].peak_rss and res[0].peak_rss > 0


def _ninjas():
    out = []
    for path in ("/usr/bin/ninja",):
        if os.access(path, os.X_OK):
            out.append(path)
    try:
        import ninja as wheel

        out.append(os.path.join(wheel.BIN_DIR, "ninja"))
    except ImportError:
        pass
    return out


@pytest.mark.parametrize("ninja", _ninjas())
def test_multi_step_modules_grow_into_freed_slots(tmp_path, monkeypatch, ninja):
    """Whatever the ninja release: never more compiles than slots, all built, and FlashInfer's
    own ninja run finds nothing left to do."""
    monkeypatch.setattr(moddir, "ninja_binary", lambda: ninja)
    log = tmp_path / "steps.log"
    mods = []
    for i in range(3):
        d = tmp_path / f"m{i}"
        d.mkdir()
        lines = ["rule cc", f"  command = echo start 1 >> {log}; sleep 0.4; echo end 1 >> {log}; touch $out; true -c $in -o $out",
                 "rule link", "  command = touch $out; true -shared $in -o $out"]
        for k in range(3):
            (d / f"s{k}.cu").write_text("")
            lines.append(f"build {d}/s{k}.o: cc {d}/s{k}.cu")
        lines.append(f"build {d}/m.so: link {d}/s0.o {d}/s1.o {d}/s2.o")
        (d / "build.ninja").write_text("\n".join(lines) + "\n")
        mods.append(pool.Job(f"m{i}", d, d / "build.ninja"))
    res = pool.run_pool(mods, 2, io.StringIO())
    assert {r.status for r in res} == {"built"}
    assert _peak_mb(log) <= 2  # compile steps at once, at most the slots
    for d in mods:  # FlashInfer's own ninja run finds nothing to do
        again = subprocess.run([ninja, "-C", str(d.build_dir), "-f", str(d.ninja_path)], capture_output=True, text=True)
        assert "no work to do" in again.stdout


from hypothesis import given, strategies as st  # noqa: E402

_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=300)


@given(cgroup=_text, mountinfo=_text, meminfo=_text, limit=_text, current=_text, stat=_text)
def test_read_memory_never_raises_on_any_file_contents(tmp_path_factory, cgroup, mountinfo, meminfo, limit,
                                                       current, stat):
    root = tmp_path_factory.mktemp("p")
    proc = root / "proc"
    (proc / "self").mkdir(parents=True)
    point = root / "cg"
    (point / "x").mkdir(parents=True)
    for name, text in (("memory.max", limit), ("memory.current", current), ("memory.stat", stat)):
        (point / "x" / name).write_text(text)
    (proc / "self" / "cgroup").write_text(cgroup + "\n0::/x\n")
    (proc / "self" / "mountinfo").write_text(mountinfo + f"\n1 1 0:1 / {point} rw - cgroup2 cgroup2 rw\n")
    (proc / "meminfo").write_text(meminfo)
    view = memory.read_memory(proc_root=str(proc), gpu=False)
    assert view.available is None or view.available >= 0
    said = memory.budget(memory.Estimate(1, "x", "t"), env={}, view=view).budget_from
    assert len(said) < 2000 and all(len(n) < 600 for n in view.notes)


@given(max_jobs=_text, threads=_text, jobs_flag=st.one_of(st.none(), st.integers(-5, 10 ** 6)))
def test_plan_takes_any_environment(max_jobs, threads, jobs_flag):
    view = memory.MemoryView(GIB, (memory.Bound("t", GIB, "t"),))
    env = {"MAX_JOBS": max_jobs, "FLASHINFER_NVCC_THREADS": threads}
    p = plan.plan(memory.Estimate(100 * MIB, "light", "t"), env=env, view=view, jobs=jobs_flag)
    assert p["jobs"] >= 1 and p["threads"] >= 1 and p["at_once"] >= 1
    assert all(len(line) < 1200 for line in plan.plan_lines(p))


def test_the_estimate_reads_without_nested_brackets():
    """The build plan's memory line read ``1.2 GiB each (default for sampling (measured 1039 MiB))``."""
    for fam in memory.FAMILIES:
        for rec in ({}, {fam.name: [700 << 20, 900 << 20]}):
            src = memory.family_estimate(fam, rec).source
            depth = max_depth = 0
            for ch in f"({src})":
                depth += {"(": 1, ")": -1}.get(ch, 0)
                max_depth = max(max_depth, depth)
            assert max_depth == 1, src
