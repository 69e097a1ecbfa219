"""FlashInfer's variables that enter the build line (flashinfer_sm120/core/facts/buildline.py): the list matches
the installed FlashInfer's code and its generated build.ninja, build records them with each module,
a later build and doctor say when they differ."""

from __future__ import annotations

import ast
import importlib.util
import io
import json
import os
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from helpers.child import run_py
from helpers.host import needs_flashinfer

from flashinfer_sm120.core.facts import buildline
from flashinfer_sm120.diagnose.verify.report import build_line_section

#: Variables FlashInfer reads on the build path that flashinfer-sm120 decides itself (toolkit,
#: targets, directory) or that do not reach build.ninja (logging, the jobs of ninja).
NOT_LISTED = {"CUDA_HOME", "CUDA_PATH", "FLASHINFER_CUDA_ARCH_LIST", "FLASHINFER_WORKSPACE_BASE"}

#: The functions of FlashInfer 0.7.x that write a module's build line.
BUILD_PATH = {"jit/core.py": ("gen_jit_spec",),
              "jit/cpp_ext.py": ("get_nvcc_parallelism_flags", "build_cflags", "build_cuda_cflags",
                                 "generate_ninja_build_for_op", "parse_env_flags", "host_compiler_is_gcc")}


def _env_reads(tree: ast.AST, names: tuple[str, ...]) -> set[str]:
    """String constants passed to os.environ.get / os.getenv / parse_env_flags / os.environ[...] in
    the named functions, plus the string constants assigned to a name read that way."""
    out = set()
    for fn in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name in names):
        consts = {n.value for n in ast.walk(fn) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
        for node in ast.walk(fn):
            if isinstance(node, ast.Call) and node.args:
                f = ast.unparse(node.func)
                if f in ("os.environ.get", "os.getenv", "parse_env_flags") and isinstance(node.args[0], ast.Constant):
                    out.add(node.args[0].value)
                elif f in ("os.environ.get", "os.getenv"):  # a name: env_var_name = "FLASHINFER_..."
                    out |= {c for c in consts if c.isupper() and c.startswith(("FLASHINFER_", "CC", "CXX"))}
    return out


@needs_flashinfer
def test_the_list_is_every_variable_flashinfers_build_path_reads():
    """Read from the installed FlashInfer's code: nothing it reads on the build path is missing
    from the list, and every listed variable is read in the file the list names."""
    root = Path(importlib.util.find_spec("flashinfer").submodule_search_locations[0])
    read = set()
    for rel, names in BUILD_PATH.items():
        read |= _env_reads(ast.parse((root / rel).read_text()), names)
    listed = {v.name for v in buildline.BUILD_VARS}
    assert read - NOT_LISTED == listed, (sorted(read - NOT_LISTED - listed), sorted(listed - read))
    for v in buildline.BUILD_VARS:
        assert v.name in (root.parent / v.where.split()[0]).read_text(), v


def test_effective_reads_each_variable_as_flashinfer_does():
    by = {v.name: v for v in buildline.BUILD_VARS}
    eff = buildline.effective
    assert eff(by["FLASHINFER_JIT_VERBOSE"], {"FLASHINFER_JIT_VERBOSE": "0"}) is None
    assert eff(by["FLASHINFER_JIT_VERBOSE"], {"FLASHINFER_JIT_VERBOSE": "1"}) == "1"
    assert eff(by["FLASHINFER_JIT_VERBOSE"], {"FLASHINFER_JIT_VERBOSE": "1", "FLASHINFER_JIT_DEBUG": "0"}) is None
    assert eff(by["FLASHINFER_NVCC_THREADS"], {"FLASHINFER_NVCC_THREADS": "1"}) is None
    assert eff(by["FLASHINFER_NVCC_THREADS"], {"FLASHINFER_NVCC_THREADS": "x"}) is None  # FlashInfer: 1
    assert eff(by["FLASHINFER_NVCC_THREADS"], {"FLASHINFER_NVCC_THREADS": "4"}) == "4"
    assert eff(by["CC"], {"CC": ""}) == ""  # -ccbin even when empty
    assert eff(by["CXX"], {"CXX": "c++"}) is None and eff(by["CXX"], {"CXX": "g++-13"}) == "g++-13"
    assert eff(by["FLASHINFER_EXTRA_CUDAFLAGS"], {"FLASHINFER_EXTRA_CUDAFLAGS": "  "}) is None
    assert "FLASHINFER_NVCC_LAUNCHER" not in buildline.snapshot({}, "0.6.7")  # no launchers in 0.6.7
    assert "FLASHINFER_NVCC_LAUNCHER" in buildline.snapshot({}, "0.7.2")


#: One child: FlashInfer's own build.ninja for a module, without and with each variable set.
NINJA_PER_VARIABLE = """
    import helpers.fakegpu, json, os, flashinfer_sm120
    from flashinfer_sm120.core.facts import buildline
    from flashinfer_sm120.warmup import modules
    def ninja():
        spec = modules.expand(["activation"])[0].spec()
        spec.write_ninja()
        return spec.ninja_path.read_text()
    base = ninja()
    values = dict(FLASHINFER_JIT_VERBOSE="1", FLASHINFER_JIT_DEBUG="1", FLASHINFER_JIT_LINEINFO="1",
                  FLASHINFER_NVCC_THREADS="2", FLASHINFER_EXTRA_CFLAGS="-DX1", FLASHINFER_EXTRA_CUDAFLAGS="-DX2",
                  FLASHINFER_EXTRA_LDFLAGS="-lm", CC="/usr/bin/gcc", CXX="/usr/bin/g++",
                  FLASHINFER_NVCC=os.path.join(flashinfer_sm120.resolve().home.path, "bin", "nvcc"),
                  FLASHINFER_NVCC_LAUNCHER="/usr/bin/env", FLASHINFER_CXX_LAUNCHER="/usr/bin/env")
    out = {}
    for name, value in values.items():
        os.environ[name] = value
        out[name] = ninja() != base
        del os.environ[name]
    out["_listed"] = sorted(v.name for v in buildline.BUILD_VARS)
    print("@@" + json.dumps(out))
"""


@pytest.mark.slow  # seconds: whole builds, servers or worker fleets in child processes
@needs_flashinfer
def test_each_listed_variable_changes_flashinfers_build_ninja(clean_env, real_nvcc13):
    out, proc = run_py(NINJA_PER_VARIABLE, dict(clean_env, FAKE_GPU_CAPS="12.0", FAKE_TORCH_CUDA="13.0"))
    listed = out.pop("_listed")
    assert sorted(out) == listed
    assert [k for k, changed in out.items() if not changed] == [], proc.stderr[-2000:]


class _Spec:
    """A module whose build.ninja copies a file: the pool, the record and the notes are ours."""

    def __init__(self, root: Path, name: str):
        self.name = name
        self.build_dir = root / name
        self.ninja_path = self.build_dir / "build.ninja"
        self.lock_path = root / f"{name}.lock"
        self.jit_library_path = self.build_dir / f"{name}.so"

    def write_ninja(self):
        self.build_dir.mkdir(parents=True, exist_ok=True)
        src = self.build_dir / "src.txt"
        src.write_text(os.environ.get("FLASHINFER_JIT_VERBOSE", "0"))
        self.ninja_path.write_text(f"rule cp\n  command = cp $in $out\nbuild {self.jit_library_path}: cp {src}\n")


def test_build_records_the_values_and_a_later_build_names_what_changed(tmp_path, cache_dir, monkeypatch):
    from flashinfer_sm120.warmup import plan

    for v in buildline.BUILD_VARS:
        monkeypatch.delenv(v.name, raising=False)
    jit = tmp_path / "jit"
    spec = _Spec(jit, "m")
    first = plan.build_specs([("m", spec)], 1, io.StringIO())[0]
    assert first["status"] == "built" and first["build_vars_before"] == []
    assert buildline.recorded(spec.build_dir) == first["build_vars"] == buildline.snapshot({})
    monkeypatch.setenv("FLASHINFER_JIT_VERBOSE", "1")
    now = buildline.snapshot(dict(os.environ))
    assert {k: [c.__dict__ for c in v] for k, v in buildline.stale(jit, now).items()} == {
        "m": [{"name": "FLASHINFER_JIT_VERBOSE", "built": None, "now": "1"}]}
    second = plan.build_specs([("m", spec)], 1, io.StringIO())[0]
    assert second["build_vars_before"] == [{"name": "FLASHINFER_JIT_VERBOSE", "built": None, "now": "1"}]
    assert buildline.recorded(spec.build_dir)["FLASHINFER_JIT_VERBOSE"] == "1" and buildline.stale(jit, now) == {}
    # the section doctor prints from it
    monkeypatch.setattr("flashinfer_sm120.core.facts.servers.installed", lambda: [])
    monkeypatch.setenv("FLASHINFER_JIT_VERBOSE", "0")
    from flashinfer_sm120.diagnose.verify.diagnosis import diagnose

    section = build_line_section({"after": {"jit_dir": str(jit)}})
    assert section["stale"] == {str(jit / "m"): [{"name": "FLASHINFER_JIT_VERBOSE", "built": "1", "now": None}]}
    (stale,) = [f for f in diagnose({"build_line": section}).findings if f.code == "build-line-stale"]
    assert stale.text.startswith("1 built module was built with other values of FLASHINFER_JIT_VERBOSE")


def test_a_record_that_is_not_ours_is_ignored(tmp_path):
    (tmp_path / buildline.RECORD_NAME).write_text(json.dumps({"schema": 1, "build_vars": {"PATH": "/x"}}))
    assert buildline.recorded(tmp_path) is None
    (tmp_path / buildline.RECORD_NAME).write_text("[")
    assert buildline.recorded(tmp_path) is None


def test_doctor_warns_for_jit_verbose(monkeypatch):
    monkeypatch.setenv("FLASHINFER_JIT_VERBOSE", "1")
    monkeypatch.setattr("flashinfer_sm120.core.facts.servers.installed", lambda: [])
    from flashinfer_sm120.diagnose.verify.diagnosis import diagnose

    findings = diagnose({"build_line": build_line_section({})}).findings
    (warning,) = [f for f in findings if f.code == "build-line-variable"]
    assert warning.text.startswith("FLASHINFER_JIT_VERBOSE=1 changes every build line (debug flags -O0 -g ")
    assert warning.text.endswith("flashinfer/jit/core.py gen_jit_spec): the warm cache will be rebuilt")
    monkeypatch.setenv("FLASHINFER_JIT_VERBOSE", "0")
    for v in buildline.BUILD_VARS:
        monkeypatch.delenv(v.name, raising=False)
    assert build_line_section({})["set"] == []


_json_value = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=40),
                           lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=30), kids,
                                                                                      max_size=4), max_leaves=20)


@given(st.one_of(st.binary(max_size=300), _json_value.map(lambda v: json.dumps({"schema": 1, "build_vars": v}).encode()),
                 st.dictionaries(st.sampled_from([v.name for v in buildline.BUILD_VARS] + ["PATH"]),
                                 st.none() | st.text(max_size=5000), max_size=4).map(
                     lambda d: json.dumps({"build_vars": d}).encode())))
def test_any_record_reads_as_a_snapshot_or_none(tmp_path, raw):
    """A record may be copied from another machine (a JIT directory copied into an image): whatever its bytes,
    reading it gives a snapshot of listed names with bounded string values, or None; never an exception."""
    (tmp_path / buildline.RECORD_NAME).write_bytes(raw)
    got = buildline.recorded(tmp_path)
    names = {v.name for v in buildline.BUILD_VARS}
    assert got is None or all(k in names and (v is None or (isinstance(v, str) and len(v) <= 4096))
                              for k, v in got.items())
    if got is not None:
        assert buildline.changes(got, buildline.snapshot({})) is not None
