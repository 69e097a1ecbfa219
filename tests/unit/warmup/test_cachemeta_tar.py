"""Fourth attack round, ``cache import`` archives: tar headers Python's ``tarfile`` itself mishandles.

Every case failed before its fix: ``tarfile`` raised ``ValueError``/``IndexError``/``UnicodeDecodeError``
(a traceback, not our refusal), held a pax or GNU long-name header of any declared size in memory whole,
or (Python < 3.11.10, CVE-2024-6232) scanned a large pax header quadratically.
"""

from __future__ import annotations

import gzip
import io
import subprocess
import sys
import tarfile
import tracemalloc

import pytest

from flashinfer_sm120.warmup import cachemeta, cacheread
from flashinfer_sm120.warmup.session import BuildError

TOP = cachemeta.TOP


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
        cacheread.check_members(src)
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
    code = ("import sys\nfrom flashinfer_sm120.warmup import cacheread\nfrom flashinfer_sm120.warmup.session "
            "import BuildError\ntry:\n    cacheread.check_members(sys.argv[1])\nexcept BuildError as e:\n"
            "    print('REFUSED', e)\n")
    proc = subprocess.run([sys.executable, "-c", code, src], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "REFUSED" in proc.stdout, proc.stderr[-2000:]


def test_an_ordinary_archive_still_reads(tmp_path):
    """The bounded reader keeps what tarfile writes itself (pax format, long names, gzip or not)."""
    meta = b'{"format": 1}'
    for gz in (True, False):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
            info = tarfile.TarInfo(f"{TOP}/meta.json")
            info.size = len(meta)
            info.pax_headers = {"comment": "x" * 300}
            tar.addfile(info, io.BytesIO(meta))
        src = _write(tmp_path, buf.getvalue(), gz)
        names = [rel for _, _m, rel in cacheread.members(src, cachemeta.Limits())]
        assert names == ["meta.json"]


def test_the_tarfile_hooks_the_bounded_reader_overrides_still_exist():
    """The refusals live in ``TarInfo`` hooks; a Python whose tarfile renamed them would skip them."""
    for name in ("_proc_member", "_proc_gnusparse_00", "_proc_gnusparse_01", "_proc_gnusparse_10"):
        assert callable(getattr(tarfile.TarInfo, name, None)), name


def _valid_archive() -> bytes:
    meta = b'{"format": 1}'
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        d = tarfile.TarInfo(f"{TOP}/jit")
        d.type = tarfile.DIRTYPE
        tar.addfile(d)
        info = tarfile.TarInfo(f"{TOP}/meta.json")
        info.size = len(meta)
        info.pax_headers = {"comment": "é" * 40}
        tar.addfile(info, io.BytesIO(meta))
    return buf.getvalue()


from hypothesis import given, strategies as st  # noqa: E402


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
        cacheread.check_members(src)
    except BuildError as exc:
        assert len(str(exc)) < 2000
