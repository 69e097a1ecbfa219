"""GPU check: build through flashinfer-sm120 in a fresh JIT workspace, check what was built,
and run it on the GPU against plain-torch references.

    python benchmarks/gpu_check.py --out DIR [--arch 12.0] [--modules sampling,decode,prefill]
                                   [--jobs N] [--budget 480] [--cpu-only]

Checks (one JSON, ``DIR/gpu_check.json``, and a table on stdout):

``build``        ``flashinfer-sm120 build`` of the modules a server uses first (sampling, bf16
                 decode and FA2 prefill at head dim 128) in a new FLASHINFER_WORKSPACE_BASE.
``sass``         every built ``.so`` holds SASS for each target (and, on a GPU, exact code for
                 that GPU), from the fatbin headers ``cuobjdump FILE`` prints.
``link``         ``NEEDED``/``RPATH`` of every ``.so`` (binutils' ``readelf -d``): the driver's
                 ``libcuda.so.1`` by SONAME, never the link stub; torch's ``libcudart`` major.
GPU only (skipped with the reason where ``torch.cuda.is_available()`` is false):
``sampling``     ``top_k_top_p_sampling_from_probs``: the same seed gives the same samples, no
                 sample outside the top-k/top-p set, and 100 000 samples fit the reference
                 distribution (chi-square, 2 degrees of freedom, below 20: p < 5e-5 by chance).
``decode``       ``BatchDecodeWithPagedKVCacheWrapper`` (fa2, bf16, head dim 128, GQA 32/8,
                 paged, shuffled pages) against ``torch.nn.functional.scaled_dot_product_attention``.
``prefill``      ``BatchPrefillWithRaggedKVCacheWrapper`` (fa2, bf16, head dim 128, causal) likewise.
``runtime link`` ``/proc/self/maps`` after those calls: libcuda from the driver, one libcudart (torch's).
``warm``         a second process on the warm cache: zero compiles, time to first kernel call.
``overhead``     steady-state kernel time with the shim and without it (FlashInfer alone, given the
                 same ``CUDA_HOME`` and the same built modules): the ratio must be 1.00 +- noise.

At most ``--budget`` seconds (default 480) in all.  Without a GPU (CI), pass ``--arch`` and the
CPU part (build, sass, link) runs; ``--modules activation`` keeps it to one small module.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import math
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

_T0 = time.perf_counter()  # a child's clock for "time to first kernel call" starts here

DEFAULT_MODULES = ("sampling", "decode", "prefill")
CHECKS = ("build", "sass", "link", "sampling", "decode", "prefill", "runtime link", "warm", "overhead")
GPU_CHECKS = CHECKS[3:]
SAMPLING_PROBS = (0.30, 0.25, 0.20, 0.10, 0.08, 0.04, 0.02, 0.01)
SAMPLING_TOP_K, SAMPLING_TOP_P, SAMPLING_N, SAMPLING_SEED = 5, 0.7, 100_000, 1234
CHI2_LIMIT = 20.0  # 2 degrees of freedom: P(chi2 > 20) = 4.5e-5
ATOL = RTOL = 2e-2  # bf16 attention output against a float32 reference
TIMING_ITERS, TIMING_REPEATS = 50, 9


# ----------------------------------------------------------------------------- references (pure torch)


def reference_top_k_top_p(probs, top_k: int, top_p: float):
    """The distribution ``top_k_top_p_sampling_from_probs(filter_apply_order="top_k_first")`` samples
    from: keep the ``top_k`` largest, renormalise, keep the smallest prefix (largest first) whose sum
    reaches ``top_p``, renormalise (FlashInfer 0.7.4 ``flashinfer/sampling.py`` docstrings of
    ``top_k_renorm_probs`` and ``top_p_renorm_probs``)."""
    import torch

    _, idx = torch.sort(probs, descending=True)
    q = torch.zeros_like(probs)
    q[idx[:top_k]] = probs[idx[:top_k]]
    q = q / q.sum()
    vals, idx = torch.sort(q, descending=True)
    n = int((torch.cumsum(vals, 0) < top_p).sum()) + 1
    out = torch.zeros_like(q)
    out[idx[:n]] = q[idx[:n]]
    return out / out.sum()


def chi_square(counts, expected) -> tuple[float, int]:
    """``(statistic, samples outside the support)`` of observed counts against expected counts."""
    stat, outside = 0.0, 0
    for c, e in zip(counts, expected):
        if e > 0:
            stat += (c - e) ** 2 / e
        else:
            outside += int(c)
    return stat, outside


def sdpa_reference(q, k, v, causal: bool):
    """Attention of ``q [Lq, Hq, D]`` over ``k, v [Lk, Hkv, D]`` (GQA: kv heads repeated) with
    ``scaled_dot_product_attention`` in float32; causal masks align at the bottom right."""
    import torch

    group = q.shape[1] // k.shape[1]
    qf, kf, vf = (t.float().transpose(0, 1) for t in (q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)))
    mask = None
    if causal:
        lq, lk = q.shape[0], k.shape[0]
        mask = torch.ones(lq, lk, dtype=torch.bool, device=q.device).tril(diagonal=lk - lq)
    return torch.nn.functional.scaled_dot_product_attention(qf, kf, vf, attn_mask=mask).transpose(0, 1)


def close(out, ref) -> tuple[bool, float]:
    """``(|out - ref| <= ATOL + RTOL |ref| everywhere, max abs error)``."""
    err = (out.float() - ref).abs()
    return bool((err <= ATOL + RTOL * ref.abs()).all()), float(err.max())


# ----------------------------------------------------------------------------- GPU checks (child process)


def _sync(torch, dev: str) -> None:
    if str(dev).startswith("cuda"):
        torch.cuda.synchronize()


def check_sampling(torch, flashinfer, dev: str = "cuda") -> dict:
    row = torch.tensor(SAMPLING_PROBS, device=dev, dtype=torch.float32)
    probs = row.expand(SAMPLING_N, row.numel()).contiguous()
    draws = []
    for _ in range(2):
        gen = torch.Generator(device=dev)
        gen.manual_seed(SAMPLING_SEED)
        draws.append(flashinfer.sampling.top_k_top_p_sampling_from_probs(
            probs, SAMPLING_TOP_K, SAMPLING_TOP_P, generator=gen))
    _sync(torch, dev)
    same = bool(torch.equal(draws[0], draws[1]))
    counts = torch.bincount(draws[0].long(), minlength=row.numel()).cpu().tolist()
    expected = (reference_top_k_top_p(row.cpu(), SAMPLING_TOP_K, SAMPLING_TOP_P) * SAMPLING_N).tolist()
    stat, outside = chi_square(counts, expected)
    ok = same and outside == 0 and stat < CHI2_LIMIT
    return {"pass": ok, "same_seed_same_samples": same, "outside_support": outside, "chi2": round(stat, 3),
            "counts": counts, "expected": [round(e, 1) for e in expected]}


def _paged(torch, kv_lens, page, hkv, d, dev):
    """A paged KV cache in FlashInfer's NHD layout ``[pages, 2, page_size, kv_heads, head_dim]``,
    pages handed out in shuffled order (``indices``), ``indptr`` per request, ``last_page_len``."""
    pages = [math.ceil(n / page) for n in kv_lens]
    total = sum(pages)
    indices = torch.randperm(total, device=dev).int()
    indptr = torch.tensor([0] + list(itertools_accumulate(pages)), device=dev, dtype=torch.int32)
    last = torch.tensor([n - (p - 1) * page for n, p in zip(kv_lens, pages)], device=dev, dtype=torch.int32)
    cache = torch.randn(total, 2, page, hkv, d, device=dev, dtype=torch.bfloat16)
    return indptr, indices, last, cache


def itertools_accumulate(xs):
    s = 0
    for x in xs:
        s += x
        yield s


def _gather(cache, indices, start, n_pages, length, which):
    pages = cache[indices[start:start + n_pages].long(), which]  # [n_pages, page, Hkv, D]
    return pages.reshape(-1, *pages.shape[2:])[:length]


def check_decode(torch, flashinfer, dev: str = "cuda", kv_lens=(1, 37, 128, 515), hq=32, hkv=8, d=128,
                 page=16) -> dict:
    torch.manual_seed(0)
    indptr, indices, last, cache = _paged(torch, kv_lens, page, hkv, d, dev)
    q = torch.randn(len(kv_lens), hq, d, device=dev, dtype=torch.bfloat16)
    ws = torch.zeros(128 << 20, dtype=torch.uint8, device=dev)
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", backend="fa2")
    w.plan(indptr, indices, last, hq, hkv, d, page, pos_encoding_mode="NONE",
           q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
    out = w.run(q, cache)
    worst, ok = 0.0, True
    for b, n in enumerate(kv_lens):
        start, count = int(indptr[b]), int(indptr[b + 1] - indptr[b])
        k, v = (_gather(cache, indices, start, count, n, i) for i in (0, 1))
        good, err = close(out[b:b + 1], sdpa_reference(q[b:b + 1], k, v, causal=False))
        ok, worst = ok and good, max(worst, err)
    return {"pass": ok, "max_abs_err": round(worst, 5), "kv_lens": list(kv_lens), "heads": [hq, hkv], "head_dim": d,
            "timing": lambda: w.run(q, cache)}


def check_prefill(torch, flashinfer, dev: str = "cuda", lens=(1, 17, 100, 333), hq=32, hkv=8, d=128) -> dict:
    torch.manual_seed(1)
    indptr = torch.tensor([0] + list(itertools_accumulate(lens)), device=dev, dtype=torch.int32)
    total = int(indptr[-1])
    q = torch.randn(total, hq, d, device=dev, dtype=torch.bfloat16)
    k, v = (torch.randn(total, hkv, d, device=dev, dtype=torch.bfloat16) for _ in range(2))
    ws = torch.zeros(128 << 20, dtype=torch.uint8, device=dev)
    w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD", backend="fa2")
    w.plan(indptr, indptr, hq, hkv, d, causal=True, q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
    out = w.run(q, k, v)
    worst, ok = 0.0, True
    for b in range(len(lens)):
        s, e = int(indptr[b]), int(indptr[b + 1])
        good, err = close(out[s:e], sdpa_reference(q[s:e], k[s:e], v[s:e], causal=True))
        ok, worst = ok and good, max(worst, err)
    return {"pass": ok, "max_abs_err": round(worst, 5), "lens": list(lens), "heads": [hq, hkv], "head_dim": d,
            "timing": lambda: w.run(q, k, v)}


def time_call(torch, fn, dev: str = "cuda") -> dict:
    """Median microseconds per call over :data:`TIMING_REPEATS` rounds of :data:`TIMING_ITERS`
    calls (CUDA events; the wall clock on a CPU device)."""
    iters = TIMING_ITERS
    for _ in range(5):
        fn()
    _sync(torch, dev)
    per = []
    for _ in range(TIMING_REPEATS):
        if not str(dev).startswith("cuda"):
            t = time.perf_counter()
            for _ in range(iters):
                fn()
            per.append((time.perf_counter() - t) * 1e6 / iters)
            continue
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(iters):
            fn()
        b.record()
        b.synchronize()
        per.append(a.elapsed_time(b) * 1000.0 / iters)
    per.sort()
    med = per[len(per) // 2]
    return {"us": round(med, 3), "spread": round((per[-1] - per[0]) / med, 4) if med else None}


def child_main(mode: str, dev: str = "cuda") -> None:
    """Run the GPU checks in this process (``mode``: ``shim`` or ``alone``) and print one ``@@`` JSON
    line (``dev`` is ``cuda``; the tests run the same code on ``cpu`` with stand-ins)."""
    out: dict = {"mode": mode}
    try:
        if mode == "shim":
            import flashinfer_sm120  # noqa: F401  (the hooks; FlashInfer is patched on import)
        import torch

        cuda = dev.startswith("cuda")
        if cuda:
            torch.cuda.init()  # loads the driver's libcuda and torch's libcudart
        with open("/proc/self/maps") as fh:
            out["maps_before"] = fh.read()
        import flashinfer

        out["gpu_name"] = torch.cuda.get_device_name(0) if cuda else dev
        out["import_s"] = round(time.perf_counter() - _T0, 3)
        checks = {}
        for name, fn in (("sampling", check_sampling), ("decode", check_decode), ("prefill", check_prefill)):
            t = time.perf_counter()
            try:
                checks[name] = fn(torch, flashinfer, dev=dev)
            except Exception as exc:  # a failed check, not a failed run
                checks[name] = {"pass": False, "error": f"{type(exc).__name__}: {exc}"[:2000]}
            _sync(torch, dev)
            checks[name]["seconds"] = round(time.perf_counter() - t, 3)
            if name == "sampling":
                out["first_call_s"] = round(time.perf_counter() - _T0, 3)
        probs = torch.softmax(torch.randn(64, 32000, device=dev), -1)
        timers = {"sampling": lambda: flashinfer.sampling.top_k_top_p_sampling_from_probs(probs, 50, 0.9)}
        timers.update({n: c.pop("timing") for n, c in checks.items() if "timing" in c})
        out["timing"] = {}
        for n, fn in timers.items():
            try:
                out["timing"][n] = time_call(torch, fn, dev)
            except Exception as exc:
                out["timing"][n] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
        out["checks"] = checks
        with open("/proc/self/maps") as fh:
            out["maps_after"] = fh.read()
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"[:2000]
    sys.stdout.write("\n@@" + json.dumps(out) + "\n")
    sys.stdout.flush()


# ----------------------------------------------------------------------------- parent


def _run(argv: list[str], env: dict, timeout: float) -> tuple[int | None, str, str]:
    """Run a child in its own session; on timeout kill its whole group.  ``(rc or None, out, err)``."""
    with tempfile.TemporaryFile() as so, tempfile.TemporaryFile() as se:
        p = subprocess.Popen(argv, env=env, stdout=so, stderr=se, stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            rc = p.wait(timeout=max(1.0, timeout))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            rc = None
        so.seek(0)
        se.seek(0)
        return rc, so.read().decode("utf-8", "replace"), se.read().decode("utf-8", "replace")


def _child_result(text: str, what: str) -> dict:
    from flashinfer_sm120.safety.formats.reads import loads_json

    line = next((ln for ln in reversed(text.splitlines()) if ln.startswith("@@")), None)
    if line is None:
        raise RuntimeError(f"{what} printed no result")
    return loads_json(line[2:], what, max_depth=8)


def _snapshot(jit_dir: str) -> dict:
    """Per module: the ``.so`` (mtime, size) and the length of ninja's log (grows on every compile)."""
    snap = {}
    try:
        names = os.listdir(jit_dir)
    except OSError:
        return snap
    for n in names:
        d = os.path.join(jit_dir, n)
        so, log = os.path.join(d, f"{n}.so"), os.path.join(d, ".ninja_log")
        st = os.stat(so) if os.path.exists(so) else None
        snap[n] = ((st.st_mtime_ns, st.st_size) if st else None, os.path.getsize(log) if os.path.exists(log) else 0)
    return snap


