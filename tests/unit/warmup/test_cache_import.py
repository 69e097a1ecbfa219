"""`cache import`: reading an export as untrusted input (threat-model: P6) and where it installs (P2, P4).

An archive is read only as `cache export` writes it (tar or gzip, by magic bytes), meta.json first, every
pass capped in bytes read from the decompressor and in time.  Tar headers ``tarfile`` itself mishandles:
tests/unit/safety/test_tar.py.
"""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import os
import shutil
import tarfile
import types
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers.child import cli
from helpers.exports import TOP, as_archive, make_export, tar_bytes, tar_file, tar_header, tar_member
from helpers.untrusted import give_away
from flashinfer_sm120.warmup import cache, cache_import
from flashinfer_sm120.warmup.cache import Module
from flashinfer_sm120.warmup.session import BuildError

BOMB = Path(__file__).resolve().parents[2] / "data" / "bzip2-bomb-450MB.tar"


def _meta(modules=()) -> bytes:
    return json.dumps({"format": 1, "fingerprint": {"flashinfer": "0.7.4", "targets": ["12.0f"],
                                                    "cuda_version": "13.0", "cuda_home": "/c", "jit_dir": "/j"},
                       "modules": list(modules)}).encode()


def test_the_450MB_bzip2_bomb_named_tar_is_refused_by_its_magic_bytes(clean_env, tmp_path):
    """A 430-byte bzip2 ``cache.tar`` declaring 450 MB of zeros is refused by its magic bytes: stream mode
    must not accept any compression, since skipping bzip2 data is quadratic and would keep `cache import`
    busy past 120 s (P6)."""
    src = tmp_path / "cache.tar"
    src.write_bytes(BOMB.read_bytes())
    proc = cli(["cache", "import", str(src), "--json"], dict(clean_env, FAKE_GPU_CAPS=""), timeout=60)
    doc = json.loads(proc.stdout)
    assert proc.returncode == 1 and doc["ok"] is False
    assert doc["error"]["kind"] == "archive"
    assert "bzip2" in doc["error"]["message"] and str(src) in doc["error"]["message"]
    assert "gzip" in doc["error"]["fix"]


@pytest.mark.parametrize("kind,compress", [("bzip2", bz2.compress), ("xz", lzma.compress),
                                           ("unknown", lambda b: b"not a tar at all" * 64)])
def test_compressions_export_never_writes_are_refused_whatever_the_name(tmp_path, kind, compress):
    body = tar_bytes([tar_member(f"{TOP}/meta.json", _meta())])
    for name in ("x.tar", "x.tar.gz", "x.tgz"):
        src = tmp_path / name
        src.write_bytes(compress(body))
        with pytest.raises(cache.CacheError) as info:
            cache_import.check(str(src))
        assert info.value.kind == "archive" and f"is {kind} data" in str(info.value)


def test_gzip_and_plain_tar_are_read_whatever_the_name(tmp_path):
    body = tar_bytes([tar_member(f"{TOP}/meta.json", _meta())])
    for name, data in (("a.tar.gz", body), ("b.tar", gzip.compress(body))):  # name and content disagree
        src = tmp_path / name
        src.write_bytes(data)
        assert cache_import.check(str(src)).fingerprint["flashinfer"] == "0.7.4"


def test_meta_json_must_be_the_first_member(tmp_path):
    src = tmp_path / "x.tar"
    src.write_bytes(tar_bytes([tar_member(f"{TOP}/jit/m/a.o"), tar_member(f"{TOP}/meta.json", _meta())]))
    with pytest.raises(cache.CacheError, match="first member is .*jit/m/a.o'? .*, not .*meta.json"):
        cache_import.check(str(src))


def test_decompressed_bytes_are_counted_not_declared(tmp_path, monkeypatch):
    """Pax headers are data the member headers do not declare: the pass is capped on what the
    decompressor produced."""
    monkeypatch.setattr(cache, "MAX_META_BYTES", 4096)
    limits = cache.Limits(max_total=1, max_members=10)
    pax = {"comment": "z" * 15_000}
    listed = [{"name": "m", "files": {f"jit/m/a{i}.o": "0" * 64 for i in range(8)}}]
    members = [tar_member(f"{TOP}/meta.json", _meta(listed))]
    for i in range(8):  # a folder meta.json lists: only the bytes read refuse it
        members.append(tar_member(f"{TOP}/jit/m", kind=tarfile.DIRTYPE, pax=pax))
    src = tmp_path / "x.tar.gz"
    src.write_bytes(tar_bytes(members, gz=True))
    with pytest.raises(cache.CacheError, match="unpacks to more than"):
        cache_import.check(str(src), limits)


