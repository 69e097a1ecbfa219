"""Every directory FlashInfer reads code from passes the trust rule, by one table and one check (P2, P8)."""

from __future__ import annotations

import os

import pytest

from flashinfer_sm120.core.facts.workspace import CODE_DIRS, code_dirs_refused

#: How to name each directory of :data:`CODE_DIRS` and sccache's: the variable set, and the path under it when unset.
CASES = [(var, var, "") for var in [*CODE_DIRS, "SCCACHE_DIR"]] + [
    ("FLASHINFER_CUBIN_DIR", "FLASHINFER_WORKSPACE_BASE", ".cache/flashinfer/cubins"),
    ("B12X_COMPILE_CACHE_DIR", "XDG_CACHE_HOME", "b12x/compile"),
    ("B12X_COMPILE_CACHE_DIR", "HOME", ".cache/b12x/compile"),
    ("SCCACHE_DIR", "XDG_CACHE_HOME", "sccache"), ("SCCACHE_DIR", "HOME", ".cache/sccache")]
#: The compiler cache on: sccache's local disk cache is a directory code comes from too.
SCCACHE_ON = {"FLASHINFER_SM120_COMPILER_CACHE": "sccache"}


@pytest.mark.parametrize("var,named_by,under", CASES)
def test_every_directory_flashinfer_reads_code_from_is_refused_when_others_may_write_it(tmp_path, var, named_by,
                                                                                          under):
    """``FLASHINFER_CUBIN_DIR`` others may write (FlashInfer loads the ``.so`` files its ``checksums.txt`` lists,
    and compiles with ``-I`` to it) is refused like the JIT directory: the variable, its value, why, the fix."""
    jit = tmp_path / "jit"
    (jit / "tmp").mkdir(parents=True)
    value = tmp_path / "v"
    code = value / under if under else value
    code.mkdir(parents=True)
    env = {"HOME": str(tmp_path), named_by: str(value), **SCCACHE_ON}
    assert code_dirs_refused(str(jit), env) is None
    code.chmod(0o777)
    problem = str(code_dirs_refused(str(jit), env))
    assert f"{named_by}='{value}'" in problem and str(code) in problem, problem
    assert var in problem.rpartition("Fix: ")[2], problem


@pytest.mark.parametrize("user_entry", ["absent", "a directory", "a file", "a link to a directory", "a dangling link",
                                        "absent, TMPDIR empty"])
def test_cute_dsl_cache_is_the_directory_cute_dsl_takes(tmp_path, monkeypatch, user_entry):
    """CuTe DSL takes ``$TMPDIR/$USER/cutlass_python_cache`` where ``mkdir -p`` succeeds, else
    ``$TMPDIR/cutlass_python_cache``: the check names the directory CuTe DSL itself computes."""
    import os

    from flashinfer_sm120.core.facts.workspace import cute_cache

    helpers = pytest.importorskip("cutlass.base_dsl.cache_helpers")
    tmp = tmp_path / "t"
    tmp.mkdir()
    entry = tmp / "u"
    if user_entry == "a directory":
        entry.mkdir()
    elif user_entry == "a file":
        entry.write_text("")
    elif "link" in user_entry:
        entry.symlink_to(tmp_path if user_entry == "a link to a directory" else tmp_path / "none")
    monkeypatch.chdir(tmp)
    monkeypatch.setenv("TMPDIR", "" if user_entry.endswith("TMPDIR empty") else str(tmp))
    monkeypatch.setenv("USER", "u")
    monkeypatch.delenv("CUTE_DSL_CACHE_DIR", raising=False)
    ours = cute_cache(dict(os.environ))[2]
    assert ours == os.path.abspath(helpers.get_default_generated_ir_path()), user_entry


@pytest.mark.parametrize("on", [SCCACHE_ON, {"FLASHINFER_NVCC_LAUNCHER": "/usr/bin/sccache"}, {}])
@pytest.mark.parametrize("remote", [{}, {"SCCACHE_REDIS_ENDPOINT": "redis://cache:6379"}])
def test_sccache_disk_cache_others_may_write_is_refused_only_while_flashinfer_compiles_through_it(tmp_path, on,
                                                                                                  remote):
    """Another user replaced an object in an ``SCCACHE_DIR`` they could write, and the next build linked it into a
    module a server loaded (P2). Refused while the compiler cache is on with sccache's local disk backend; a user
    not compiling through sccache, or with a remote backend, is never refused for it."""
    jit = tmp_path / "jit"
    (jit / "tmp").mkdir(parents=True)
    (tmp_path / "open" / "sc").mkdir(parents=True)
    (tmp_path / "open").chmod(0o777)
    env = {"HOME": str(tmp_path), "SCCACHE_DIR": str(tmp_path / "open" / "sc"), **on, **remote}
    problem = code_dirs_refused(str(jit), env)
    assert (problem is not None) == bool(on and not remote), problem
    assert problem is None or "SCCACHE_DIR" in str(problem).rpartition("Fix: ")[2]