def _compiled(before: dict, after: dict) -> list[str]:
    return sorted(n for n, v in after.items() if before.get(n) != v)


class Report:
    def __init__(self, args) -> None:
        self.data: dict = {"schema": 1, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                           "host": platform.node(), "budget_s": args.budget, "checks": {}, "timings": {}}
        self.start = time.monotonic()
        self.budget = args.budget

    def left(self) -> float:
        return self.budget - (time.monotonic() - self.start)

    def check(self, name: str, status: str, detail: str, seconds: float | None = None, **extra) -> None:
        self.data["checks"][name] = {"status": status, "detail": detail, "seconds": seconds, **extra}


def _gpu_facts() -> dict:
    facts: dict = {}
    try:  # first: with NVML missing, the GPUs are read from torch.cuda once torch is imported
        import torch

        facts["torch"], facts["torch_cuda"] = torch.__version__, torch.version.cuda
        facts["cuda_available"] = bool(torch.cuda.is_available())
    except Exception as exc:
        facts["torch"], facts["torch_cuda"], facts["cuda_available"] = repr(exc), None, False
    try:
        from flashinfer_sm120.core.facts import gpus

        q = gpus.query()
        facts["gpus"] = [{"name": g.name, "capability": f"{g.capability[0]}.{g.capability[1]}"} for g in q.gpus]
        facts["gpu_source"] = q.describe()
    except Exception as exc:
        facts["gpus"], facts["gpu_error"] = [], repr(exc)
    try:
        import pynvml

        pynvml.nvmlInit()
        v = pynvml.nvmlSystemGetDriverVersion()
        facts["driver"] = v.decode() if isinstance(v, bytes) else str(v)
        pynvml.nvmlShutdown()
    except Exception:
        facts["driver"] = None
    return facts


