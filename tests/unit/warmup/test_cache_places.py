"""Where cache export and import write: never into a directory another user owns or may write, for
both export forms and every module directory an import fills (threat-model P2, P4, P7)."""

from __future__ import annotations

import types
from pathlib import Path

import pytest

from helpers.untrusted import give_away, make_unsafe

from flashinfer_sm120.warmup import cacheexport, cachemeta, cachepack
from flashinfer_sm120.warmup.session import BuildError


def _session():
    fp = {"flashinfer": "0.7.4", "targets": ["12.0f"], "cuda_version": "13.0", "cuda_home": "/c", "jit_dir": "/j"}
    return types.SimpleNamespace(flashinfer="0.7.4", targets=["sm_120f"], fingerprint=lambda: dict(fp))


@pytest.mark.parametrize("name", ["out.tar.gz", "out.tar", "outdir"])
@pytest.mark.parametrize("how", ["world-writable", "another user's"])
def test_both_export_forms_refuse_a_directory_another_user_controls(tmp_path, name, how):
    """The archive form wrote into another uid's directory (they could then swap the archive for one
    carrying their .so); only the directory form was checked."""
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    make_unsafe(theirs, how)
    out = theirs / name
    with pytest.raises(BuildError, match="not safe to export into") as err:
        cacheexport.export([], _session(), str(out))
    assert err.value.fix == "export to a new path in a directory of your own"  # round 5 (P29): JSON fix ""
    assert str(err.value).count("Fix:") == 1
    assert not out.exists() and [p.name for p in theirs.iterdir()] == []


def test_an_export_into_a_directory_of_your_own_is_written(tmp_path):
    out = tmp_path / "mine" / "out.tar.gz"
    out.parent.mkdir()
    assert cacheexport.export([], _session(), str(out)) == [] and out.is_file()


def test_an_import_never_writes_into_a_module_directory_another_user_left(tmp_path):
    """A module directory another uid left in a shared workspace took the imported .so, which they could
    then swap for their own."""
    cached = tmp_path / "cached_ops"
    theirs = cached / "sampling"
    theirs.mkdir(parents=True)
    give_away(theirs)
    paths = {"jit/sampling/sampling.so": (tmp_path / "src.so", theirs / "sampling.so")}
    assert "not safe to install into" in cachepack._place_problem(paths)
    mine = {"jit/other/other.so": (tmp_path / "src.so", cached / "other" / "other.so")}
    assert cachepack._place_problem(mine) is None


def test_a_module_that_carries_no_library_is_refused_before_flashinfer_generates_anything(monkeypatch, tmp_path):
    """Refused modules still ran FlashInfer's generator first: 3000 entries in a 50 KB archive left 83 MB of
    generated sources."""
    def must_not_generate(*a, **k):
        raise AssertionError("FlashInfer's generator ran for a module that is refused anyway")

    monkeypatch.setattr(cachepack, "make_spec", must_not_generate)
    mod = cachemeta.Module("sampling", {"jit/sampling/sampling_kernel.cuda.o": "0" * 64})
    why = cachepack._refusal({"name": "sampling"}, mod, _session(), tmp_path)
    assert why and "carries no library" in why


def test_a_stale_import_names_the_path_absent_here(tmp_path):
    """Round 6 (F4): an import made stale by another Python's include directory was cut at 300
    characters before the flag that differs, naming neither the value nor a fix."""
    from flashinfer_sm120.warmup import cachepack

    here = tmp_path / "include"
    here.mkdir()
    gone = "/opt/other-python/include/python3.11"
    cmd = f"nvcc {'-DX ' * 200}-I{here} -isystem {gone} -c a.cu -o a.o"
    assert gone in cachepack._absent_here(cmd) and str(here) not in cachepack._absent_here(cmd)
    assert cachepack._absent_here(f"nvcc -I{here} -c a.cu") == ""
