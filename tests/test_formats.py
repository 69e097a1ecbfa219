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


# ----------------------------------------------------------------------------- issue 11 grammars


@pytest.mark.parametrize("text,ok", [("12.0", True), ("12.0f", True), ("9.0a", True), ("sm_120", False),
                                     ("12.0 ", False), (12.0, False), ("1 2 . 0 f", False), ("", False)])
def test_parse_target(text, ok):
    if ok:
        assert formats.parse_target(text, "m") == text
    else:
        with pytest.raises(FormatError, match="major.minor"):
            formats.parse_target(text, "m")


@pytest.mark.parametrize("flag,ok", [("-DENABLE_BF16", True), ("-gencode=arch=compute_120f,code=sm_120f", True),
                                     ("-I@FLASHINFER@/data/include", True), ("-isystem /usr/x", True),
                                     ("-O3\nbuild x: phony", False), ("-DX;rm -rf ~", False), ("$(id)", False),
                                     ("-D'x'", False), ("", False), (["-O3"], False)])
def test_parse_flag(flag, ok):
    if ok:
        assert formats.parse_flag(flag, "m") == flag
    else:
        with pytest.raises(FormatError, match="flag"):
            formats.parse_flag(flag, "m")


@pytest.mark.parametrize("path,ok", [("@FLASHINFER@/data/csrc/norm.cu", True), ("/abs/x.cu", True),
                                     ("a b.cu", False), ("a:b", False), ("a/../b", False), ("$x", False)])
def test_parse_path_text(path, ok):
    if ok:
        assert formats.parse_path_text(path, "m") == path
    else:
        with pytest.raises(FormatError, match="not a plain path"):
            formats.parse_path_text(path, "m")


def test_sha256_lists_and_text_checks():
    assert formats.parse_sha256("a" * 64, "m") == "a" * 64
    for bad in ("A" * 64, "a" * 63, 5, None):
        with pytest.raises(FormatError):
            formats.parse_sha256(bad, "m")
    assert formats.string_list(["a", "b"], "m") == ["a", "b"]
    for bad in ("ab", [1], ["a\0"], ["x"] * 5000):
        with pytest.raises(FormatError):
            formats.string_list(bad, "m")
    with pytest.raises(FormatError, match="V is 100000 characters long"):
        formats.check_text("x" * 100000, "V")


def test_read_prefix_and_skipping_long_lines(tmp_path):
    f = tmp_path / "h"
    f.write_bytes(b"#define X 1\n" + b"y" * 100000)
    assert formats.read_prefix(f, 12) == b"#define X 1\n"
    with pytest.raises(FormatError, match="not a regular file"):
        formats.read_prefix("/dev/zero", 10)
    m = tmp_path / "m"
    m.write_bytes(b"a\n" + b"z" * 50000 + b"\nb\n")
    assert list(formats.iter_lines(m, max_line=100, max_lines=10, skip_long=True)) == [(1, b"a"), (2, None),
                                                                                       (3, b"b")]


@given(hostile_text)
@FUZZ
def test_new_grammars_property(text):
    for parse in (formats.parse_target, formats.parse_flag, formats.parse_path_text, formats.parse_sha256):
        try:
            out = parse(text, "src")
        except FormatError as exc:
            assert len(str(exc)) < MSG_MAX
        else:
            assert out == text and "\n" not in out and "\0" not in out