def _build(rep: Report, args, env: dict) -> dict | None:
    argv = [sys.executable, "-m", "flashinfer_sm120", "build", *args.modules, "--json", "--head-dim", "128",
            "--dtype", "bf16"] + (["-j", str(args.jobs)] if args.jobs else []) + (["--arch", args.arch] if args.arch else [])
    t = time.monotonic()
    rc, out, err = _run(argv, env, min(rep.left() - (150 if rep.data["cuda_available"] else 0), 420))
    secs = round(time.monotonic() - t, 1)
    try:
        from flashinfer_sm120.safety.formats.reads import loads_json

        built = loads_json(out, "flashinfer-sm120 build --json")
    except Exception:
        built = None
    if rc != 0 or not isinstance(built, dict):
        tail = err.strip()
        if len(tail) > 1500:  # the last whole lines: the error, never a line cut at its start
            tail = tail[-1500:].partition("\n")[2] or tail[-1500:]
        rep.check("build", "fail", f"exit {rc}: {tail}", secs)
        return built if isinstance(built, dict) else None
    mods = built["modules"]
    rep.check("build", "pass", ", ".join(f"{m['module']} {m['status']} {m['seconds']} s" for m in mods), secs,
              modules=[{k: m.get(k) for k in ("module", "name", "status", "seconds", "bytes", "library")} for m in mods])
    rep.data.update(toolkit={"cuda_home": built["cuda_home"], "cuda_version": built["cuda_version"]},
                    targets=built["target_cuda_archs"], flashinfer=built["flashinfer"])
    return built