def test_each_pass_has_a_time_cap(tmp_path):
    src = tmp_path / "x.tar"
    src.write_bytes(tar_bytes([tar_member(f"{TOP}/meta.json", _meta())]))
    with pytest.raises(cache.CacheError, match="took more than"):
        cache_import.check(str(src), cache.Limits(max_seconds=-1))


def test_a_gzip_member_over_the_cap_is_refused_on_its_header(tmp_path):
    """The total cap holds on headers before the data is decompressed (a gzip bomb of zeros)."""
    src = tmp_path / "x.tar.gz"
    src.write_bytes(tar_bytes([tar_member(f"{TOP}/meta.json", _meta()),
                               tar_member(f"{TOP}/jit/m/m.so", bytes(50 << 20))], gz=True))
    with pytest.raises(cache.CacheError, match="cap"):
        cache_import.check(str(src), cache.Limits(max_total=1 << 20, max_file=1 << 30))


_GOOD = tar_bytes([tar_member(f"{TOP}/meta.json", _meta([{"name": "m", "files": {
    "jit/m/m.so": "0" * 64}}])), tar_member(f"{TOP}/jit/m/m.so", b"so")])


@given(st.lists(st.tuples(st.integers(0, len(_GOOD) - 1), st.integers(0, 255)), max_size=12),
       st.integers(0, len(_GOOD)), st.booleans())
def test_mutated_archives_give_only_our_error(tmp_path, flips, cut, gz):
    """Hypothesis over mutated exports: only our error type, a bounded message, nothing written
    outside the unpack root, each pass within its caps."""
    data = bytearray(_GOOD)
    for at, byte in flips:
        data[at] = byte
    data = bytes(data[:cut]) if cut else bytes(data)
    box = tmp_path / "box"
    box.mkdir(exist_ok=True)
    src = box / "x.tar"
    src.write_bytes(gzip.compress(data) if gz else data)
    into = box / "into"
    into.mkdir(exist_ok=True)
    limits = cache.Limits(max_total=1 << 20, max_file=1 << 20, max_members=50, max_seconds=30)
    try:
        meta = cache_import.check(str(src), limits)
        cache_import.unpack(str(src), into, meta, limits)
    except BuildError as exc:
        assert len(str(exc)) < 2000
    assert {p.name for p in box.iterdir()} <= {"x.tar", "into"}
    for p in into.rglob("*"):
        assert p.resolve().is_relative_to(into.resolve())
    os.unlink(src)