@pytest.mark.parametrize("where", ["SCCACHE_CONF", "XDG_CONFIG_HOME", "HOME"])
def test_sccache_config_file_and_its_disk_dir_are_held_to_the_trust_rule(tmp_path, where):
    """sccache 0.16 reads ``SCCACHE_CONF``, else ``$XDG_CONFIG_HOME/sccache/config`` (``~/.config``): its
    ``[cache.disk] dir`` another user writes, or the file itself, chose where compiled objects came from (P2).
    ``SCCACHE_DIR``, ``SCCACHE_CACHE_SIZE``... replace the file's ``[cache.disk]`` in sccache, so here too."""
    jit = tmp_path / "jit"
    (jit / "tmp").mkdir(parents=True)
    (tmp_path / "open" / "sc").mkdir(parents=True)
    (tmp_path / "open").chmod(0o777)
    (tmp_path / "mine").mkdir()
    conf = {"SCCACHE_CONF": tmp_path / "my.toml", "XDG_CONFIG_HOME": tmp_path / "x" / "sccache" / "config",
            "HOME": tmp_path / ".config" / "sccache" / "config"}[where]
    conf.parent.mkdir(parents=True, exist_ok=True)
    conf.write_text(f'[cache.disk]\ndir = "{tmp_path / "open" / "sc"}"\n')
    env = {"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "x"), **SCCACHE_ON}
    env = env if where != "HOME" else {k: v for k, v in env.items() if k != "XDG_CONFIG_HOME"}
    env = env if where != "SCCACHE_CONF" else dict(env, SCCACHE_CONF=str(conf))
    problem = str(code_dirs_refused(str(jit), env))
    assert str(conf) in problem and str(tmp_path / "open" / "sc") in problem, problem
    assert "SCCACHE_DIR" in problem.rpartition("Fix: ")[2], problem
    assert code_dirs_refused(str(jit), dict(env, SCCACHE_DIR=str(tmp_path / "mine"))) is None
    assert code_dirs_refused(str(jit), dict(env, SCCACHE_CACHE_SIZE="1G")) is None  # the default directory
    assert code_dirs_refused(str(jit), {k: v for k, v in env.items() if k not in SCCACHE_ON}) is None
    conf.write_text("")
    assert code_dirs_refused(str(jit), env) is None
    conf.chmod(0o666)  # the file another user may write
    problem = str(code_dirs_refused(str(jit), env))
    assert str(conf) in problem and "SCCACHE_CONF" in problem.rpartition("Fix: ")[2], problem


@pytest.mark.parametrize("bad", ["x = [", "[cache]\ndisk = 3", "a directory", "a FIFO"])
def test_an_sccache_config_file_sccache_cannot_read_refuses_the_compiler_cache(tmp_path, bad):
    """sccache refuses to start on a config file it cannot parse: the compiler cache is refused before it runs,
    naming the file and the fix (P8); a FIFO never blocks the read (P6)."""
    from flashinfer_sm120.core.jitenv import launcher, toolchain

    conf = tmp_path / "conf"
    {"a directory": conf.mkdir, "a FIFO": lambda: os.mkfifo(conf)}.get(bad, lambda: conf.write_text(bad))()
    out = toolchain.Setup()
    env, failed = launcher.private_server(out, "/usr/bin/sccache", {"HOME": str(tmp_path), "SCCACHE_CONF": str(conf)})
    assert failed.ok is False and str(conf) in failed.why and "SCCACHE_CONF" in failed.why.rpartition("Fix: ")[2]
    assert "SCCACHE_SERVER_UDS" not in out.set  # no server started


@pytest.mark.parametrize("var", ["TMPDIR", "TEMP", "TMP"])
def test_the_cute_dsl_cache_is_named_by_the_variable_that_chose_it(tmp_path, var):
    """Without ``TMPDIR``, tempfile (so CuTe DSL) takes ``TEMP`` or ``TMP``: the refusal names that variable, not
    a ``TMPDIR=`` the user never set (P8)."""
    from flashinfer_sm120.core.facts.workspace import code_dirs

    (tmp_path / "t").mkdir()
    row = code_dirs(str(tmp_path / "jit"), {"HOME": str(tmp_path), var: str(tmp_path / "t"), "USER": "u"})[-1]
    assert row[:3] == (var, str(tmp_path / "t"), str(tmp_path / "t" / "u" / "cutlass_python_cache")), row