def _cuobjdump(home: str) -> str | None:
    """The toolkit's ``cuobjdump``, else an NVIDIA wheel's on ``sys.path``, else ``PATH``'s."""
    cands = [os.path.join(home, "bin", "cuobjdump")]
    for d in filter(None, sys.path):
        cands += sorted(glob.glob(os.path.join(glob.escape(d), "nvidia", "cu1[0-9]", "bin", "cuobjdump")), reverse=True)
        cands.append(os.path.join(d, "nvidia", "cuda_cuobjdump", "bin", "cuobjdump"))
    for c in cands + [shutil.which("cuobjdump") or ""]:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def module_targets(lib: str, cuobjdump: str) -> dict:
    """``{"sass": [...], "ptx": [...]}`` of a ``.so`` from its fatbin headers (``arch = sm_120f``, suffix kept)."""
    out, kind = {"sass": set(), "ptx": set()}, None
    text = subprocess.run([cuobjdump, lib], capture_output=True, text=True, errors="replace", timeout=120).stdout
    for line in map(str.strip, text.splitlines()):
        if line.startswith("Fatbin ") and line.endswith(" code:"):
            kind = {"elf": "sass", "ptx": "ptx"}.get(line.split()[1])
        elif (m := re.fullmatch(r"arch = sm_([0-9]{2,3}[af]?)", line)) and kind:
            out[kind].add(("sm_" if kind == "sass" else "compute_") + m.group(1))
            kind = None
    return {k: sorted(v) for k, v in out.items()}


