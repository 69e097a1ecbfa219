"""Issue 11: Hypothesis properties for every parser and CLI entry on the input boundary.

For hostile input (huge, deep, wrong-typed, non-UTF-8, whitespace and control
characters, path traversal) each entry point must: raise nothing but the
package's own error type (or return its documented "refused" value), keep its
message under a size bound, and stay within a memory bound (tracemalloc peak).  Example counts are kept small so the
whole file runs in a few seconds; the example database is not kept in the repo.
"""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

from hypothesis import given, strategies as st

from flashinfer_sm120.errors import Sm120Error

MSG_MAX = 4096
MEM_MAX = 64 << 20

_SPECIAL = ["", ".", "..", "/", "//tmp/x", "jit//tmp/x/victim", "a/../b", "a\nb", "a b$c:d", "\x00", "\r\n",
            " 13.0.88\n", "13.0.88", "1e999", "nan", "-1", "$(id)", "`id`", "${PATH:=/x}", "x" * 5000,
            "norm\nbuild x: phony", "\u202e", "\udcff", "12.0f", "12.0", "sm_120", "#", "a#b"]
hostile_text = st.one_of(st.text(max_size=200), st.sampled_from(_SPECIAL),
                         st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x7f), max_size=200))
json_leaf = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), hostile_text)
json_value = st.recursive(json_leaf, lambda c: st.one_of(st.lists(c, max_size=4),
                                                          st.dictionaries(hostile_text, c, max_size=4)),
                          max_leaves=20)
deep = st.integers(1, 3000).map(lambda n: "[" * n + "]" * n)


def _bounded(fn, *args, **kwargs):
    """Run ``fn``; only Sm120Error may escape, its message bounded; memory peak bounded."""
    tracemalloc.start()
    try:
        return fn(*args, **kwargs)
    except Sm120Error as exc:
        assert len(str(exc)) < MSG_MAX, len(str(exc))
        return exc
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert peak < MEM_MAX, peak


# --------------------------------------------------------------------------- wrapper scripts / trust

shell_chars = st.sampled_from(list("abc/$#'\"`\\;&|()<> \t\n*?[]{}=~-!0123456789") + ["exec ", "case ", " in ",
                                                                                         "esac", "if ", "then",
                                                                                         "fi", ";;", "$@"])
script_body = st.one_of(st.lists(shell_chars, max_size=60).map("".join), hostile_text)


@given(st.sampled_from(["#!/bin/sh", "#!/bin/sh -e", "#! /bin/sh", "#!/usr/bin/env sh", "#!sh", "#!/bin/sh -c",
                        "#!/bin/bash", "#!/nonexistent", "#!"]), script_body)
def test_trace_property(tmp_path, head, body):
    """Any script: a Trace comes back (never an exception), its problem bounded; a script
    accepted computes no word when it runs (no command substitution, variable, glob, escape)."""
    import re

    from flashinfer_sm120.safety.trust import trace

    p = tmp_path / "bin" / "nvcc"
    p.parent.mkdir(exist_ok=True)
    p.write_bytes(f"{head}\n{body}".encode("utf-8", "surrogateescape"))
    p.chmod(0o755)
    t = _bounded(trace, str(p))
    assert not isinstance(t, Exception)
    if t.problem is None and "#" not in body:  # (a comment may hold anything)
        assert not set(re.sub(r"\$[@*#?!$\-1-9]", "", body)) & set("`\\$~*?{}"), body
    else:
        assert t.problem is None or len(t.problem) < MSG_MAX


# --------------------------------------------------------------------------- versions, arch lists, env

@given(st.one_of(json_value, deep))
def test_version_json_property(tmp_path, value):
    from flashinfer_sm120.core.toolkit import probe

    p = tmp_path / "version.json"
    p.write_text(value if isinstance(value, str) and value.startswith("[") else
                 json.dumps({"cuda_nvcc": {"version": value}}))
    got = _bounded(probe._version_json, str(p))
    assert got is None or not any(c.isspace() for c in str(got))


@given(st.one_of(hostile_text, st.integers(0, 200_000).map(lambda n: "x " * n)))
def test_arch_list_property(value):
    from flashinfer_sm120.core.patch.state import arch_specs

    specs, message = _bounded(arch_specs, value)
    assert message is None or len(message) < MSG_MAX


@given(hostile_text)
def test_cuda_home_value_property(value):
    from flashinfer_sm120.core.toolkit import sources

    step = dict(sources.FIND_STEPS)["CUDA_HOME"]
    if "\x00" in value:
        return  # an environment cannot hold NUL
    found = _bounded(step, {"CUDA_HOME": value})
    assert isinstance(found, list)
    assert all(f.problem is None or len(f.problem) < MSG_MAX for f in found)


# --------------------------------------------------------------------------- state files

@given(st.one_of(json_value, deep, st.binary(max_size=300)))
def test_memo_property(tmp_path, monkeypatch, value):
    from flashinfer_sm120.safety.fs import statedir
    from flashinfer_sm120.core.toolkit import memo
    from flashinfer_sm120.safety import ownership

    monkeypatch.setenv("FLASHINFER_SM120_CACHE_DIR", str(tmp_path / "c"))
    statedir.forget_cache_root()
    path = memo.VERSIONS.path()
    raw = value if isinstance(value, bytes) else (value if isinstance(value, str) and value.startswith("[")
                                                   else json.dumps({"schema": memo.Memo.SCHEMA, "entries": {
                                                       "/bin/sh": {"stat": ownership.fingerprint("/bin/sh"),
                                                                   "full": value, "problem": None, "at": 1}}}))
    Path(path).write_bytes(raw if isinstance(raw, bytes) else raw.encode("utf-8", "surrogateescape"))
    hit = _bounded(memo.VERSIONS.lookup, "/bin/sh", ownership.fingerprint("/bin/sh"))
    assert hit is None or (isinstance(hit["full"], str) and hit["full"] == hit["full"].strip())
    statedir.forget_cache_root()


