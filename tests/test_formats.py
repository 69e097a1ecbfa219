"""The input boundary (flashinfer_sm120.formats): unit cases and Hypothesis properties.

Properties, for every parser: only FormatError escapes, the message is bounded,
and nothing is written outside the target root."""

from __future__ import annotations

import argparse
import json
import os

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from flashinfer_sm120 import formats
from flashinfer_sm120.errors import FormatError, Sm120Error

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
MSG_MAX = 1024

hostile_text = st.one_of(
    st.text(max_size=300),
    st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x7f), max_size=300),
    st.sampled_from(["", ".", "..", "/", "//tmp/x", "jit//tmp/x/victim", "a/../b", "a\nb", "a b$c:d", "\x00",
                     " 13.0.88\n", "13.0.88", "1e999", "nan", "-1", "x" * 5000]),
)


def test_format_error_is_ours():
    assert issubclass(FormatError, Sm120Error)


@pytest.mark.parametrize("text,want", [("13.0.88", "13.0.88"), (" 13.0.88\n", "13.0.88"), ("1.13.2", "1.13.2"),
                                       ("0.7.2.post1", "0.7.2.post1"), ("2.14.0+cu130", "2.14.0+cu130")])
def test_versions_are_parsed_once_and_formatted_from_the_value(text, want):
    assert str(formats.parse_version(text, "version.json")) == want


@pytest.mark.parametrize("text", ["13.0 .88", "13.0.88\nbuild x: phony", "v13", "", "13..0", "1" * 50, None, 13.0])
def test_bad_versions_are_refused_naming_the_source(text):
    with pytest.raises(FormatError, match="version.json"):
        formats.parse_version(text, "version.json")


@given(hostile_text)
@FUZZ
def test_parse_version_property(text):
    try:
        v = formats.parse_version(text, "src")
    except FormatError as exc:
        assert len(str(exc)) < MSG_MAX
    else:
        assert not any(c.isspace() for c in str(v))


@pytest.mark.parametrize("name", ["norm\nbuild x: phony", "a b$c:d", "..", ".", "", "a/b", "a\x00", "-x"])
def test_names_refuse_ninja_and_path_syntax(name):
    with pytest.raises(FormatError):
        formats.parse_name(name, "manifest line 1")


def test_json_depth_is_refused_not_a_recursion_error():
    deep = "[" * 10000 + "]" * 10000
    with pytest.raises(FormatError, match="nested 10000 deep"):
        formats.loads_json(deep, "version.json")
    assert formats.loads_json('{"a": "[[[[[[[[["}', "x") == {"a": "[[[[[[[[["}
    with pytest.raises(FormatError):
        formats.loads_json("NaN", "x")


@given(st.one_of(st.binary(max_size=400), hostile_text,
                 st.integers(1, 3000).map(lambda n: "{\"a\":" * n + "1" + "}" * n)))
@FUZZ
def test_loads_json_property(data):
    try:
        formats.loads_json(data, "f.json")
    except FormatError as exc:
        assert len(str(exc)) < MSG_MAX


def test_read_bytes_caps_while_reading(tmp_path):
    f = tmp_path / "big"
    f.write_bytes(b"x" * 5000)
    with pytest.raises(FormatError, match="5000 bytes"):
        formats.read_bytes(f, 1000)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(FormatError, match="not a regular file"):
        formats.read_bytes(fifo, 1000)
    with pytest.raises(FormatError, match="not a regular file"):
        formats.read_bytes("/dev/zero", 1000)
    link = tmp_path / "link"
    link.symlink_to(f)
    with pytest.raises(FormatError, match="symlink"):
        formats.read_bytes(link, 10000, follow=False)


def test_iter_lines_refuses_a_long_line_without_reading_it(tmp_path):
    f = tmp_path / "m.jsonl"
    f.write_bytes(b"short\n" + b"y" * 100000 + b"\nnext\n")
    got = []
    with pytest.raises(FormatError, match="line 2 is longer than 1000"):
        for n, line in formats.iter_lines(f, max_line=1000, max_lines=10):
            got.append(line)
    assert got == [b"short"]
    with pytest.raises(FormatError):
        list(formats.iter_lines("/dev/zero", max_line=1000, max_lines=10))


def test_field_types_are_explicit():
    src = "meta.json"
    assert formats.field({"a": 1}, "a", int, src) == 1
    for obj, key, kind in [({"a": True}, "a", int), ({"a": "1"}, "a", int), ([], "a", int), ({}, "a", str),
                           ({"a": float("nan")}, "a", float), ({"a": "x" * 10}, "a", str)]:
        with pytest.raises(FormatError, match="meta.json"):
            formats.field(obj, key, kind, src, max_len=5)
    assert formats.field({}, "a", str, src, default=None) is None