def link_problems(lib: str, view: str | None, cuda_major: int) -> tuple[list[str], list[str]]:
    """``(NEEDED, problems)`` of a ``.so``: FlashInfer links ``-L$cuda_home/lib64/stubs -lcudart -lcuda``, so
    the driver's ``libcuda.so.1`` by SONAME, no RPATH into a stub, and torch's ``libcudart`` major must hold."""
    text = subprocess.run(["readelf", "-d", "-W", lib], capture_output=True, text=True, timeout=60).stdout
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(.*)\]", text)
    rpath = [p for v in re.findall(r"\((?:RPATH|RUNPATH)\)\s+Library r(?:un)?path: \[(.*)\]", text)
             for p in v.split(":") if p]
    problems = []
    if "libcuda.so" in needed:
        problems.append(f"{lib} records NEEDED libcuda.so (no version): no driver installs that name")
    for entry in rpath:
        real = os.path.realpath(entry)
        if "/stubs" in entry or (view and (real + "/").startswith(os.path.realpath(view) + "/")):
            problems.append(f"{lib} has RPATH/RUNPATH {entry}: the link stub there would load instead of the driver")
    problems += [f"{lib} needs {n}, torch loads libcudart.so.{cuda_major}" for n in needed
                 if n.startswith("libcudart.so") and n != f"libcudart.so.{cuda_major}"]
    return needed, problems


