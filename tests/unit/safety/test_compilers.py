"""FlashInfer's compiler variables under the trust rule (issue 14, item 3): FLASHINFER_NVCC is
used only as the chosen toolkit's nvcc (its toolkit is a candidate like any other) or
refused; FLASHINFER_NVCC_LAUNCHER / FLASHINFER_CXX_LAUNCHER / CXX must pass the trust rule."""

import os

import pytest


from helpers.child import run_py
from helpers.host import needs_flashinfer
from helpers.toolkits import make_toolkit, script
from helpers.untrusted import give_away, make_unsafe
from flashinfer_sm120.core.toolkit.sources import discover
from flashinfer_sm120.safety import compilers


def test_flashinfer_nvcc_is_a_candidate_first(tmp_path):
    a = make_toolkit(tmp_path / "a", "13.0.88")
    b = make_toolkit(tmp_path / "b", "13.0.88")
    env = {"PATH": "/usr/bin:/bin", "CUDA_HOME": str(a), "FLASHINFER_NVCC": str(b / "bin" / "nvcc")}
    cands = discover(env)
    assert cands[0].root == str(b) and cands[0].sources == ("FLASHINFER_NVCC",)
    assert cands[0].given_as.startswith("$FLASHINFER_NVCC=")
    env["FLASHINFER_NVCC"] = f"ccache {b}/bin/nvcc"
    first = discover(env)[0]
    assert first.problem and "FLASHINFER_NVCC_LAUNCHER" in first.problem


def test_verdicts(tmp_path):
    tk = make_toolkit(tmp_path / "tk", "13.0.88")
    other = make_toolkit(tmp_path / "other", "12.8.93")
    script(tmp_path / "bin" / "launch")
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    bad = str(script(open_dir / "cc"))
    os.chmod(open_dir, 0o777)
    nvcc = str(tk / "bin" / "nvcc")
    env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "FLASHINFER_NVCC": nvcc,
           "FLASHINFER_NVCC_LAUNCHER": "launch", "FLASHINFER_CXX_LAUNCHER": bad, "CXX": "no-such-compiler-x"}
    v = {x.var: x for x in compilers.check(env, nvcc, str(tk))}
    assert v["FLASHINFER_NVCC"].keep and v["FLASHINFER_NVCC_LAUNCHER"].keep
    assert not v["FLASHINFER_CXX_LAUNCHER"].keep and "writable by other users" in v["FLASHINFER_CXX_LAUNCHER"].note
    assert not v["CXX"].keep and "not on PATH" in v["CXX"].note and "Fix:" in v["CXX"].note
    env = {"PATH": "/usr/bin:/bin", "FLASHINFER_NVCC": str(other / "bin" / "nvcc")}
    (v,) = compilers.check(env, nvcc, str(tk))
    assert not v.keep and "not the chosen toolkit's nvcc" in v.note and str(tk) in v.note
    (v,) = compilers.check({"FLASHINFER_NVCC": ""}, nvcc, str(tk))
    assert not v.keep
    wrapper = str(script(tmp_path / "w" / "nvcc", f"#!/bin/sh\nexec {nvcc} \"$@\"\n"))
    (v,) = compilers.check({"FLASHINFER_NVCC": wrapper}, nvcc, str(tk))
    assert v.keep, v.note  # a wrapper that runs the chosen nvcc is that nvcc


CHILD = """
import json, logging, os, io
buf = io.StringIO(); logging.getLogger("flashinfer_sm120").addHandler(logging.StreamHandler(buf))
import flashinfer_sm120
flashinfer_sm120.install()
import flashinfer.jit.core
st = flashinfer_sm120.status()
at_import = os.environ.get("MAX_JOBS")
from flashinfer_sm120.core.jitenv import toolchain
toolchain.prepare_builds()  # what the build gate runs before FlashInfer's first JIT build
now = {k: os.environ.get(k) for k in ("FLASHINFER_NVCC", "CXX", "FLASHINFER_NVCC_LAUNCHER", "MAX_JOBS")}
flashinfer_sm120.revert()
after = {k: os.environ.get(k) for k in ("FLASHINFER_NVCC", "CXX", "FLASHINFER_NVCC_LAUNCHER", "MAX_JOBS")}
print("@@" + json.dumps({"mode": st["mode"], "root": st["resolution"]["choice"]["toolkit"]["root"],
                         "at_import": at_import, "now": now, "after": after, "log": buf.getvalue()}))
"""


