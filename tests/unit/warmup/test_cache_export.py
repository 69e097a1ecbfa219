"""`cache export`: what it writes, `cache import` accepts (names as long as FlashInfer makes them); a
directory export that fails leaves nothing behind; both forms are written only into a directory of your
own (threat-model P4, P5, P7)."""

from __future__ import annotations

import json
import os
import types

import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers.untrusted import make_unsafe

from flashinfer_sm120.errors import FormatError
from flashinfer_sm120.safety.formats.grammar import parse_relpath
from flashinfer_sm120.warmup import cache
from flashinfer_sm120.warmup.session import BuildError

# FlashInfer 0.7.4's FA2 prefill module (185 characters) and one of its objects (227), as `build` makes them.
PREFILL = ("batch_prefill_with_kv_cache_dtype_q_bf16_dtype_kv_bf16_dtype_o_bf16_dtype_idx_i32_head_dim_qk_128_"
           "head_dim_vo_128_posenc_0_use_swa_False_use_logits_cap_False_f16qk_False_kv_stride_equal")
OBJECT = PREFILL + "_batch_prefill_ragged_kernel_mask_0.cuda.o"


def test_a_module_name_as_long_as_flashinfers_is_a_member_and_a_meta_json_name():
    """A new user's export of the README's main job was refused by its own import: the attention
    modules' object files (227 characters) were over a 200-character name rule."""
    assert len(OBJECT) > 200
    rel = f"jit/{PREFILL}/{OBJECT}"
    assert cache.member_rel(f"{cache.TOP}/{rel}", "x.tar") == rel
    meta = cache.parse_meta({"format": cache.FORMAT, "manifest": [], "fingerprint": {
        "flashinfer": "0.7.4", "targets": ["12.0f"], "cuda_version": "13.0", "cuda_home": "/c", "jit_dir": "/j"},
                                 "modules": [{"name": PREFILL, "files": {rel: "0" * 64}},
                                             {"name": "m", "label": "prefill-bf16-hd128", "files": {}}]}, "meta.json")
    assert [(m.name, m.label) for m in meta.modules] == [(PREFILL, PREFILL), ("m", "prefill-bf16-hd128")]


def test_a_name_longer_than_linux_takes_is_refused():
    with pytest.raises(FormatError):
        parse_relpath("a" * 256, "member")
    assert parse_relpath("a" * 255, "member") == ("a" * 255,)


def test_a_directory_export_that_fails_leaves_nothing_behind(tmp_path):
    """A failed directory export left a partial directory that also blocked the retry ("already
    exists")."""
    good = tmp_path / "good.so"
    good.write_bytes(b"x" * 100)
    out = tmp_path / "export"
    files = [("jit/m/good.so", good, 100), ("jit/m/gone.so", tmp_path / "gone.so", 1)]  # the second cannot be read
    with pytest.raises(FileNotFoundError):
        cache._write_directory(str(out), b"{}", files)
    assert sorted(os.listdir(tmp_path)) == ["good.so"]


def test_a_directory_export_is_put_in_place_whole(tmp_path):
    good = tmp_path / "good.so"
    good.write_bytes(b"x" * 100)
    out = tmp_path / "export"
    out.mkdir()  # an empty directory of yours is taken
    blob = json.dumps({"format": 1}).encode()
    cache._write_directory(str(out), blob, [("jit/m/good.so", good, 100)])
    top = out / cache.TOP
    assert (top / "jit" / "m" / "good.so").read_bytes() == b"x" * 100 and (top / "meta.json").read_bytes() == blob
    assert sorted(os.listdir(tmp_path)) == ["export", "good.so"]