_META_KEYS = ("layout", "toolkit", "nvcc", "nvcc_fingerprint", "curand_include", "owner_uid", "added", "stub_sha256")


@given(st.one_of(json_value, st.fixed_dictionaries({k: json_value for k in _META_KEYS})))
def test_view_meta_property(tmp_path_factory, value):
    from flashinfer_sm120.core.toolkit.model import Toolkit
    from flashinfer_sm120.core.view.meta import META_NAME, check_view

    view = tmp_path_factory.mktemp("view")
    (view / META_NAME).write_text(json.dumps(value))
    home, problem = _bounded(check_view, str(view), Toolkit(root="/nonexistent-toolkit", nvcc="/bin/sh"), None)
    assert home is None and problem is not None and len(problem) < MSG_MAX


# --------------------------------------------------------------------------- manifests

entry_like = st.fixed_dictionaries({}, optional={
    "format": st.one_of(st.just(1), json_leaf), "flashinfer": st.one_of(st.just("0.7.4"), json_value),
    "name": st.one_of(st.just("norm"), hostile_text, json_leaf), "targets": st.one_of(
        st.lists(st.sampled_from(["12.0", "12.0f", 12.0, "1 2", "$x"]), max_size=3), json_value),
    "regenerable": st.one_of(st.booleans(), json_leaf), "spec": json_value, "generated": json_value})


@given(st.one_of(entry_like, json_value))
def test_manifest_entry_property(obj):
    from flashinfer_sm120.errors import FormatError
    from flashinfer_sm120.core.jitenv import record

    try:
        out = record.parse_entry(obj, "m.jsonl:1")
    except FormatError as exc:
        assert len(str(exc)) < MSG_MAX
    else:
        for ch in "\n\0 $:/":
            assert ch not in out["name"]


@given(st.lists(st.one_of(entry_like.map(json.dumps), hostile_text, deep), max_size=5),
       st.binary(max_size=200))
def test_manifest_file_property(tmp_path, lines, tail):
    from flashinfer_sm120.warmup import replay

    m = tmp_path / "m.jsonl"
    m.write_bytes("\n".join(lines).encode("utf-8", "surrogateescape") + b"\n" + tail)
    got = _bounded(replay.load, str(m))
    if not isinstance(got, Exception):
        entries, problems = got
        assert all(len(p) < MSG_MAX for p in problems)


# --------------------------------------------------------------------------- CLI numbers

@given(st.sampled_from(["-j", "--timeout"]), st.one_of(hostile_text, st.integers().map(str),
                                                        st.floats().map(repr)))
def test_cli_numbers_property(flag, value):
    from flashinfer_sm120 import cli
    from flashinfer_sm120.cli import build, doctor

    seen = {}
    old = (build.run_build, doctor.run_doctor)
    build.run_build = doctor.run_doctor = lambda args: seen.setdefault("args", args) and 0
    try:
        argv = ["build", "norm", "-j", value] if flag == "-j" else ["doctor", "--timeout", value]
        try:
            cli.main(argv)
        except SystemExit as exc:
            assert exc.code == 2
            return
    finally:
        build.run_build, doctor.run_doctor = old
    args = seen["args"]
    if flag == "-j":
        assert 1 <= args.jobs <= 4096
    else:
        import math

        assert math.isfinite(args.timeout) and 0.1 <= args.timeout <= 3600


# --------------------------------------------------------------------------- ASCII digits only

other_digit = st.characters(whitelist_categories=("Nd",)).filter(lambda c: not c.isascii())


@given(st.sampled_from([("--arch", "12.0"), ("--arch", "12.0 12.1"), ("--arch", "sm_121a"), ("-j", "4"),
                        ("--timeout", "1.5"), ("--mem-limit", "64M"), ("--timeout", "30")]),
       other_digit, st.data())
def test_numbers_take_ascii_digits_only_property(case, digit, data):
    """``int()``, ``float()`` and ``\\d`` take any script's digits: ``--arch '１２.０'`` and ``'١٢.٠'`` were read
    as 12.0 silently.  A value with one digit in another script is refused (exit 2) naming the value and its
    ASCII form, by one rule for arch lists and every numeric option (P6, P8)."""
    import contextlib
    import io
    import unicodedata

    from flashinfer_sm120 import cli
    from flashinfer_sm120.core.facts.arch import parse_arch_list_lenient

    flag, plain = case
    at = data.draw(st.sampled_from([i for i, c in enumerate(plain) if c.isdigit()]))
    zero = ord(digit) - unicodedata.decimal(digit)  # each script's 0-9 run in order (Unicode's rule for Nd)
    value = plain[:at] + chr(zero + int(plain[at])) + plain[at + 1:]
    if flag == "--arch":
        specs, errors = parse_arch_list_lenient(value, source="--arch")
        assert specs == [] and repr(value) in errors[0] and repr(plain) in errors[0], errors
    argv = {"--arch": ["status", "--arch", value], "-j": ["build", "norm", "-j", value],
            "--timeout": ["doctor", "--timeout", value], "--mem-limit": ["build", "norm", "--mem-limit", value]}[flag]
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = cli.main(argv)
        except SystemExit as exc:
            code = exc.code
    assert code == 2 and repr(value) in err.getvalue() and repr(plain) in err.getvalue(), err.getvalue()