def runtime_problems(before: set[str], after: set[str], view: str) -> tuple[dict, list[str]]:
    """What loading the modules mapped (``/proc/self/maps`` paths): the driver's libcuda, torch's one libcudart."""
    libs = {when: {k: sorted({os.path.realpath(p) for p in paths if os.path.basename(p).startswith(k + ".so")})
                   for k in ("libcuda", "libcudart")} for when, paths in (("before", before), ("after", after))}
    a, bad = libs["after"], os.path.realpath(view)
    problems = [] if a["libcuda"] else ["libcuda.so.1 is not loaded: no NVIDIA driver library was found at run time"]
    problems += [f"{lib} was loaded as libcuda: a link stub, not the driver" for lib in a["libcuda"]
                 if "/stubs/" in lib or (lib + "/").startswith(bad + "/")]
    if len(a["libcudart"]) > 1:
        problems.append(f"two CUDA runtimes are loaded ({', '.join(a['libcudart'])}): a module brought its own")
    elif libs["before"]["libcudart"] and a["libcudart"] != libs["before"]["libcudart"]:
        problems.append(f"the modules loaded {a['libcudart']} while torch had {libs['before']['libcudart']}")
    return a, problems


def _mapped(text: str) -> set[str]:
    """The file paths of a ``/proc/<pid>/maps`` text (`` (deleted)`` dropped)."""
    return {parts[5].removesuffix(" (deleted)") for line in text.splitlines()
            if len(parts := line.split(None, 5)) == 6 and parts[5].startswith("/")}


def _sass_and_link(rep: Report, libs: list[str], home: str, targets: list[str], caps: list[tuple[int, int]]) -> None:
    cuobjdump = _cuobjdump(home)
    t = time.monotonic()
    per, bad = {}, []
    for lib in libs if cuobjdump else ():
        found = module_targets(lib, cuobjdump)
        per[os.path.basename(lib)] = found["sass"] + found["ptx"]
        miss = [x for x in targets if x not in found["sass"]]
        exact = {x.rstrip("af") for x in found["sass"]}
        miss += [f"{c[0]}.{c[1]}" for c in caps if f"sm_{c[0]}{c[1]}" not in exact]
        if miss:
            bad.append(f"{os.path.basename(lib)} lacks SASS for {', '.join(miss)}")
    if cuobjdump is None:
        rep.check("sass", "skipped", "no cuobjdump (pip install nvidia-cuda-cuobjdump)", None, modules=per)
    else:
        rep.check("sass", "fail" if bad else "pass", "; ".join(bad) or f"SASS for {' '.join(targets)} in all "
                  f"{len(libs)} module(s)" + (" and exact code for the GPU" if caps else ""),
                  round(time.monotonic() - t, 2), modules=per)
    major = int(str(rep.data.get("torch_cuda") or rep.data["toolkit"]["cuda_version"]).split(".")[0])
    view = home if os.path.isfile(os.path.join(home, "flashinfer_sm120_view.json")) else None
    needed, problems = {}, []
    for lib in libs:
        needed[os.path.basename(lib)], p = link_problems(lib, view, major)
        problems += p
    rep.check("link", "fail" if problems else "pass", "; ".join(problems) or
              f"no unversioned libcuda.so, no RPATH into a stub, libcudart.so.{major}", None, needed=needed)