def test_a_file_that_grew_past_its_checked_size_is_refused_and_nothing_is_left(tmp_path):
    """The caps are checked on each file's size before the copy; a file that grew since is not copied on (P6)."""
    grown = tmp_path / "grown.so"
    grown.write_bytes(b"x" * 200)
    with pytest.raises(cache.CacheError, match=f"{grown} grew past the 100 bytes"):
        cache._write_directory(str(tmp_path / "export"), b"{}", [("jit/m/grown.so", grown, 100)])
    assert sorted(os.listdir(tmp_path)) == ["grown.so"]


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
    with pytest.raises(BuildError, match="the export") as err:
        cache.export([], _session(), str(out))
    assert err.value.fix == "export to a new path in a directory of your own"  # P8: the JSON fix is never empty
    assert str(err.value).count("Fix:") == 1
    assert not out.exists() and [p.name for p in theirs.iterdir()] == []


def test_an_export_into_a_directory_of_your_own_is_written(tmp_path):
    out = tmp_path / "mine" / "out.tar.gz"
    out.parent.mkdir()
    assert cache.export([], _session(), str(out)) == [] and out.is_file()


@given(st.text(alphabet=st.characters(blacklist_characters="/\0"), min_size=1, max_size=200),
       st.sampled_from(["", ".tar", ".tar.gz", ".TGZ", ".tar.xz", ".zip", ".gz", ".7z"]))
def test_the_output_name_check_property(tmp_path, stem, suffix):
    """Any output name: accepted (a new directory, or an archive name export writes), or our refusal with a
    bounded message and a fix; an archive name export writes is never refused for its name, and the check
    creates nothing (P4, P8)."""
    out = str(tmp_path / (stem + suffix))
    before = sorted(os.listdir(tmp_path))
    try:
        cache.check_out(out)
    except cache.CacheError as exc:
        assert exc.kind in ("usage", "exists") and exc.fix and len(str(exc)) < 2000
        assert exc.kind == "exists" or not out.lower().endswith(cache.ARCHIVES)
    else:
        assert out.lower().endswith(cache.ARCHIVES) or suffix not in (".tar.xz", ".zip", ".gz", ".7z")
    assert sorted(os.listdir(tmp_path)) == before


def test_an_archive_over_ulimit_f_is_named_by_its_files_before_compression(tmp_path):
    """Under ``ulimit -f`` a .tar.gz export said "the archive is N bytes" with N its files' size: the archive is not
    written yet and may compress well below it (P8: a statement must be true)."""
    import resource

    from flashinfer_sm120.warmup import cache as cache_mod

    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1000, hard))
    try:
        with pytest.raises(cache_mod.CacheError) as exc:
            cache_mod.check_sizes("export", [(str(tmp_path / "m" / "m.so"), 2000)], cache_mod.Limits(),
                                  "elsewhere", archive=str(tmp_path / "out.tar.gz"))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert "the archive (its files before compression) is 2000 bytes" in str(exc.value) and "ulimit -f" in str(exc.value)


@pytest.mark.parametrize("what", ["file-link", "dir-link", "fifo"])
def test_a_link_or_special_file_in_the_workspace_is_named_as_local_not_dropped(tmp_path, what):
    """A module's .so replaced by a link was left out of the export (exit 0, no library); the refusal names the
    path in this machine's JIT workspace and the fix there, not the archive's (P5, P8)."""
    real = tmp_path / "real"
    real.mkdir()
    (real / "m.so").write_bytes(b"x")
    mod = tmp_path / "cached_ops" / "m"
    mod.mkdir(parents=True)
    (mod / "build.ninja").write_text("")
    bad = mod
    if what == "dir-link":
        (mod / "build.ninja").unlink()
        mod.rmdir()
        os.symlink(real, mod)
    elif what == "file-link":
        bad = mod / "m.so"
        os.symlink(real / "m.so", bad)
    else:
        bad = mod / "m.so"
        os.mkfifo(bad)
    with pytest.raises(cache.CacheError) as exc:
        cache._module_files(mod, "m", "sampling")
    e = exc.value
    assert str(bad) in str(e) and e.kind == "path" and "build sampling" in e.fix and cache.FIX not in str(e), e


