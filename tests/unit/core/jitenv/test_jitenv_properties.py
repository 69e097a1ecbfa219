"""Hypothesis properties of the readers of S2 input (P6): the compile-memory
estimates file, the launcher-probe memo, MAX_JOBS/FLASHINFER_NVCC_THREADS as FlashInfer reads
them, and the ninja log header of a JIT directory.  Property: whatever the bytes or value, no
exception escapes, a malformed entry is dropped (never used), and what is kept has the right type."""

from __future__ import annotations

import json
import os

from hypothesis import given, strategies as st


leaf = st.one_of(st.none(), st.booleans(), st.integers(-(1 << 70), 1 << 70), st.floats(allow_nan=False),
                 st.text(max_size=20), st.sampled_from(["sampling", "light", "other", "attention", "ok", "at"]))
value = st.recursive(leaf, lambda c: st.one_of(st.lists(c, max_size=5), st.dictionaries(
    st.one_of(st.text(max_size=12), st.sampled_from(["schema", "families", "peaks", "entries", "ok", "at",
                                                     "launcher_version", "problem", "stat", "light", "sampling"])), c,
    max_size=5)), max_leaves=25)
raw = st.one_of(value.map(lambda v: json.dumps(v).encode()),
                value.map(lambda v: json.dumps({"schema": 2, "entries": v}).encode()),
                value.map(lambda v: json.dumps({"schema": 2, "entries": {"k": v}}).encode()),
                st.binary(max_size=200), st.just(b'"' + b'\\"' * 5000), st.just(b"[" * 5000))


def _plant(path: str, data: bytes) -> None:
    """Put ``data`` where the package keeps one of its state files (its directory made private)."""
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    with open(path, "wb") as fh:
        fh.write(data)


@given(data=raw)
def test_estimates_file_property(cache_dir, data):
    from flashinfer_sm120.core.jitenv import memory
    from flashinfer_sm120.warmup import plan

    path = memory.ESTIMATES.path()
    _plant(path, data)
    got = memory.recorded()
    assert all(isinstance(k, str) and v and all(type(p) is int and p > 0 for p in v) for k, v in got.items())
    est = plan.estimate("sampling")
    assert type(est.bytes) is int and est.bytes > 0
    plan.record_peak("sampling", 1 << 30)
    assert (1 << 30) in memory.recorded()["sampling"]


@given(data=raw)
def test_launcher_memo_property(cache_dir, data):
    from flashinfer_sm120.core.jitenv import launcher

    _plant(launcher.MEMO.path(), data)
    hit = launcher.MEMO.lookup("k", None)
    assert hit is None or (launcher.short_text(hit["problem"]) and launcher.short_text(hit["launcher_version"]))
    launcher.MEMO.store("k2", None, {"launcher_version": "0.16.0", "problem": None})
    again = launcher.MEMO.lookup("k2", None)
    assert again is not None and again["problem"] is None and again["launcher_version"] == "0.16.0"


@given(st.one_of(st.text(max_size=30), st.sampled_from(["²", "٣", " 4", "1_0", "+4", "0", "-0", "99999999999",
                                                        "9" * 5000, "\x00", "4\n"])))
def test_max_jobs_and_threads_property(text):
    """Our reading is FlashInfer's, and MAX_JOBS is either used as FlashInfer uses it or refused."""
    from flashinfer_sm120.core.jitenv import memory

    _raw, value, problem = memory.max_jobs({"MAX_JOBS": text})
    try:
        fi = int(text) if text.isdigit() else None  # FlashInfer 0.7.4 _get_num_workers
    except ValueError:
        fi = "raises"
    if problem is None:
        assert value == fi and 1 <= value <= 2**31 - 1  # 0 is ninja's "no limit": refused
    else:
        assert value is None and "MAX_JOBS" in problem and len(problem) < 1000
    _raw, threads = memory.user_threads({"FLASHINFER_NVCC_THREADS": text})
    try:  # FlashInfer 0.7.4 get_nvcc_parallelism_flags
        want = int(text)
    except ValueError:
        want = 1
    assert threads == (want if want >= 1 else 1) or len(text) > 64


@given(st.binary(max_size=120))
def test_ninja_log_format_of_a_directory_property(tmp_path_factory, data):
    from flashinfer_sm120.diagnose.verify.report import log_format_of_dir

    d = tmp_path_factory.mktemp("m")
    (d / ".ninja_log").write_bytes(data)
    got = log_format_of_dir(str(d))
    assert got is None or (type(got) is int and data.startswith(b"# ninja log v"))