def _gpu_runs(rep: Report, env: dict, home: str, jit_dir: str) -> None:
    me = [sys.executable, os.path.abspath(__file__), "--child"]
    before = _snapshot(jit_dir)
    t = time.monotonic()
    rc, out, err = _run(me + ["shim"], env, min(rep.left() - 60, 300))
    try:
        cold = _child_result(out, "the GPU check child")
    except Exception as exc:
        cold = {"error": f"the child failed ({'timed out' if rc is None else f'exit {rc}'}): {exc}; "
                         f"{err.strip()[-1500:]}"}
    if cold.get("error") or not cold.get("checks"):
        for name in GPU_CHECKS:
            rep.check(name, "fail", cold.get("error") or "the child ran no check", round(time.monotonic() - t, 1))
        return
    compiled = _compiled(before, _snapshot(jit_dir))
    rep.data["gpu_name"] = cold.get("gpu_name")
    for name, c in (cold.get("checks") or {}).items():
        detail = c.get("error") or ", ".join(f"{k}={v}" for k, v in c.items() if k not in ("pass", "seconds", "counts",
                                                                                          "expected"))
        rep.check(name, "pass" if c.get("pass") else "fail", detail, c.get("seconds"),
                  **{k: v for k, v in c.items() if k in ("counts", "expected", "max_abs_err")})
    before, after = (_mapped(cold.get(k, "")) for k in ("maps_before", "maps_after"))
    facts, problems = runtime_problems(before, after, home)
    loaded = sorted(p for p in after if p.startswith(os.path.realpath(jit_dir)))
    rep.check("runtime link", "fail" if problems else "pass", "; ".join(problems) or
              f"libcuda {', '.join(facts['libcuda'])}; libcudart {', '.join(facts['libcudart'])}", None,
              modules_loaded=loaded, compiled_at_first_call=compiled)
    rep.data["timings"]["shim"] = cold.get("timing")
    rep.data["timings"]["cold_first_call_s"] = cold.get("first_call_s")
    # a second process on the warm cache
    before = _snapshot(jit_dir)
    t = time.monotonic()
    rc, out, err = _run(me + ["shim"], env, min(rep.left() - 30, 120))
    wall = round(time.monotonic() - t, 1)
    try:
        warm = _child_result(out, "the warm child")
        again = _compiled(before, _snapshot(jit_dir))
        ok = not again and not warm.get("error") and all(c.get("pass") for c in warm["checks"].values())
        rep.check("warm", "pass" if ok else "fail", f"{len(again)} compiles {again or ''}; first kernel call "
                  f"{warm.get('first_call_s')} s after start (import {warm.get('import_s')} s)", wall,
                  compiles=again, first_call_s=warm.get("first_call_s"))
        rep.data["timings"]["warm_first_call_s"] = warm.get("first_call_s")
    except Exception as exc:
        rep.check("warm", "fail", f"exit {rc}: {exc}; {err.strip()[-800:]}", wall)
    _overhead(rep, env, home, jit_dir, cold.get("timing") or {})


def _overhead(rep: Report, env: dict, home: str, jit_dir: str, shim: dict) -> None:
    """FlashInfer alone (shim disabled), same CUDA_HOME, its workspace pointing at the same modules."""
    ws = os.path.dirname(jit_dir)                     # .../<version>/<arch>/<nvcc tag>
    plain = os.path.dirname(ws)                       # FlashInfer's own .../<version>/<arch>
    for sub in ("cached_ops", "generated"):
        if os.path.isdir(os.path.join(ws, sub)) and not os.path.lexists(os.path.join(plain, sub)):
            os.symlink(os.path.join(ws, sub), os.path.join(plain, sub))
    env2 = dict(env, FLASHINFER_SM120_DISABLE="1", CUDA_HOME=home)
    t = time.monotonic()
    if rep.left() < 45:
        rep.check("overhead", "skipped", f"{rep.left():.0f} s of the budget left")
        return
    rc, out, err = _run([sys.executable, os.path.abspath(__file__), "--child", "alone"], env2, rep.left() - 10)
    try:
        alone = _child_result(out, "the shim-less child").get("timing") or {}
    except Exception as exc:
        rep.check("overhead", "fail", f"exit {rc}: {exc}; {err.strip()[-800:]}", round(time.monotonic() - t, 1))
        return
    ratios, ok = {}, True
    for k, s in shim.items():
        a = alone.get(k) or {}
        if "us" not in s or "us" not in a:
            continue
        noise = max(0.05, 3 * max(s.get("spread") or 0, a.get("spread") or 0))
        r = a["us"] / s["us"]
        ratios[k] = {"shim_us": s["us"], "alone_us": a["us"], "ratio": round(r, 3), "tolerance": round(noise, 3)}
        ok = ok and abs(r - 1.0) <= noise
    rep.data["timings"]["alone"] = alone
    rep.check("overhead", "pass" if ok and ratios else "fail", ", ".join(
        f"{k} {v['ratio']:.3f} (+-{v['tolerance']:.2f})" for k, v in ratios.items()) or "no timings",
        round(time.monotonic() - t, 1), ratios=ratios)


def _table(rep: dict) -> str:
    """One row per check, its detail's first line shortened at a word; each shortened detail whole below."""
    rows, whole = [("check", "status", "s", "detail")], []
    for name, c in rep["checks"].items():
        short = " ".join(c["detail"].split())
        if len(short) > 110:
            short = textwrap.shorten(short, 110, placeholder=" [whole below]")
            whole.append(f"{name}: {c['detail']}")
        rows.append((name, c["status"], "" if c["seconds"] is None else f"{c['seconds']:g}", short))
    w = [max(len(r[i]) for r in rows) for i in range(3)]
    table = "\n".join(f"{r[0]:<{w[0]}}  {r[1]:<{w[1]}}  {r[2]:>{w[2]}}  {r[3]}" for r in rows)
    return "\n\n".join([table, *whole])