@needs_flashinfer
def test_refused_variables_leave_the_process_and_come_back_on_revert(tmp_path, clean_env):
    a = make_toolkit(tmp_path / "a", "13.0.88", curand=True)
    old = make_toolkit(tmp_path / "old", "12.8.93", curand=True)
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    bad_cxx = str(script(open_dir / "c++"))
    os.chmod(open_dir, 0o777)
    env = dict(clean_env, CUDA_HOME=str(a), FLASHINFER_CUDA_ARCH_LIST="12.0", MAX_JOBS="3",
               FLASHINFER_NVCC=str(old / "bin" / "nvcc"), CXX=bad_cxx)
    res, proc = run_py(CHILD, env)
    assert res["root"] == str(a), res  # 12.8 cannot build sm_120f: its FLASHINFER_NVCC is not chosen
    assert res["now"]["FLASHINFER_NVCC"] is None and res["now"]["CXX"] is None, res
    assert "not the chosen toolkit's nvcc" in res["log"] and "writable by other users" in res["log"]
    assert res["now"]["MAX_JOBS"] == "3"  # the user's MAX_JOBS wins
    assert res["after"]["FLASHINFER_NVCC"] == str(old / "bin" / "nvcc") and res["after"]["CXX"] == bad_cxx

    env = dict(env, FLASHINFER_NVCC=str(a / "bin" / "nvcc"), CUDA_HOME=str(old))
    env.pop("CXX")
    env.pop("MAX_JOBS")
    res, proc = run_py(CHILD, env)
    assert res["root"] == str(a) and res["now"]["FLASHINFER_NVCC"] == str(a / "bin" / "nvcc"), res
    assert res["at_import"] is None  # the memory policy waits for the first build
    assert res["now"]["MAX_JOBS"] and res["after"]["MAX_JOBS"] is None  # exported, then undone


from hypothesis import given, strategies as st  # noqa: E402

_value = st.one_of(st.text(max_size=200), st.sampled_from(["", " ", "/", "/bin/sh", "sh -c x", "'", "a=b c",
                                                             "/usr/bin/env", "/nonexistent/nvcc", "x" * 5000]))


@given(nvcc=_value, launcher=_value, cxx_launcher=_value, cxx=_value)
def test_check_takes_any_value_and_keeps_messages_short(nvcc, launcher, cxx_launcher, cxx):
    env = {"PATH": "/usr/bin:/bin", "FLASHINFER_NVCC": nvcc, "FLASHINFER_NVCC_LAUNCHER": launcher,
           "FLASHINFER_CXX_LAUNCHER": cxx_launcher, "CXX": cxx}
    for v in compilers.check(env, "/usr/local/cuda-13.0/bin/nvcc", "/usr/local/cuda-13.0"):
        assert v.var in compilers.VARIABLES and len(v.note) < 1500
        assert v.keep is False or v.var != "FLASHINFER_NVCC" or os.path.isabs(nvcc.strip())


def _open_dir(tmp_path, name="open"):
    """A directory everyone may write (no sticky bit): what another uid could have planted in."""
    d = tmp_path / name
    d.mkdir()
    d.chmod(0o777)
    return d


def test_host_compiler_variables_are_held_to_the_trust_rule(tmp_path):
    """The host compiler named by CC, NVCC_CCBIN or -ccbin in NVCC_*_FLAGS is held to the trust rule (P2)."""
    tk = make_toolkit(tmp_path / "tk", "13.0.88")
    nvcc = str(tk / "bin" / "nvcc")
    opened = _open_dir(tmp_path)
    bad = str(script(opened / "gcc"))
    env = {"PATH": "/usr/bin:/bin", "CC": bad, "NVCC_CCBIN": str(opened), "NVCC_PREPEND_FLAGS": f"-ccbin {bad}",
           "NVCC_APPEND_FLAGS": f"-allow-unsupported-compiler --compiler-bindir={opened}",
           "FLASHINFER_EXTRA_CUDAFLAGS": f"-O3 -Xcompiler=-B{opened}", "FLASHINFER_EXTRA_LDFLAGS": f"-Wl,{bad}"}
    v = {x.var: x for x in compilers.check(env, nvcc, str(tk))}
    for var in ("CC", "NVCC_CCBIN", "NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS", "FLASHINFER_EXTRA_CUDAFLAGS",
                "FLASHINFER_EXTRA_LDFLAGS"):
        assert not v[var].keep, v[var].note
        assert "writable by other users" in v[var].note and "Fix:" in v[var].note, v[var].note
    good = {"PATH": "/usr/bin:/bin", "CC": "gcc", "NVCC_CCBIN": "/usr/bin", "NVCC_PREPEND_FLAGS": "-ccbin g++",
            "NVCC_APPEND_FLAGS": "-allow-unsupported-compiler", "FLASHINFER_EXTRA_CUDAFLAGS": "-I/usr/include -O3"}
    v = {x.var: x for x in compilers.check(good, nvcc, str(tk))}
    assert all(x.keep for x in v.values()), [x.note for x in v.values() if not x.keep]
    (v,) = compilers.check({"PATH": "/usr/bin:/bin", "NVCC_CCBIN": "no-such-cc-x"}, nvcc, str(tk))
    assert not v.keep and "not on PATH" in v.note


