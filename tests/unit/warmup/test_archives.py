"""Reading a `cache import` archive: only what `cache export` writes (tar or gzip, by magic bytes),
meta.json first, and every pass capped in bytes read from the decompressor and in time.
threat-model: P6."""

from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import os
import tarfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers.child import cli
from flashinfer_sm120.warmup import cachemeta, cacheread
from flashinfer_sm120.warmup.session import BuildError

TOP = cachemeta.TOP
BOMB = Path(__file__).resolve().parents[2] / "data" / "bzip2-bomb-450MB.tar"


def _meta(modules=()) -> bytes:
    return json.dumps({"format": 1, "fingerprint": {"flashinfer": "0.7.4", "targets": ["12.0f"],
                                                    "cuda_version": "13.0", "cuda_home": "/c", "jit_dir": "/j"},
                       "modules": list(modules)}).encode()


def _tar_bytes(members, fmt=tarfile.PAX_FORMAT) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def _file(name, data=b"x", pax=None):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    if pax:
        info.pax_headers = pax
    return info, data


def test_the_450MB_bzip2_bomb_named_tar_is_refused_by_its_magic_bytes(clean_env, tmp_path):
    """Regression: a 430-byte bzip2 ``cache.tar`` declaring 450 MB of zeros kept `cache import` busy
    past 120 s (stream mode accepted any compression, and skipping bzip2 data is quadratic)."""
    src = tmp_path / "cache.tar"
    src.write_bytes(BOMB.read_bytes())
    proc = cli(["cache", "import", str(src), "--json"], dict(clean_env, FAKE_GPU_CAPS=""), timeout=60)
    doc = json.loads(proc.stdout)
    assert proc.returncode == 2 and doc["ok"] is False
    assert doc["error"]["kind"] == "archive"
    assert "bzip2" in doc["error"]["message"] and str(src) in doc["error"]["message"]
    assert "gzip" in doc["error"]["fix"]


@pytest.mark.parametrize("kind,compress", [("bzip2", bz2.compress), ("xz", lzma.compress),
                                           ("unknown", lambda b: b"not a tar at all" * 64)])
def test_compressions_export_never_writes_are_refused_whatever_the_name(tmp_path, kind, compress):
    body = _tar_bytes([_file(f"{TOP}/meta.json", _meta())])
    for name in ("x.tar", "x.tar.gz", "x.tgz"):
        src = tmp_path / name
        src.write_bytes(compress(body))
        with pytest.raises(cachemeta.CacheError) as info:
            cacheread.check_members(str(src))
        assert info.value.kind == "archive" and f"is {kind} data" in str(info.value)


def test_gzip_and_plain_tar_are_read_whatever_the_name(tmp_path):
    body = _tar_bytes([_file(f"{TOP}/meta.json", _meta())])
    for name, data in (("a.tar.gz", body), ("b.tar", gzip.compress(body))):  # name and content disagree
        src = tmp_path / name
        src.write_bytes(data)
        assert cacheread.check_members(str(src)).fingerprint["flashinfer"] == "0.7.4"


def test_meta_json_must_be_the_first_member(tmp_path):
    src = tmp_path / "x.tar"
    src.write_bytes(_tar_bytes([_file(f"{TOP}/generated/a.cu"), _file(f"{TOP}/meta.json", _meta())]))
    with pytest.raises(cachemeta.CacheError, match="first member is .*generated/a.cu'?, not .*meta.json"):
        cacheread.read_meta(str(src))


def test_decompressed_bytes_are_counted_not_declared(tmp_path, monkeypatch):
    """Pax headers are data the member headers do not declare: the pass is capped on what the
    decompressor produced."""
    monkeypatch.setattr(cachemeta, "MAX_META_BYTES", 4096)
    limits = cachemeta.Limits(max_total=1, max_members=10)
    pax = {"comment": "z" * 15_000}
    members = [_file(f"{TOP}/meta.json", b"{}")]
    for i in range(8):
        info = tarfile.TarInfo(f"{TOP}/d{i}")
        info.type, info.pax_headers = tarfile.DIRTYPE, pax
        members.append((info, None))
    src = tmp_path / "x.tar.gz"
    src.write_bytes(gzip.compress(_tar_bytes(members)))
    with pytest.raises(cachemeta.CacheError, match="unpacks to more than"):
        cacheread.check_members(str(src), limits)


def test_each_pass_has_a_time_cap(tmp_path):
    src = tmp_path / "x.tar"
    src.write_bytes(_tar_bytes([_file(f"{TOP}/meta.json", _meta())]))
    with pytest.raises(cachemeta.CacheError, match="took more than"):
        cacheread.check_members(str(src), cachemeta.Limits(max_seconds=-1))