def _targets(rep: dict, args) -> str:
    """The targets built, else what was asked (``--arch``, or the GPUs seen), so a failed build still names them."""
    if rep.get("targets"):
        return " ".join(rep["targets"])
    if args.arch:
        return f"--arch {args.arch} (not built)"
    return " ".join(f"capability {g['capability']}" for g in rep.get("gpus", [])) + " (not built)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="directory for gpu_check.json (created)")
    ap.add_argument("--arch", help="targets when no GPU is visible, e.g. 12.0 (sets FLASHINFER_CUDA_ARCH_LIST)")
    ap.add_argument("--modules", default=",".join(DEFAULT_MODULES), help="modules for 'build' (comma separated)")
    ap.add_argument("--jobs", type=int, help="parallel compile steps (default: build's)")
    ap.add_argument("--budget", type=float, default=480.0, help="seconds for everything (default 480)")
    ap.add_argument("--cpu-only", action="store_true", help="skip the GPU checks even when a GPU is visible")
    ap.add_argument("--keep", action="store_true", help="keep the JIT workspace under --out")
    ap.add_argument("--child", choices=("shim", "alone"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child_main(args.child)
        return 0
    args.modules = [m for m in args.modules.replace(" ", ",").split(",") if m]
    args.out = os.path.abspath(args.out)  # builds and children run elsewhere and refuse relative cache paths
    os.makedirs(args.out, exist_ok=True)
    rep = Report(args)
    rep.data.update(_gpu_facts())
    gpu = rep.data["cuda_available"] and not args.cpu_only
    if not rep.data.get("gpus") and not args.arch:
        print("gpu_check: no GPU visible; pass --arch (e.g. --arch 12.0) to run the CPU part", file=sys.stderr)
        return 2
    work = tempfile.mkdtemp(prefix="gpu-check-", dir=args.out)
    env = {k: v for k, v in os.environ.items() if k not in ("FLASHINFER_SM120_DISABLE", "FLASHINFER_CUDA_ARCH_LIST")}
    env.update(FLASHINFER_WORKSPACE_BASE=os.path.join(work, "base"), FLASHINFER_SM120_CACHE_DIR=os.path.join(work, "sm120"),
               FLASHINFER_SM120_QUIET="1")
    if args.arch:
        env["FLASHINFER_CUDA_ARCH_LIST"] = args.arch
    try:
        built = _build(rep, args, env)
        if built and rep.data["checks"]["build"]["status"] == "pass":
            libs = [m["library"] for m in built["modules"]]
            caps = [tuple(int(x) for x in g["capability"].split(".")) for g in rep.data.get("gpus", [])] if gpu else []
            _sass_and_link(rep, libs, built["cuda_home"], built["target_cuda_archs"], caps)
            if gpu:
                jit_dir = os.path.dirname(os.path.dirname(libs[0]))
                _gpu_runs(rep, env, built["cuda_home"], jit_dir)
                every = [so for e in os.scandir(jit_dir) if os.path.isfile(so := os.path.join(e.path, f"{e.name}.so"))]
                if set(every) - set(libs):  # modules JIT-built at first call: check those too
                    _sass_and_link(rep, every, built["cuda_home"], built["target_cuda_archs"], caps)
    finally:
        why = ("--cpu-only" if args.cpu_only else "torch.cuda.is_available() is false (no GPU or a CPU build of torch)")
        for name in CHECKS:  # every check has a line, in order; those not run say why
            if name not in rep.data["checks"]:
                rep.check(name, "skipped", why if not gpu and name in GPU_CHECKS else
                          "not run: an earlier step failed or the budget ran out")
        rep.data["checks"] = {n: rep.data["checks"][n] for n in CHECKS}
        rep.data["wall_s"] = round(time.monotonic() - rep.start, 1)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        path = os.path.join(args.out, "gpu_check.json")
        with open(path, "w") as fh:
            json.dump(rep.data, fh, indent=2)
    print(_table(rep.data))
    print(f"\n{rep.data.get('gpu_name') or ', '.join(g['name'] for g in rep.data.get('gpus', [])) or 'no GPU'}; "
          f"targets {_targets(rep.data, args)}; {rep.data['wall_s']} s; JSON: {path}")
    return 1 if any(c["status"] == "fail" for c in rep.data["checks"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