def test_programs_run_by_name_are_checked_where_path_finds_them(tmp_path):
    """A gcc planted early on PATH is never nvcc's host compiler (P2)."""
    opened = _open_dir(tmp_path)
    script(opened / "gcc")
    env = {"PATH": f"{opened}:/usr/bin:/bin"}
    problem = compilers.path_problem(env)
    assert problem.path == f"{opened}/gcc" and problem.what.startswith("nvcc's host compiler")
    assert "NVCC_CCBIN" in problem.fix and str(opened) in problem.fix and "writable by other users" in problem.why
    assert str(problem).endswith(f"Fix: {problem.fix}")
    # a variable that names the host compiler instead makes PATH's gcc not run
    for name, value in (("NVCC_CCBIN", "/usr/bin/g++"), ("CC", "gcc"), ("NVCC_APPEND_FLAGS", "-ccbin=g++")):
        assert compilers.path_problem(dict(env, **{name: value})) is None, name
    script(opened / "c++")
    problem = compilers.path_problem(dict(env, NVCC_CCBIN="/usr/bin/g++"))
    assert problem.path == f"{opened}/c++" and "CXX" in problem.fix
    assert compilers.path_problem(dict(env, NVCC_CCBIN="/usr/bin/g++", CXX="/usr/bin/c++")) is None
    script(opened / "rm")  # nvcc cleans up with rm from PATH: no variable replaces it
    problem = compilers.path_problem(dict(env, NVCC_CCBIN="/usr/bin/g++", CXX="/usr/bin/c++"))
    assert problem.path == f"{opened}/rm"
    assert compilers.path_problem({"PATH": "/usr/bin:/bin"}) is None
    # a relative or empty PATH entry names the module's build directory, which FlashInfer's own JIT
    # directory check covers: a trailing ':' must not stop every build
    assert compilers.path_problem({"PATH": f".::/usr/bin:/bin:{opened}"}) is None


@pytest.mark.parametrize("var", compilers.TEMP_VARIABLES)
@pytest.mark.parametrize("how", ["world-writable", "another user's"])
def test_a_temporary_directory_another_uid_may_change_stops_builds(tmp_path, var, how):
    """No build makes its jobserver FIFO, nor nvcc its intermediate files, in a TMPDIR another uid can change (P5)."""
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    make_unsafe(theirs, how)
    problem = compilers.path_problem({"PATH": "/usr/bin:/bin", var: str(theirs)})
    assert problem is not None and problem.path == str(theirs), problem
    assert var in problem.what and var in problem.fix and str(theirs) in str(problem)
    assert ("writable by other users" if how == "world-writable" else "owned by uid 4321") in problem.why


