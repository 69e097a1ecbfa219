"""Every directory FlashInfer reads code from passes the trust rule, by one table and one check (P2, P8)."""

from __future__ import annotations

import os

import pytest

from flashinfer_sm120.core.facts.workspace import CODE_DIRS, code_dirs_refused

#: How to name each directory of :data:`CODE_DIRS`: the variable set, and the path under it when unset.
CASES = [(var, var, "") for var in CODE_DIRS] + [
    ("FLASHINFER_CUBIN_DIR", "FLASHINFER_WORKSPACE_BASE", ".cache/flashinfer/cubins"),
    ("B12X_COMPILE_CACHE_DIR", "XDG_CACHE_HOME", "b12x/compile"),
    ("B12X_COMPILE_CACHE_DIR", "HOME", ".cache/b12x/compile")]


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
    env = {"HOME": str(tmp_path), named_by: str(value)}
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


@pytest.mark.parametrize("var", ["TMPDIR", "TEMP", "TMP"])
def test_the_cute_dsl_cache_is_named_by_the_variable_that_chose_it(tmp_path, var):
    """Without ``TMPDIR``, tempfile (so CuTe DSL) takes ``TEMP`` or ``TMP``: the refusal names that variable, not
    a ``TMPDIR=`` the user never set (P8)."""
    from flashinfer_sm120.core.facts.workspace import code_dirs

    (tmp_path / "t").mkdir()
    row = code_dirs(str(tmp_path / "jit"), {"HOME": str(tmp_path), var: str(tmp_path / "t"), "USER": "u"})[-1]
    assert row[:3] == (var, str(tmp_path / "t"), str(tmp_path / "t" / "u" / "cutlass_python_cache")), row
