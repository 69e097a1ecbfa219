"""`cache import`: reading an export as untrusted input (threat-model: P6) and where it installs (P2, P4).

An archive is read only as `cache export` writes it (tar or gzip, by magic bytes), meta.json first, every
pass capped in bytes read from the decompressor and in time.  Tar headers Python's ``tarfile`` itself
mishandles are refused: each case failed before its fix (``tarfile`` raised ``ValueError``/``IndexError``/
``UnicodeDecodeError``, a traceback, not our refusal; held a pax or GNU long-name header of any declared
size in memory whole; or, Python < 3.11.10, CVE-2024-6232, scanned a large pax header quadratically).
"""

from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import os
import subprocess
import sys
import tarfile
import tracemalloc
import types
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers.child import cli
from helpers.untrusted import give_away
from flashinfer_sm120.warmup import cache_export, cache_format, cache_import
from flashinfer_sm120.warmup.session import BuildError

TOP = cache_format.TOP
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
    body = _tar_bytes([_file(f"{TOP}/meta.json", _meta())])
    for name in ("x.tar", "x.tar.gz", "x.tgz"):
        src = tmp_path / name
        src.write_bytes(compress(body))
        with pytest.raises(cache_format.CacheError) as info:
            cache_format.check(str(src))
        assert info.value.kind == "archive" and f"is {kind} data" in str(info.value)


def test_gzip_and_plain_tar_are_read_whatever_the_name(tmp_path):
    body = _tar_bytes([_file(f"{TOP}/meta.json", _meta())])
    for name, data in (("a.tar.gz", body), ("b.tar", gzip.compress(body))):  # name and content disagree
        src = tmp_path / name
        src.write_bytes(data)
        assert cache_format.check(str(src)).fingerprint["flashinfer"] == "0.7.4"


def test_meta_json_must_be_the_first_member(tmp_path):
    src = tmp_path / "x.tar"
    src.write_bytes(_tar_bytes([_file(f"{TOP}/generated/a.cu"), _file(f"{TOP}/meta.json", _meta())]))
    with pytest.raises(cache_format.CacheError, match="first member is .*generated/a.cu'?, not .*meta.json"):
        cache_format.check(str(src))


def test_decompressed_bytes_are_counted_not_declared(tmp_path, monkeypatch):
    """Pax headers are data the member headers do not declare: the pass is capped on what the
    decompressor produced."""
    monkeypatch.setattr(cache_format, "MAX_META_BYTES", 4096)
    limits = cache_format.Limits(max_total=1, max_members=10)
    pax = {"comment": "z" * 15_000}
    listed = [{"name": "m", "files": {f"generated/d{i}/a.cu": "0" * 64 for i in range(8)}}]
    members = [_file(f"{TOP}/meta.json", _meta(listed))]
    for i in range(8):  # folders meta.json lists: only the bytes read refuse them
        info = tarfile.TarInfo(f"{TOP}/generated/d{i}")
        info.type, info.pax_headers = tarfile.DIRTYPE, pax
        members.append((info, None))
    src = tmp_path / "x.tar.gz"
    src.write_bytes(gzip.compress(_tar_bytes(members)))
    with pytest.raises(cache_format.CacheError, match="unpacks to more than"):
        cache_format.check(str(src), limits)