def test_a_temporary_directory_of_ours_or_roots_sticky_one_is_a_place_to_build(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    sticky = tmp_path / "sticky"  # like /tmp: others cannot move what we create there
    sticky.mkdir()
    sticky.chmod(0o1777)
    for value in (str(mine), str(sticky), str(mine / "not-yet"), "relative/dir", ""):
        assert compilers.path_problem({"PATH": "/usr/bin:/bin", "TMPDIR": value}) is None, value
    if os.geteuid() != 0:  # a sticky directory another uid owns is theirs to change
        return
    assert compilers.temp_problem({"TMPDIR": str(sticky)}) is None
    give_away(sticky)
    assert compilers.temp_problem({"TMPDIR": str(sticky)}) is not None


def test_a_path_a_flag_names_that_another_user_may_create_first_is_refused(tmp_path):
    """``FLASHINFER_EXTRA_LDFLAGS=-Wl,-rpath=/tmp/shared-libs`` is refused even while absent: another uid
    could make it later and the module the server loads would run their libcudart.so.13 (P2)."""
    tk = make_toolkit(tmp_path / "tk", "13.0.88")
    nvcc = str(tk / "bin" / "nvcc")
    sticky = tmp_path / "sticky"  # like /tmp
    sticky.mkdir()
    sticky.chmod(0o1777)
    opened = _open_dir(tmp_path)
    for var, value in (("FLASHINFER_EXTRA_LDFLAGS", f"-Wl,-rpath={sticky}/shared-libs"),
                       ("FLASHINFER_EXTRA_CUDAFLAGS", f"-include {sticky}/x.h"),
                       ("FLASHINFER_EXTRA_CFLAGS", f"-fplugin={opened}/later/p.so"),
                       ("NVCC_APPEND_FLAGS", f"-Xcompiler=-fplugin={sticky}/p.so")):
        (v,) = compilers.check({"PATH": "/usr/bin:/bin", var: value}, nvcc, str(tk))
        assert not v.keep and "does not exist yet where another user may create it" in v.note, (var, v.note)
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    (v,) = compilers.check({"PATH": "/usr/bin:/bin", "FLASHINFER_EXTRA_LDFLAGS": f"-Wl,-rpath={mine}/later"},
                           nvcc, str(tk))
    assert v.keep, v.note  # a path only you (or root) can create is yours to name


def test_gcc_variables_and_every_way_a_flag_names_a_path_are_held_to_the_trust_rule(tmp_path):
    """GCC_EXEC_PREFIX (and COMPILER_PATH, CPATH ...) in another uid's directory, ``-Xcompiler @/rsp`` (a
    response file holding -B/theirs/) and joined forms like ``-isystem/x`` are held to the trust rule, so gcc
    never runs their cc1plus (P2)."""
    tk = make_toolkit(tmp_path / "tk", "13.0.88")
    nvcc = str(tk / "bin" / "nvcc")
    opened = _open_dir(tmp_path)
    (opened / "rsp").write_text(f"-B{opened}/\n")
    for var in compilers.DIR_VARIABLES:  # LD_LIBRARY_PATH, DEPENDENCIES_OUTPUT too
        value = {"GCC_EXEC_PREFIX": f"{opened}/", "DEPENDENCIES_OUTPUT": f"{opened}/d.d target",
                 "SUNPRO_DEPENDENCIES": f"{opened}/d.d", "LD_PRELOAD": f"{opened}/x.so"}.get(var, f"/usr/include:{opened}")
        (v,) = compilers.check({"PATH": "/usr/bin:/bin", var: value}, nvcc, str(tk))
        assert not v.keep and "writable by other users" in v.note and f"from {var}" in v.note, (var, v.note)
    for words in (f"-Xcompiler @{opened}/rsp", f"-isystem{opened}", f"-iquote{opened}", f"-imacros{opened}/m.h",
                  f"-idirafter{opened}", f"-iprefix{opened}/", f"-Xcompiler=-include{opened}/x.h",
                  f"-Wl,-rpath=/usr/lib:{opened}"):  # each directory of a ':' list
        (v,) = compilers.check({"PATH": "/usr/bin:/bin", "NVCC_APPEND_FLAGS": words}, nvcc, str(tk))
        assert not v.keep and str(opened) in v.note, (words, v.note)
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o755)
    ok = {"PATH": "/usr/bin:/bin", "CPATH": f"{mine}:/usr/include", "GCC_EXEC_PREFIX": "/usr/lib/gcc/",
          "NVCC_APPEND_FLAGS": f"-isystem{mine} -Xcompiler @{mine}/absent-yet"}
    assert all(v.keep for v in compilers.check(ok, nvcc, str(tk))), compilers.check(ok, nvcc, str(tk))


@pytest.mark.parametrize("name", ["as", "ld"])
def test_the_assembler_and_linker_gcc_runs_by_name_are_checked(tmp_path, name):
    """gcc never runs the ``as`` and ``ld`` another uid puts first on PATH (P2)."""
    opened = _open_dir(tmp_path)
    script(opened / name)
    problem = compilers.path_problem({"PATH": f"{opened}:/usr/bin:/bin", "NVCC_CCBIN": "/usr/bin/g++",
                                      "CXX": "/usr/bin/c++"})
    assert problem is not None and problem.path == f"{opened}/{name}", problem