def test_a_gzip_member_over_the_cap_is_refused_on_its_header(tmp_path):
    """The total cap holds on headers before the data is decompressed (a gzip bomb of zeros)."""
    big = tarfile.TarInfo(f"{TOP}/jit/m/m.so")
    big.size = 50 << 20
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", compresslevel=1) as z, \
            tarfile.open(fileobj=z, mode="w|") as tar:
        info, data = _file(f"{TOP}/meta.json", _meta())
        tar.addfile(info, io.BytesIO(data))
        tar.addfile(big, io.BytesIO(bytes(big.size)))
    src = tmp_path / "x.tar.gz"
    src.write_bytes(buf.getvalue())
    with pytest.raises(cachemeta.CacheError, match="cap"):
        cacheread.check_members(str(src), cachemeta.Limits(max_total=1 << 20, max_file=1 << 30))


_GOOD = _tar_bytes([_file(f"{TOP}/meta.json", _meta([{"name": "m", "files": {
    "jit/m/m.so": "0" * 64}}])), _file(f"{TOP}/jit/m/m.so", b"so")])


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
    limits = cachemeta.Limits(max_total=1 << 20, max_file=1 << 20, max_members=50, max_seconds=30)
    try:
        meta = cacheread.check_members(str(src), limits)
        from flashinfer_sm120.warmup import cachepack

        cachepack._unpack(str(src), into, meta, limits)
    except BuildError as exc:
        assert len(str(exc)) < 2000
    assert {p.name for p in box.iterdir()} <= {"x.tar", "into"}
    for p in into.rglob("*"):
        assert p.resolve().is_relative_to(into.resolve())
    os.unlink(src)


def test_gzip_members_that_unpack_to_nothing_are_capped_on_the_compressed_bytes(tmp_path, monkeypatch):
    """Regression: a .tar.gz of many empty gzip members before the real one (gzip reads concatenated
    members as one stream) was read whole inside one read of the decompressor: no byte came out, so
    neither the unpacked-bytes cap nor the time cap (checked between reads) ever saw it; 40 MB of
    them took 8 s a pass and the file's size was capped by nothing.  threat-model: P6"""
    monkeypatch.setattr(cachemeta, "MAX_META_BYTES", 4096)
    limits = cachemeta.Limits(max_total=4096, max_members=4)
    empty = gzip.compress(b"", mtime=0)
    cap = limits.max_stream() + limits.max_stream() // 1000 + (1 << 20)
    src = tmp_path / "x.tar.gz"
    src.write_bytes(empty * (cap // len(empty) + 1) + gzip.compress(_tar_bytes([_file(f"{TOP}/meta.json", _meta())])))
    with pytest.raises(cachemeta.CacheError, match="compressed data is more than"):
        cacheread.check_members(str(src), limits)


def test_a_file_at_the_deepest_path_meta_json_lists_is_a_member_too(tmp_path):
    """Regression: meta.json lists paths of up to 16 parts, and a member is the top folder and such
    a path: the deepest listed file was refused as a member, "not a plain relative path"."""
    rel = "generated/" + "/".join(["d"] * 14) + "/f.cu"
    assert len(rel.split("/")) == 16
    src = tmp_path / "x.tar"
    src.write_bytes(_tar_bytes([_file(f"{TOP}/meta.json", _meta([{"name": "m", "files": {rel: "0" * 64}}])),
                                _file(f"{TOP}/{rel}", b"x")]))
    meta = cacheread.check_members(str(src))
    assert [m.name for m in meta.modules] == ["m"]


def test_a_fingerprint_with_more_targets_than_a_manifest_entry_is_refused_naming_the_archive(tmp_path):
    """Regression: meta.json's fingerprint could list 4096 targets: `cache import` printed them all
    ("using the archive's targets ...", 21 kB on one line), then refused a "--arch" 21529 characters
    long that the user never gave.  Now the archive is refused, naming its field."""
    obj = json.loads(_meta())
    obj["fingerprint"]["targets"] = ["12.0"] * 4096
    src = tmp_path / "x.tar"
    src.write_bytes(_tar_bytes([_file(f"{TOP}/meta.json", json.dumps(obj).encode())]))
    with pytest.raises(BuildError, match="'fingerprint'.*'targets' is longer than") as exc:
        cacheread.check_members(str(src))
    assert "--arch" not in str(exc.value) and len(str(exc.value)) < 1000


def test_a_python_without_tarfile_filters_refuses_archives_with_the_fix(tmp_path, monkeypatch):
    """Round 6 (F1): on Python 3.11.2 (Debian 12) ``cache import ARCHIVE`` crashed with ``TypeError:
    extract() got an unexpected keyword argument 'filter'`` and printed no JSON."""
    from helpers.exports import as_archive, make_export
    from flashinfer_sm120.warmup import cachepack

    src = as_archive(make_export(tmp_path / "exp", {"jit/m/m.so": b"so"}), tmp_path / "exp.tar.gz")
    meta = cacheread.read_meta(str(src), cachemeta.Limits())
    monkeypatch.delattr(tarfile, "data_filter")
    (tmp_path / "into").mkdir()
    with pytest.raises(cachemeta.CacheError) as err:
        cachepack._unpack(str(src), tmp_path / "into", meta, cachemeta.Limits())
    assert err.value.kind == "python" and "3.11.4" in err.value.fix and str(src) in str(err.value)
    assert os.listdir(tmp_path / "into") == []  # nothing unpacked