def test_safe_join_refuses_escapes_and_symlinked_parents(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    for rel in ["/tmp/x/victim", "jit//tmp/x/victim", "../x", "a/../../x", "", "a/./b"]:
        with pytest.raises(FormatError):
            formats.safe_join(root, rel, "meta.json")
    (root / "norm").symlink_to("/etc")
    with pytest.raises(FormatError, match="symlink"):
        formats.safe_join(root, "norm/hostname", "meta.json")
    assert formats.safe_join(root, "jit/norm/x.so", "m") == root / "jit" / "norm" / "x.so"


@given(st.lists(hostile_text, min_size=1, max_size=4))
@FUZZ
def test_safe_join_property(tmp_path, parts):
    root = tmp_path / "r"
    root.mkdir(exist_ok=True)
    try:
        p = formats.safe_join(root, "/".join(parts), "src")
    except FormatError as exc:
        assert len(str(exc)) < MSG_MAX
    else:
        assert os.path.commonpath([os.path.abspath(p), str(root)]) == str(root)
        assert os.path.abspath(p) != str(root)


def test_make_private_dirs_ignores_the_umask(tmp_path):
    old = os.umask(0)
    try:
        formats.make_private_dirs(tmp_path / "a" / "b" / "c")
    finally:
        os.umask(old)
    for p in (tmp_path / "a", tmp_path / "a" / "b", tmp_path / "a" / "b" / "c"):
        assert (os.stat(p).st_mode & 0o777) == 0o700


def test_messages_quote_a_bounded_value():
    big = "x " * 500000
    assert len(formats.shown(big)) < 200
    assert "and 997 more" in formats.some(range(1000))
    with pytest.raises(FormatError) as exc:
        formats.env_text("V", {"V": big})
    assert len(str(exc.value)) < 300


@pytest.mark.parametrize("conv,text", [(formats.cli_int("-j"), "-1"), (formats.cli_int("-j"), "0"),
                                       (formats.cli_int("-j"), "x"), (formats.cli_float("--timeout", 0.1, 3600), "nan"),
                                       (formats.cli_float("--timeout", 0.1, 3600), "-1"),
                                       (formats.cli_float("--timeout", 0.1, 3600), "1e999"),
                                       (formats.cli_size("--memory"), "lots")])
def test_cli_numbers_are_refused_naming_the_flag(conv, text):
    with pytest.raises(argparse.ArgumentTypeError) as exc:
        conv(text)
    assert str(exc.value).split()[0] in ("-j", "--timeout", "--memory")


def test_cli_size_units():
    assert formats.cli_size("--m")("512M") == 512 << 20
    assert formats.cli_size("--m")("4GiB") == 4 << 30


@pytest.mark.parametrize("text,want", [("1.13.2.git.kitware.jobserver-pipe-1\n", "1.13.2"), ("1.11.1\n", "1.11.1"),
                                       ("1.12.0-rc1", "1.12.0"), ("1.10.2 extra words", "1.10.2")])
def test_leading_version_of_a_programs_version_line(text, want):
    assert str(formats.parse_leading_version(text, "'ninja --version'")) == want


@pytest.mark.parametrize("text", ["", "ninja 1.13", "x1.13", "1..2", None, b"1.13.2", "1.2.3.4.5"])
def test_no_leading_version_is_refused_naming_the_source(text):
    with pytest.raises(FormatError, match="ninja --version"):
        formats.parse_leading_version(text, "'ninja --version'")


@given(hostile_text)
@FUZZ
def test_parse_leading_version_property(text):
    try:
        v = formats.parse_leading_version(text, "src")
    except FormatError as exc:
        assert len(str(exc)) < MSG_MAX
    else:
        assert len(v.release) <= 4


@pytest.mark.parametrize("line,want", [(b"# ninja log v5", 5), (b"# ninja log v7\n", 7), ("# ninja log v6", 6)])
def test_ninja_log_header(line, want):
    assert formats.parse_ninja_log_header(line, ".ninja_log") == want


@pytest.mark.parametrize("line", [b"# ninja log v", b"# ninja log v7 x", b"ninja log v7", b"", b"# ninja log v12345", None, 7])
def test_bad_ninja_log_headers_are_refused(line):
    with pytest.raises(FormatError, match=".ninja_log"):
        formats.parse_ninja_log_header(line, ".ninja_log")


@given(st.one_of(hostile_text, st.binary(max_size=300)))
@FUZZ
def test_parse_ninja_log_header_property(line):
    try:
        n = formats.parse_ninja_log_header(line, "src")
    except FormatError as exc:
        assert len(str(exc)) < MSG_MAX
    else:
        assert 0 <= n < 10000