@pytest.mark.parametrize("name", ["out", "out.tar", "out.tar.gz"])
def test_a_write_that_fails_for_space_names_the_export_in_json(tmp_path, monkeypatch, capsys, name):
    """ENOSPC while the export was written said "the disk holding 'the file' is full": a failed write carries
    no file name, so the message names the output (P8)."""
    import argparse
    import errno

    from flashinfer_sm120.cli import cache as cli_cache

    def full(*_a, **_k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(cache, "write_atomic", full)
    out = str(tmp_path / name)
    doc = cli_cache._doc(out=out)
    with pytest.raises(OSError) as exc:
        cache.export([], _session(), out)
    assert cli_cache._failed(argparse.Namespace(json=True), doc, "export", exc.value) == 1
    err = json.loads(capsys.readouterr().out)["error"]
    assert err["kind"] == "space" and repr(out) in err["message"] and "the file" not in err["message"], err
    assert err["fix"] and not os.path.exists(out)


@pytest.mark.parametrize("name", ["out", "out.tar", "out.tar.gz"])
def test_the_free_space_check_counts_headers_padding_and_blocks(tmp_path, monkeypatch, name):
    """The check compared the files' bytes with what is free: with exactly that much free it passed and the
    write then ran out of space part way (tar headers, padding and end record, each file rounded up to the
    file system's block, the directories).  The estimate is an upper bound: refused before anything is
    written (P4), by the one check of both forms (P7)."""
    import shutil

    sizes = [1, 511, 513, 4097, 10000]
    files = [(os.path.join(str(tmp_path / name), cache.TOP, "jit", "m", f"f{i}"), n) for i, n in enumerate(sizes)]
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda _p: usage._replace(free=sum(sizes)))
    with pytest.raises(cache.CacheError) as exc:
        cache.check_sizes(str(tmp_path / name), files, cache.Limits(), "elsewhere",
                          archive=str(tmp_path / name) if "." in name else None)
    assert exc.value.kind == "space" and str(sum(sizes)) in str(exc.value) and str(tmp_path) in str(exc.value)
    assert os.listdir(tmp_path) == []


@given(st.lists(st.integers(0, 70000), min_size=1, max_size=6), st.sampled_from(["x", "x.tar", "x.tar.gz"]),
       st.integers(1, 150))
def test_the_space_estimate_is_an_upper_bound_of_what_is_written_property(tmp_path_factory, sizes, name, namelen):
    """Any files, any form: with one byte less free than the export took (in file-system blocks), the check
    refuses it (P4: refused before anything is written, never part way)."""
    import shutil
    from unittest import mock

    tmp = tmp_path_factory.mktemp("space")
    src = []
    for i, n in enumerate(sizes):
        (tmp / f"s{i}").write_bytes(os.urandom(n))
        src.append((f"jit/{'m' * namelen}/f{i}", tmp / f"s{i}", n))
    out, blob = tmp / "out" / name, b"{}"
    out.parent.mkdir()
    (cache._write_archive if "." in name else cache._write_directory)(str(out), blob, src)
    used = sum(os.lstat(os.path.join(d, f)).st_blocks * 512 for d, dirs, fs in os.walk(out.parent) for f in fs + dirs)
    shutil.rmtree(out) if out.is_dir() else out.unlink()
    wanted = [(str(out / cache.TOP / rel), n) for rel, _, n in src] + [(str(out / cache.TOP / "meta.json"), len(blob))]
    usage = shutil.disk_usage(tmp)
    with mock.patch.object(shutil, "disk_usage", lambda _p: usage._replace(free=used - 1)):
        with pytest.raises(cache.CacheError, match="free"):
            cache.check_sizes(str(out), wanted, cache.Limits(), "elsewhere", archive=str(out) if "." in name else None)


def test_the_max_bytes_refusal_names_the_total_and_the_cap(tmp_path):
    """The --max-bytes refusal named the cap but not what the files add up to, nor the value that would pass."""
    files = [(str(tmp_path / "m" / name), 600) for name in ("a.o", "m.so")]
    with pytest.raises(cache.CacheError) as exc:
        cache.check_sizes("export", files, cache.Limits(max_total=1000), "export elsewhere")
    assert exc.value.kind == "limit" and "1200 bytes" in str(exc.value) and "1000" in str(exc.value)
    assert "--max-bytes 1200" in exc.value.fix
