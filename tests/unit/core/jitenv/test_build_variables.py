"""Hostile environment values (S2): FlashInfer's compiler variables, MAX_JOBS and
FLASHINFER_NVCC_THREADS as FlashInfer reads them, PATH shapes (P2, P8)."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, strategies as st

from helpers.toolkits import make_toolkit, script
from flashinfer_sm120.safety import compilers


@pytest.fixture
def places(tmp_path):
    """A toolkit, a trusted bin dir, and a world-writable dir holding ``evilcc`` (anyone could
    have put it there); PATH reaches both."""
    tk = make_toolkit(tmp_path / "tk", "13.0.88")
    good = tmp_path / "bin"
    script(good / "launch")
    open_dir = tmp_path / "open"
    evil = str(script(open_dir / "evilcc"))
    os.chmod(open_dir, 0o777)
    path = f"{good}:/usr/bin:/bin:{open_dir}"
    return {"tk": tk, "nvcc": str(tk / "bin" / "nvcc"), "good": good, "evil": evil, "PATH": path}


def _verdict(places, var, value):
    env = {"PATH": places["PATH"], var: value}
    (v,) = compilers.check(env, places["nvcc"], str(places["tk"]))
    return v


# What FlashInfer puts into build.ninja (``cxx = $CXX``, then ``/bin/sh -c "$cxx_launcher $cxx ..."``):
# a program a launcher hands on to, found on PATH, is run as surely as the first word.
HANDED_ON = ["/usr/bin/env evilcc", "env evilcc", "nice evilcc", "nice -5 evilcc", "/usr/bin/nohup evilcc",
             "launch_then env evilcc"]
# A launcher's options can run, write or unset what no check sees (P2, P5): `env -S` runs the string it
# splits, `time -o` writes its report over a file, `env -u TMPDIR` sends nvcc's temporaries to /tmp.
LAUNCHER_OPTIONS = ["env -S/tmp/evil c++", "env --split-string=/tmp/evil c++", "/usr/bin/time -o/tmp/x c++",
                    "/usr/bin/time --output=/tmp/x c++", "env -uTMPDIR c++", "env -u TMPDIR c++", "env -i c++",
                    "env -C /tmp c++", "nice -5 c++"]
# Shell and ninja syntax: what runs is not what the words say.
SYNTAX = ["/usr/bin/c++ `evilcc`", "c++ $(evilcc)", "/usr/bin/c++ $in", "c++;evilcc", "c++ && evilcc",
          "c++ | evilcc", "c++ > /tmp/x", "c++ 'a b'", "c++ *", "c++ ${X}"]
# Interpreters run a program we cannot read; a relative path depends on ninja's working directory.
OTHER = ["python3 x.py", "/usr/bin/perl -e 1", "./cc", "bin/cc", "sh -c evilcc", "sh evilcc"]


@pytest.mark.parametrize("value", HANDED_ON + SYNTAX + OTHER + LAUNCHER_OPTIONS)
@pytest.mark.parametrize("var", ["FLASHINFER_NVCC_LAUNCHER", "FLASHINFER_CXX_LAUNCHER", "CXX"])
def test_a_compiler_variable_cannot_run_what_was_not_checked(places, var, value):
    value = value.replace("launch_then ", "")
    v = _verdict(places, var, value)
    assert not v.keep, v.note
    assert var in v.note and "Fix:" in v.note and len(v.note) < 2000


@pytest.mark.parametrize("value", ["launch", "env", "/usr/bin/env /usr/bin/c++", "c++", "nice c++",
                                   "/usr/bin/c++ -fno-plt -O2", "ccache_missing_ok"])
def test_ordinary_compiler_values_are_kept(places, value):
    if value == "ccache_missing_ok":
        value = f"{places['good']}/launch"
    v = _verdict(places, "FLASHINFER_CXX_LAUNCHER", value)
    assert v.keep, v.note


def test_flashinfer_nvcc_with_ninja_syntax_is_refused(places, tmp_path):
    """``$`` in a path is ninja's variable syntax: ``/opt/x$y/nvcc`` is checked as written and
    run as ``/opt/x/nvcc``."""
    d = tmp_path / "x$y" / "bin"
    nvcc = str(script(d / "nvcc", f"#!/bin/sh\nexec {places['nvcc']} \"$@\"\n"))
    v = _verdict(places, "FLASHINFER_NVCC", nvcc)
    assert not v.keep and "FLASHINFER_NVCC" in v.note


def test_a_bare_name_behind_a_relative_path_entry_is_refused(places, tmp_path):
    """Ninja runs FlashInfer's compile lines in the module's build directory: a relative
    ``PATH`` entry (``.``, empty) before the checked directory names a different file there."""
    env = {"PATH": f".:{places['good']}:/usr/bin", "FLASHINFER_CXX_LAUNCHER": "launch"}
    (v,) = compilers.check(env, places["nvcc"], str(places["tk"]))
    assert not v.keep and "relative" in v.note
    env["PATH"] = f"{places['good']}::/usr/bin"  # after the directory it is found in: harmless
    (v,) = compilers.check(env, places["nvcc"], str(places["tk"]))
    assert v.keep, v.note


@given(st.lists(st.sampled_from(list("ab/ $`;|&<>()'\"\\*?[]{}!#~=-.\t") + ["env ", "nice ", "c++", "evilcc",
                                                                                 "/usr/bin/", "sh "]),
                max_size=12).map("".join))
def test_compiler_values_property(places, value):
    """Whatever the value: a verdict, never an exception; a kept value is plain words whose every
    program was checked (none is the untrusted ``evilcc``)."""
    env = {"PATH": places["PATH"], "FLASHINFER_CXX_LAUNCHER": value}
    try:
        verdicts = compilers.check(env, places["nvcc"], str(places["tk"]))
    except Exception as exc:  # noqa: BLE001 - the property: nothing escapes
        raise AssertionError(f"{value!r}: {exc!r}") from None
    if not value:
        assert verdicts == []  # empty: unset for FlashInfer
        return
    (v,) = verdicts
    assert len(v.note) < 4000
    if v.keep:
        assert "evilcc" not in value and not set(value) & set("$`;|&<>()'\"\\*?[]{}!#~")


# --------------------------------------------------------------------------- MAX_JOBS / FLASHINFER_NVCC_THREADS as FlashInfer reads them

@pytest.mark.parametrize("raw,want", [("5", 5), ("²", None), ("0", None), ("lots", None), (None, None)])
def test_build_and_the_pool_read_max_jobs_one_way(raw, want):
    """The pool read MAX_JOBS with a grammar of its own; now ``build`` and the pool share
    :func:`plan.plan`'s: the user's value as FlashInfer reads it, else the CPUs."""
    from flashinfer_sm120.core.jitenv import memory
    from flashinfer_sm120.warmup import plan

    p = plan.plan(plan.estimate("sampling", {}), env={} if raw is None else {"MAX_JOBS": raw})
    assert p["jobs"] == (want or memory.cpus()) and ("yours" in p["jobs_from"]) == (want is not None)


def _flashinfer_reads_max_jobs(raw):
    """FlashInfer 0.7.4 ``flashinfer/jit/cpp_ext.py`` ``_get_num_workers``, as written there."""
    if raw is not None and raw.isdigit():
        return int(raw)
    return None


@pytest.mark.parametrize("raw", ["²", "4²", "٣", " 4", "4 ", "+4", "-1", "4.0", "", "0x10", "2147483648", "0", "00", "０"])
def test_a_max_jobs_flashinfer_cannot_use_is_replaced_not_kept(raw):
    """FlashInfer crashes on ``MAX_JOBS=²`` (``'²'.isdigit()`` is true, ``int('²')`` fails: every JIT
    build raises ValueError), ignores `` 4`` (ninja's default, CPUs + 2, whatever the memory), and
    ninja 1.11 stops on ``-j 2147483648``, and reads ``0`` (also ``00`` and a fullwidth ``０``, which
    ``isdigit()`` accepts) as no limit; these were "set by you: kept"."""
    from flashinfer_sm120.core.jitenv import memory
    from flashinfer_sm120.core.jitenv.memory import GIB, MemoryView, Bound

    view = MemoryView(8 * GIB, (Bound("MemAvailable", 8 * GIB, "test"),))
    value, why = memory.server_max_jobs(1, {"MAX_JOBS": raw}, view=view)
    try:
        fi = _flashinfer_reads_max_jobs(raw)
    except ValueError:
        fi = "crash"
    if fi is not None and fi != "crash" and 1 <= fi <= 2147483647:
        assert value is None and "kept" in why  # FlashInfer uses it as set: the user's
    else:
        assert value is not None and value >= 1, why
        assert "MAX_JOBS" in why and repr(raw)[1:-1][:10] in why and "Fix" in why
        assert "memory. Instead: MAX_JOBS=" in why, why  # two sentences, not one run on


def test_configure_pops_a_max_jobs_flashinfer_would_crash_on(tmp_path, monkeypatch):
    from flashinfer_sm120.core.jitenv import toolchain

    tk = make_toolkit(tmp_path / "tk", "13.0.88")
    out = toolchain.configure(str(tk), str(tk / "bin" / "nvcc"), [(12, "0f")],
                              env={"PATH": "/usr/bin:/bin", "MAX_JOBS": "²"})
    assert "MAX_JOBS" in out.pop and out.max_jobs_value is not None
    assert any("MAX_JOBS" in w and "ValueError" in w for w in out.warnings)


@pytest.mark.parametrize("raw,fi", [("1_0", 10), ("+4", 4), ("٣", 3), (" 2 ", 2), ("0", 1), ("x", 1), ("²", 1)])
def test_nvcc_threads_are_read_as_flashinfer_reads_them(raw, fi):
    """``get_nvcc_parallelism_flags``: ``int(value)``, else 1; below 1: 1.  The memory estimate
    multiplies by it, so reading ``1_0`` as 1 under-counted memory tenfold."""
    from flashinfer_sm120.core.jitenv import memory
    from flashinfer_sm120.warmup.plan import plan

    assert memory.user_threads({"FLASHINFER_NVCC_THREADS": raw})[1] == fi
    p = plan(memory.Estimate(100, "x", "test"), targets=16, jobs=1, mem_limit=1 << 30,
                  env={"FLASHINFER_NVCC_THREADS": raw})
    assert p["threads"] == fi and p["per_compile"] == 100 * fi
    assert ("yours" in p["threads_from"]) == (fi > 1 or raw.strip() == "1")


# --------------------------------------------------------------------------- PATH: relative entries and ninja

def test_a_relative_path_entry_never_counts_as_the_exported_ninja(tmp_path, monkeypatch):
    """FlashInfer runs ninja with ``cwd=`` the module's build directory, so ``.`` or an empty
    ``PATH`` entry names that directory there.  Started from the venv's ``bin`` with
    ``PATH=.``, the export said "unchanged: 'which ninja' is already ..." and every JIT build
    then found no ninja (or Debian's 1.11 next on PATH, another .ninja_log format)."""
    from flashinfer_sm120.safety.fs import statedir
    from flashinfer_sm120.core.toolkit import ninja

    monkeypatch.setenv("FLASHINFER_SM120_CACHE_DIR", str(tmp_path / "cache"))
    statedir.forget_cache_root()
    chosen = ninja.choose()
    monkeypatch.chdir(os.path.dirname(chosen.path))
    for env_path in (".", ":/usr/bin", "bin:/usr/bin"):
        assert all(os.path.isabs(n.path) for n in ninja.candidates(env_path))
        d, note = ninja.export_dir(chosen, env_path, lambda _d: "shared")
        assert d is not None and os.path.isabs(d), note
        assert os.path.realpath(os.path.join(d, "ninja")) == chosen.real


def test_an_empty_cxx_is_refused_not_skipped(places):
    """FlashInfer reads ``os.environ.get("CXX", "c++")``: set but empty, its link rule
    ``$cxx $in $ldflags -o $out`` ran the first object file as the command (every JIT build
    failed).  Empty launchers are FlashInfer's own default and stay."""
    env = {"PATH": places["PATH"], "CXX": "", "FLASHINFER_CXX_LAUNCHER": "", "FLASHINFER_NVCC_LAUNCHER": ""}
    verdicts = {v.var: v for v in compilers.check(env, places["nvcc"], str(places["tk"]))}
    assert set(verdicts) == {"CXX"}
    assert not verdicts["CXX"].keep and "c++" in verdicts["CXX"].note and "Fix:" in verdicts["CXX"].note


@pytest.mark.parametrize("var,value", [("SCCACHE_SERVER_PORT", "0"), ("SCCACHE_SERVER_PORT", "abc"),
                                       ("SCCACHE_SERVER_PORT", "4226"), ("SCCACHE_SERVER_UDS", "/tmp/shared.sock")])
def test_the_users_sccache_server_address_is_overridden_by_a_private_socket(tmp_path, monkeypatch, var, value):
    """``SCCACHE_SERVER_PORT=0`` started a server no client could reach, and any port or shared socket lets
    another local user use ours or serve us theirs (threat-model P2): every sccache we run or export talks to
    its server on a socket in this process's private directory; the warning names the variable and the fix."""
    from flashinfer_sm120.core.jitenv import launcher, toolchain
    from flashinfer_sm120.safety.fs.atomic import build_tmp

    envs = []
    monkeypatch.setattr(launcher, "probe_once", lambda *a, env, **k: envs.append(env) or launcher.Verdict(True, "0.16"))
    monkeypatch.setattr(launcher, "find_sccache", lambda env: ("/usr/bin/sccache", []))
    monkeypatch.setattr(launcher, "start_server", lambda launcher, env: None)  # it listens
    monkeypatch.setattr(launcher, "launcher_version", lambda launcher: ("0.16.0", None))
    monkeypatch.setattr(launcher, "disk_problem", lambda launcher, env: None)  # on a disk cache of yours
    tk = make_toolkit(tmp_path / "tk", "13.0.88")
    out = toolchain.configure(str(tk), str(tk / "bin" / "nvcc"), [(12, "0f")],
                              env={"PATH": "/usr/bin:/bin", "FLASHINFER_SM120_COMPILER_CACHE": "sccache", var: value})
    sock = os.path.join(build_tmp(), "sccache.sock")
    assert out.set["SCCACHE_SERVER_UDS"] == sock == envs[0]["SCCACHE_SERVER_UDS"]
    assert (os.stat(os.path.dirname(sock)).st_mode & 0o777) == 0o700 and out.set["FLASHINFER_NVCC_LAUNCHER"]
    assert [w for w in out.warnings if f"{var}=" in w and value in w and f"unset {var}" in w]