def test_gzip_members_that_unpack_to_nothing_are_capped_on_the_compressed_bytes(tmp_path, monkeypatch):
    """Empty gzip members before the real one in a .tar.gz (gzip reads concatenated members as one stream)
    are capped on the compressed bytes: one read of the decompressor can take them all with no byte
    out, so neither the unpacked-bytes cap nor the time cap (checked between reads) sees them; uncapped,
    40 MB of them take 8 s a pass and the file's size is bounded by nothing (P6)."""
    monkeypatch.setattr(cache, "MAX_META_BYTES", 4096)
    limits = cache.Limits(max_total=4096, max_members=4)
    empty = gzip.compress(b"", mtime=0)
    cap = limits.max_stream() + limits.max_stream() // 1000 + (1 << 20)
    src = tmp_path / "x.tar.gz"
    src.write_bytes(empty * (cap // len(empty) + 1) + gzip.compress(tar_bytes([tar_member(f"{TOP}/meta.json", _meta())])))
    with pytest.raises(cache.CacheError, match="compressed data is more than"):
        cache_import.check(str(src), limits)



def test_a_file_at_the_deepest_path_meta_json_lists_is_a_member_too(tmp_path):
    """A file at the deepest path meta.json may list (jit/NAME/FILE) is a member, not "not a plain relative
    path" (P6); anything else, 0.2.0's generated/ included, refuses the export naming it and the fix."""
    rel = "jit/m/f.o"
    src = tmp_path / "x.tar"
    src.write_bytes(tar_bytes([tar_member(f"{TOP}/meta.json", _meta([{"name": "m", "files": {rel: "0" * 64}}])),
                                tar_member(f"{TOP}/{rel}", b"x")]))
    meta = cache_import.check(str(src))
    assert [m.name for m in meta.modules] == ["m"]
    for other in ("generated/m/x.cu", "jit/other/f.o", "jit/m/d/f.o"):
        src.write_bytes(tar_bytes([tar_member(f"{TOP}/meta.json", _meta([{"name": "m", "files": {other: "0" * 64}}]))]))
        with pytest.raises(cache.CacheError) as err:
            cache_import.check(str(src))
        assert other in str(err.value) and "cache export" in err.value.fix, str(err.value)


def test_a_directory_export_holds_what_meta_json_lists_and_nothing_else_as_an_archive_does(tmp_path):
    """P7: one rule for both forms; an entry meta.json does not list refuses the export naming it, at the first
    one found (a tree of any depth or size behind it is never walked)."""
    top = tmp_path / "x" / TOP
    (top / "jit" / "m").mkdir(parents=True)
    (top / "meta.json").write_bytes(_meta([{"name": "m", "files": {"jit/m/f.o": "0" * 64}}]))
    (top / "jit" / "m" / "f.o").write_bytes(b"x")
    assert [m.name for m in cache_import.check(str(tmp_path / "x")).modules] == ["m"]
    for extra, named in (("jit/m/evil.so", "jit/m/evil.so"), ("jit/other", "jit/other"), ("deep/a/b", "deep"),
                         ("notes.txt", "notes.txt")):
        (top / extra).parent.mkdir(parents=True, exist_ok=True)
        (top / extra).write_bytes(b"y")
        with pytest.raises(cache.CacheError) as err:
            cache_import.check(str(tmp_path / "x"))
        assert f"'{TOP}/{named}' is not listed" in str(err.value) and "cache export" in err.value.fix, str(err.value)
        shutil.rmtree(top / named) if (top / named).is_dir() else (top / named).unlink()


def test_a_fingerprint_with_more_targets_than_a_manifest_entry_is_refused_naming_the_archive(tmp_path):
    """A meta.json fingerprint listing more targets than a manifest entry may (4096) is refused naming the
    archive's field: `cache import` must not print them all ("using the archive's targets ...", 21 kB on
    one line), nor refuse a "--arch" 21529 characters long that the user never gave (P6, P8)."""
    obj = json.loads(_meta())
    obj["fingerprint"]["targets"] = ["12.0"] * 4096
    src = tmp_path / "x.tar"
    src.write_bytes(tar_bytes([tar_member(f"{TOP}/meta.json", json.dumps(obj).encode())]))
    with pytest.raises(BuildError, match="'fingerprint'.*'targets' is longer than") as exc:
        cache_import.check(str(src))
    assert "--arch" not in str(exc.value) and len(str(exc.value)) < 1000


def test_a_python_without_tarfile_filters_refuses_archives_with_the_fix(tmp_path, monkeypatch):
    """On a Python without tarfile filters (3.11.2, Debian 12) ``cache import ARCHIVE`` refuses with
    the fix instead of crashing with ``TypeError: extract() got an unexpected keyword argument
    'filter'`` and printing no JSON (P8)."""
    from helpers.exports import as_archive, make_export
    src = as_archive(make_export(tmp_path / "exp", {"jit/m/m.so": b"so"}), tmp_path / "exp.tar.gz")
    meta = cache_import.check(str(src), cache.Limits())
    monkeypatch.delattr(tarfile, "data_filter")
    (tmp_path / "into").mkdir()
    with pytest.raises(cache.CacheError) as err:
        cache_import.unpack(str(src), tmp_path / "into", meta, cache.Limits())
    assert err.value.kind == "python" and "3.11.4" in err.value.fix and str(src) in str(err.value)
    assert os.listdir(tmp_path / "into") == []  # nothing unpacked


# ---------------------------------------------------------------- where an import writes

def _session():
    fp = {"flashinfer": "0.7.4", "targets": ["12.0f"], "cuda_version": "13.0", "cuda_home": "/c", "jit_dir": "/j"}
    return types.SimpleNamespace(flashinfer="0.7.4", targets=["sm_120f"], fingerprint=lambda: dict(fp))


def test_an_import_never_writes_into_a_module_directory_another_user_left(tmp_path):
    """A module directory another uid left in a shared workspace took the imported .so, which they could
    then swap for their own."""
    cached = tmp_path / "cached_ops"
    theirs = cached / "sampling"
    theirs.mkdir(parents=True)
    give_away(theirs)
    problem = cache_import._refusal(None, Module("sampling", {}), None, cached)
    assert str(theirs) in problem and "remove it if another user made it" in problem
    assert "no manifest entry" in cache_import._refusal(None, Module("other", {}), None, cached)  # its place is fine


def test_a_module_that_carries_no_library_is_refused_before_flashinfer_generates_anything(monkeypatch, tmp_path):
    """Refused modules still ran FlashInfer's generator first: 3000 entries in a 50 KB archive left 83 MB of
    generated sources."""
    def must_not_generate(*a, **k):
        raise AssertionError("FlashInfer's generator ran for a module that is refused anyway")

    monkeypatch.setattr(cache_import, "make_spec", must_not_generate)
    mod = cache.Module("sampling", {"jit/sampling/sampling_kernel.cuda.o": "0" * 64})
    why = cache_import._refusal({"name": "sampling"}, mod, _session(), tmp_path)
    assert why and "carries no library" in why


def test_a_stale_import_names_the_path_absent_here(tmp_path):
    """An import made stale by another Python's include directory names the path absent here, even
    past 300 characters of flags, rather than a message cut before the flag that differs (P8)."""
    here = tmp_path / "include"
    here.mkdir()
    gone = "/opt/other-python/include/python3.11"
    cmd = f"nvcc {'-DX ' * 200}-I{here} -isystem {gone} -c a.cu -o a.o"
    assert gone in cache_import._absent_here(cmd) and str(here) not in cache_import._absent_here(cmd)
    assert cache_import._absent_here(f"nvcc -I{here} -c a.cu") == ""


def test_a_member_over_the_per_file_cap_names_that_cap_not_max_bytes(tmp_path):
    """A 30,000 MiB member is refused on its header, naming the per-file cap that refused it; it blamed
    "the 8589934592-byte cap (cache import --max-bytes)", while --max-bytes (default 32G) had not (P8)."""
    meta = _meta([{"name": "m", "files": {"jit/m/m.so": "0" * 64}}])
    src = tmp_path / "x.tar"
    src.write_bytes(tar_file(data=meta) + tar_header(f"{TOP}/jit/m/m.so", 30_000 << 20))
    with pytest.raises(BuildError) as err:
        cache_import.check(str(src))
    msg = str(err.value)
    assert "per-file cap of 8589934592 bytes" in msg and "--max-bytes" not in msg, msg
    with pytest.raises(BuildError) as err:
        cache_import.check(str(src), cache.Limits(max_total=1 << 20, max_file=1 << 40))
    msg = str(err.value)  # the total so far and the cap that refused it, and a --max-bytes that passes it
    assert f"{30_000 << 20} bytes" in msg and "1048576-byte cap of --max-bytes" in msg, msg
    assert f"--max-bytes {30_000 << 20}" in err.value.fix


def test_the_checks_before_flashinfer_is_set_up_refuse_another_release_or_workspace_only(tmp_path, monkeypatch):
    """What `cache import` can tell before FlashInfer's set-up creates files (P4): another FlashInfer
    release or a JIT dir outside this workspace is refused; a local build of the same release is not."""
    from flashinfer_sm120.core.patch.state import flashinfer_version

    monkeypatch.setenv("FLASHINFER_WORKSPACE_BASE", str(tmp_path))
    here = f"{tmp_path}/.cache/flashinfer/0.7.4/120f/nvcc13.0-x/cached_ops"
    fp = {"flashinfer": flashinfer_version(), "targets": ["12.0f"], "cuda_version": "13.0", "cuda_home": "/c"}
    cache_import.precheck("x.tar", cache.Meta(dict(fp, jit_dir=here), (), ()))
    cache_import.precheck("x.tar", cache.Meta(dict(fp, flashinfer=f"{fp['flashinfer']}+local",
                                                             jit_dir=here), (), ()))
    for other, says in ((dict(fp, flashinfer="0.6.0", jit_dir=here), "flashinfer"),
                        (dict(fp, jit_dir="/elsewhere/.cache/flashinfer/0.7.4/120f/x/cached_ops"), "jit_dir")):
        with pytest.raises(cache.CacheError, match=f"archive has {says} ") as err:
            cache_import.precheck("x.tar", cache.Meta(other, (), ()))
        assert err.value.kind == "mismatch" and err.value.fix
    assert list(tmp_path.iterdir()) == []


def test_a_manifest_and_an_export_mixed_up_name_the_right_command(tmp_path, capsys):
    """`cache import m.jsonl` said "recompress it with gzip", `build --from x.tar.gz` "holds no module entries
    (...; and 21761 more)", `cache import DIR/flashinfer-sm120-cache` "has no flashinfer-sm120-cache/ folder"."""
    from flashinfer_sm120.cli import main

    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"format": 1, "name": "sampling", "flashinfer": "0.7.4", "targets": []}) + "\n")
    export = make_export(tmp_path / "exp", {"jit/m/m.so": b"so"})
    archive = as_archive(export, tmp_path / "x.tar.gz")
    for args, code, fix in (
            (["cache", "import", str(manifest)], 1, f"flashinfer-sm120 build --from {manifest}"),
            (["build", "--arch", "12.0", "--from", str(archive)], 2, f"flashinfer-sm120 cache import {archive}"),
            (["build", "--arch", "12.0", "--from", str(export)], 2, f"flashinfer-sm120 cache import {export}"),
            (["cache", "import", str(export / TOP)], 1, f"flashinfer-sm120 cache import {export}'")):
        assert main(args) == code, args
        err = capsys.readouterr().err
        assert fix in err.split("Fix:")[-1], (args, err)
