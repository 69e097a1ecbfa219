"""Every directory FlashInfer reads code from passes the trust rule, by one table and one check (P2, P8)."""

from __future__ import annotations

import pytest

from flashinfer_sm120.core.facts.workspace import CODE_DIRS, code_dirs_refused

#: How to name each directory of :data:`CODE_DIRS`: the variable set, and the path under it when unset.
CASES = [(var, var, "") for var in CODE_DIRS] + [
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
