"""The bounded tar reader (``safety.formats.tar.TarReader``, threat-model: P6): tar headers Python's
``tarfile`` itself mishandles are refused.  Each case failed before its fix (``tarfile`` raised
``ValueError``/``IndexError``/``UnicodeDecodeError``, a traceback, not our refusal; held a pax or GNU
long-name header of any declared size in memory whole; or, Python < 3.11.10, CVE-2024-6232, scanned a
large pax header quadratically)."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
import tarfile
import tracemalloc

import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers.exports import TOP, pax_header, pax_record, tar_bytes, tar_file, tar_header, tar_member

from flashinfer_sm120.errors import FormatError
from flashinfer_sm120.safety.formats.tar import TarReader


def _write(tmp_path, body: bytes, gz: bool = True) -> str:
    path = tmp_path / ("x.tar.gz" if gz else "x.tar")
    path.write_bytes(gzip.compress(body, compresslevel=1) if gz else body)
    return str(path)


def _pass(src: str, into=None, max_bytes: int = 1 << 30) -> list[str]:
    """One pass over ``src``: every member's name, each regular member read (or, with ``into``,
    extracted there)."""
    names = []
    with TarReader(src, max_bytes=max_bytes, max_seconds=60, cap="test cap", fix="the fix") as tar:
        for m in tar:
            names.append(m.name)
            if into is not None and (m.isfile() or m.isdir()):
                tar.extract(m, into)
            elif m.isfile():
                tar.read(m)
    return names


def _refused(src: str) -> str:
    with pytest.raises(FormatError) as info:
        _pass(src)
    msg = str(info.value)
    assert src in msg and len(msg) < 1000 and info.value.fix.endswith("the fix"), msg
    return msg


CASES = {
    # hdrcharset's value is decoded with .decode("utf-8"), no fallback: UnicodeDecodeError
    "pax hdrcharset not UTF-8": pax_header(pax_record(b"hdrcharset", b"\xff\xfe")) + tar_file(),
    # GNU sparse 0.1: int() of each map entry: ValueError
    "pax GNU.sparse.map not numbers": pax_header(pax_record(b"GNU.sparse.map", b"x,y")) + tar_file(),
    # GNU sparse 0.0: GNU.sparse.size is int()-ed in _apply_pax_info: ValueError
    "pax GNU.sparse.size not a number": pax_header(pax_record(b"GNU.sparse.size", b"12x")) + tar_file(),
    "pax GNU.sparse.realsize not a number": pax_header(pax_record(b"GNU.sparse.realsize", b"-")) + tar_file(),
    # GNU sparse 1.0: the map is read from the member's data: int(b"x") ValueError ...
    "sparse 1.0 map not a number": (pax_header(pax_record(b"GNU.sparse.major", b"1")
                                               + pax_record(b"GNU.sparse.minor", b"0")) + tar_file(data=b"x\n")),
    # ... and a map longer than the archive ends in a split of nothing: ValueError (unpack)
    "sparse 1.0 map past the end": (pax_header(pax_record(b"GNU.sparse.major", b"1")
                                               + pax_record(b"GNU.sparse.minor", b"0"))
                                    + tar_header(f"{TOP}/meta.json", 0)),
    # old GNU sparse with the 'extended' flag and no extension block: buf[504] of b"": IndexError
    "old GNU sparse, extension missing": tar_header(f"{TOP}/meta.json", 0, b"S",
                                                    raw_tail=b"\0" * (482 - 345) + b"\1"),
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
        body = (tar_header("././@LongLink" if kind == b"L" else "././@PaxHeader", size, kind) + b"\0" * size
                + tar_file())
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
    src = _write(tmp_path, pax_header(b"1" * (1 << 20)) + tar_file())
    code = ("import sys\nfrom flashinfer_sm120.errors import FormatError\n"
            "from flashinfer_sm120.safety.formats.tar import TarReader\ntry:\n"
            "    with TarReader(sys.argv[1], max_bytes=1 << 30, max_seconds=60, cap='c', fix='f') as tar:\n"
            "        list(tar)\nexcept FormatError as e:\n    print('REFUSED', e)\n")
    proc = subprocess.run([sys.executable, "-c", code, src], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "REFUSED" in proc.stdout, proc.stderr[-2000:]


def test_an_ordinary_archive_still_reads(tmp_path):
    """The bounded reader keeps what tarfile writes itself (pax format, long names, gzip or not)."""
    body = tar_bytes([tar_member(f"{TOP}/meta.json", b"{}", pax={"comment": "x" * 300}),
                      tar_member(f"{TOP}/" + "d" * 200 + "/f.so", b"so")])
    for gz in (True, False):
        assert _pass(_write(tmp_path, body, gz)) == [f"{TOP}/meta.json", f"{TOP}/" + "d" * 200 + "/f.so"]


def test_the_tarfile_hooks_the_bounded_reader_overrides_still_exist():
    """The refusals live in ``TarInfo`` hooks; a Python whose tarfile renamed them would skip them."""
    for name in ("_proc_member", "_proc_gnusparse_00", "_proc_gnusparse_01", "_proc_gnusparse_10"):
        assert callable(getattr(tarfile.TarInfo, name, None)), name


def test_the_bytes_out_of_the_decompressor_are_capped_and_the_cap_said(tmp_path):
    src = _write(tmp_path, tar_bytes([tar_member("a", bytes(1 << 20))]))
    with pytest.raises(FormatError, match=r"it unpacks to more than 65536 bytes \(test cap\)"):
        _pass(src, max_bytes=1 << 16)


_VALID = tar_bytes([tar_member(f"{TOP}/meta.json", b"{}", pax={"comment": "é" * 40}),
                    tar_member(f"{TOP}/jit", kind=tarfile.DIRTYPE), tar_member(f"{TOP}/jit/m.so", b"so")])


@given(st.lists(st.tuples(st.integers(0, len(_VALID) - 1), st.integers(0, 255)), min_size=1, max_size=12),
       st.booleans())
def test_mutated_headers_property(tmp_path, edits, gz):
    """Any bytes in the headers, checksums kept right so that the edits get parsed: a pass that extracts
    every member gives our refusal (a bounded message) or succeeds, never another exception, and
    writes nothing outside the directory it extracts into (P6)."""
    data = bytearray(_VALID)
    for pos, byte in edits:
        data[pos] = byte
    for off in range(0, len(data) - 511, 512):
        if data[off + 257:off + 262] == b"ustar":
            block = bytearray(data[off:off + 512])
            block[148:156] = b" " * 8
            data[off + 148:off + 156] = b"%06o\0 " % sum(block)
    box = tmp_path / "box"
    into = box / "into"
    into.mkdir(parents=True, exist_ok=True)
    src = _write(box, bytes(data), gz)
    try:
        _pass(src, into)
    except FormatError as exc:
        assert len(str(exc)) < 2000
    assert sorted(p.name for p in box.iterdir()) == sorted(["into", os.path.basename(src)])
    for p in into.rglob("*"):
        assert p.resolve().is_relative_to(into.resolve())
    os.unlink(src)


@pytest.mark.parametrize("second", ["a/b.txt", "./a/b.txt"])
def test_a_member_named_twice_is_refused_naming_it(tmp_path, second):
    """A second member of one name would replace what the first one's checks passed: refused, naming the
    member (its message named a file in a temporary directory already removed)."""
    src = _write(tmp_path, tar_bytes([tar_member("a/b.txt", b"first"), tar_member(second, b"second")]), gz=False)
    with pytest.raises(FormatError, match=r"holds the member 'a/b.txt' twice"):
        _pass(src, tmp_path / "out")