def test_each_pass_has_a_time_cap(tmp_path):
    src = tmp_path / "x.tar"
    src.write_bytes(_tar_bytes([_file(f"{TOP}/meta.json", _meta())]))
    with pytest.raises(cache_format.CacheError, match="took more than"):
        cache_format.check(str(src), cache_format.Limits(max_seconds=-1))


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
    with pytest.raises(cache_format.CacheError, match="cap"):
        cache_format.check(str(src), cache_format.Limits(max_total=1 << 20, max_file=1 << 30))


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
    limits = cache_format.Limits(max_total=1 << 20, max_file=1 << 20, max_members=50, max_seconds=30)
    try:
        meta = cache_format.check(str(src), limits)
        cache_format.unpack(str(src), into, meta, limits)
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
    monkeypatch.setattr(cache_format, "MAX_META_BYTES", 4096)
    limits = cache_format.Limits(max_total=4096, max_members=4)
    empty = gzip.compress(b"", mtime=0)
    cap = limits.max_stream() + limits.max_stream() // 1000 + (1 << 20)
    src = tmp_path / "x.tar.gz"
    src.write_bytes(empty * (cap // len(empty) + 1) + gzip.compress(_tar_bytes([_file(f"{TOP}/meta.json", _meta())])))
    with pytest.raises(cache_format.CacheError, match="compressed data is more than"):
        cache_format.check(str(src), limits)



def test_a_file_at_the_deepest_path_meta_json_lists_is_a_member_too(tmp_path):
    """A file at the deepest path meta.json may list (16 parts under the top folder) is a member, not "not a
    plain relative path" (P6)."""
    rel = "generated/" + "/".join(["d"] * 14) + "/f.cu"
    assert len(rel.split("/")) == 16
    src = tmp_path / "x.tar"
    src.write_bytes(_tar_bytes([_file(f"{TOP}/meta.json", _meta([{"name": "m", "files": {rel: "0" * 64}}])),
                                _file(f"{TOP}/{rel}", b"x")]))
    meta = cache_format.check(str(src))
    assert [m.name for m in meta.modules] == ["m"]


def test_a_fingerprint_with_more_targets_than_a_manifest_entry_is_refused_naming_the_archive(tmp_path):
    """A meta.json fingerprint listing more targets than a manifest entry may (4096) is refused naming the
    archive's field: `cache import` must not print them all ("using the archive's targets ...", 21 kB on
    one line), nor refuse a "--arch" 21529 characters long that the user never gave (P6, P8)."""
    obj = json.loads(_meta())
    obj["fingerprint"]["targets"] = ["12.0"] * 4096
    src = tmp_path / "x.tar"
    src.write_bytes(_tar_bytes([_file(f"{TOP}/meta.json", json.dumps(obj).encode())]))
    with pytest.raises(BuildError, match="'fingerprint'.*'targets' is longer than") as exc:
        cache_format.check(str(src))
    assert "--arch" not in str(exc.value) and len(str(exc.value)) < 1000


def test_a_python_without_tarfile_filters_refuses_archives_with_the_fix(tmp_path, monkeypatch):
    """On a Python without tarfile filters (3.11.2, Debian 12) ``cache import ARCHIVE`` refuses with
    the fix instead of crashing with ``TypeError: extract() got an unexpected keyword argument
    'filter'`` and printing no JSON (P8)."""
    from helpers.exports import as_archive, make_export
    src = as_archive(make_export(tmp_path / "exp", {"jit/m/m.so": b"so"}), tmp_path / "exp.tar.gz")
    meta = cache_format.check(str(src), cache_format.Limits())
    monkeypatch.delattr(tarfile, "data_filter")
    (tmp_path / "into").mkdir()
    with pytest.raises(cache_format.CacheError) as err:
        cache_format.unpack(str(src), tmp_path / "into", meta, cache_format.Limits())
    assert err.value.kind == "python" and "3.11.4" in err.value.fix and str(src) in str(err.value)
    assert os.listdir(tmp_path / "into") == []  # nothing unpacked


# ---------------------------------------------------------------- tar headers tarfile mishandles


def _header(name: str, size: int, kind: bytes, *, raw_tail: bytes = b"") -> bytes:
    """One ustar header block (checksum filled in); ``raw_tail`` overwrites bytes 345.. (old GNU
    sparse fields live there)."""
    b = bytearray(512)
    b[0:len(name)] = name.encode()
    b[100:108] = b"0000644\0"
    b[108:116] = b"0000000\0"
    b[116:124] = b"0000000\0"
    b[124:136] = b"%011o\0" % size
    b[136:148] = b"00000000000\0"
    b[148:156] = b" " * 8
    b[156:157] = kind
    b[257:265] = b"ustar  \0" if kind == b"S" else b"ustar\x0000"
    if raw_tail:
        b[345:345 + len(raw_tail)] = raw_tail
    b[148:156] = b"%06o\0 " % sum(b)
    return bytes(b)


def _pad(data: bytes) -> bytes:
    return data + b"\0" * (-len(data) % 512)


def _pax(records: bytes) -> bytes:
    return _header("././@PaxHeader", len(records), b"x") + _pad(records)


def _record(key: bytes, value: bytes) -> bytes:
    body = b" " + key + b"=" + value + b"\n"
    n = len(body) + 1
    while len(str(n).encode()) + len(body) != n:
        n += 1
    return str(n).encode() + body


def _member(name: str = f"{TOP}/meta.json", data: bytes = b"{}") -> bytes:
    return _header(name, len(data), b"0") + _pad(data)


def _write(tmp_path, body: bytes, gz: bool = True) -> str:
    path = tmp_path / ("x.tar.gz" if gz else "x.tar")
    with open(path, "wb") as fh:
        if gz:
            with gzip.GzipFile(fileobj=fh, mode="wb", compresslevel=1) as z:
                z.write(body)
        else:
            fh.write(body)
    return str(path)


def _refused(src: str) -> str:
    with pytest.raises(BuildError) as info:
        cache_format.check(src)
    msg = str(info.value)
    assert src in msg and len(msg) < 1000, msg
    return msg


CASES = {
    # hdrcharset's value is decoded with .decode("utf-8"), no fallback: UnicodeDecodeError
    "pax hdrcharset not UTF-8": _pax(_record(b"hdrcharset", b"\xff\xfe")) + _member(),
    # GNU sparse 0.1: int() of each map entry: ValueError
    "pax GNU.sparse.map not numbers": _pax(_record(b"GNU.sparse.map", b"x,y")) + _member(),
    # GNU sparse 0.0: GNU.sparse.size is int()-ed in _apply_pax_info: ValueError
    "pax GNU.sparse.size not a number": _pax(_record(b"GNU.sparse.size", b"12x")) + _member(),
    "pax GNU.sparse.realsize not a number": _pax(_record(b"GNU.sparse.realsize", b"-")) + _member(),
    # GNU sparse 1.0: the map is read from the member's data: int(b"x") ValueError ...
    "sparse 1.0 map not a number": (_pax(_record(b"GNU.sparse.major", b"1") + _record(b"GNU.sparse.minor", b"0"))
                                    + _member(data=b"x\n")),
    # ... and a map longer than the archive ends in a split of nothing: ValueError (unpack)
    "sparse 1.0 map past the end": (_pax(_record(b"GNU.sparse.major", b"1") + _record(b"GNU.sparse.minor", b"0"))
                                    + _header(f"{TOP}/meta.json", 0, b"0")),
    # old GNU sparse with the 'extended' flag and no extension block: buf[504] of b"": IndexError
    "old GNU sparse, extension missing": _header(f"{TOP}/meta.json", 0, b"S", raw_tail=b"\0" * (482 - 345) + b"\1"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_malformed_tar_header_is_refused_not_a_traceback(tmp_path, case):
    msg = _refused(_write(tmp_path, CASES[case]))
    assert "Traceback" not in msg


def test_a_huge_extended_header_is_refused_before_it_is_read_whole(tmp_path):
    """tarfile reads a pax or GNU long-name header's declared size into one bytes object: a 64 MiB
    header (64 KiB gzipped) cost 64 MiB+ (and a 4 GiB one, 4 MiB gzipped, cost 4 GiB)."""
    size = 64 << 20
    for kind in (b"x", b"L"):
        body = _header("././@LongLink" if kind == b"L" else "././@PaxHeader", size, kind) + b"\0" * size + _member()
        src = _write(tmp_path, body)
        del body
        tracemalloc.start()
        try:
            _refused(src)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 16 << 20, (kind, peak)


def test_a_pax_header_of_digits_is_refused_without_a_quadratic_scan(tmp_path):
    """CPython before 3.11.10/3.12.6 (CVE-2024-6232) scans ``\\d+ hdrcharset=`` from every offset of
    the pax header: 1 MiB of digits took hours.  A child process, so a hang is a failure, not a hang."""
    src = _write(tmp_path, _pax(b"1" * (1 << 20)) + _member())
    code = ("import sys\nfrom flashinfer_sm120.warmup import cache_format, cache_import\nfrom flashinfer_sm120.warmup.session "
            "import BuildError\ntry:\n    cache_format.check(sys.argv[1])\nexcept BuildError as e:\n"
            "    print('REFUSED', e)\n")
    proc = subprocess.run([sys.executable, "-c", code, src], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "REFUSED" in proc.stdout, proc.stderr[-2000:]


def test_an_ordinary_archive_still_reads(tmp_path):
    """The bounded reader keeps what tarfile writes itself (pax format, long names, gzip or not)."""
    meta = _meta()
    for gz in (True, False):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
            info = tarfile.TarInfo(f"{TOP}/meta.json")
            info.size = len(meta)
            info.pax_headers = {"comment": "x" * 300}
            tar.addfile(info, io.BytesIO(meta))
        src = _write(tmp_path, buf.getvalue(), gz)
        assert cache_format.check(src, cache_format.Limits()).modules == ()


def test_the_tarfile_hooks_the_bounded_reader_overrides_still_exist():
    """The refusals live in ``TarInfo`` hooks; a Python whose tarfile renamed them would skip them."""
    for name in ("_proc_member", "_proc_gnusparse_00", "_proc_gnusparse_01", "_proc_gnusparse_10"):
        assert callable(getattr(tarfile.TarInfo, name, None)), name


def _valid_archive() -> bytes:
    meta = _meta([{"name": "m", "files": {"jit/m/m.so": "0" * 64}}])
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo(f"{TOP}/meta.json")
        info.size = len(meta)
        info.pax_headers = {"comment": "é" * 40}
        tar.addfile(info, io.BytesIO(meta))
        d = tarfile.TarInfo(f"{TOP}/jit")
        d.type = tarfile.DIRTYPE
        tar.addfile(d)
    return buf.getvalue()


@given(st.lists(st.tuples(st.integers(0, 3071), st.integers(0, 255)), min_size=1, max_size=12), st.booleans())
def test_mutated_headers_property(tmp_path, edits, gz):
    """Any bytes in the headers: our refusal or a successful check, never another exception."""
    data = bytearray(_valid_archive())
    for pos, byte in edits:
        if pos < len(data):
            data[pos] = byte
    for off in range(0, len(data) - 511, 512):  # keep the headers' checksums right, so the edits get parsed
        if data[off + 257:off + 262] == b"ustar":
            block = bytearray(data[off:off + 512])
            block[148:156] = b" " * 8
            data[off + 148:off + 156] = b"%06o\0 " % sum(block)
    src = _write(tmp_path, bytes(data), gz)
    try:
        cache_format.check(src)
    except BuildError as exc:
        assert len(str(exc)) < 2000


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
    paths = {"jit/sampling/sampling.so": (tmp_path / "src.so", theirs / "sampling.so")}
    assert "not safe to install into" in cache_import._place_problem(paths)
    mine = {"jit/other/other.so": (tmp_path / "src.so", cached / "other" / "other.so")}
    assert cache_import._place_problem(mine) is None


def test_a_module_that_carries_no_library_is_refused_before_flashinfer_generates_anything(monkeypatch, tmp_path):
    """Refused modules still ran FlashInfer's generator first: 3000 entries in a 50 KB archive left 83 MB of
    generated sources."""
    def must_not_generate(*a, **k):
        raise AssertionError("FlashInfer's generator ran for a module that is refused anyway")

    monkeypatch.setattr(cache_import, "make_spec", must_not_generate)
    mod = cache_format.Module("sampling", {"jit/sampling/sampling_kernel.cuda.o": "0" * 64})
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
    src = _write(tmp_path, _member(data=meta) + _header(f"{TOP}/jit/m/m.so", 30_000 << 20, b"0"), gz=False)
    msg = _refused(src)
    assert "per-file cap of 8589934592 bytes" in msg and "--max-bytes" not in msg, msg
    with pytest.raises(BuildError, match=r"more than the 1048576-byte cap of --max-bytes"):
        cache_format.check(src, cache_format.Limits(max_total=1 << 20, max_file=1 << 40))
