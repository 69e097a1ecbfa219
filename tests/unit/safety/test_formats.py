"""The input boundary (flashinfer_sm120.safety.formats): unit cases and Hypothesis properties.

Properties, for every parser: only FormatError escapes and the message is bounded."""

from __future__ import annotations

import argparse
import json
import os

import pytest
from hypothesis import given, strategies as st

from flashinfer_sm120.safety.formats import base, fields, grammar, params, reads
from flashinfer_sm120.safety.formats.params import cli_float, cli_int, cli_size
from flashinfer_sm120.safety.fs import places
from flashinfer_sm120.errors import FormatError, Sm120Error

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
    assert str(grammar.parse_version(text, "version.json")) == want


@pytest.mark.parametrize("text", ["13.0 .88", "13.0.88\nbuild x: phony", "v13", "", "13..0", "1" * 50, None, 13.0])
def test_bad_versions_are_refused_naming_the_source(text):
    with pytest.raises(FormatError, match="version.json"):
        grammar.parse_version(text, "version.json")


@given(hostile_text)
def test_parse_version_property(text):
    try:
        v = grammar.parse_version(text, "src")
    except FormatError as exc:
        assert len(str(exc)) < MSG_MAX
    else:
        assert not any(c.isspace() for c in str(v))


@pytest.mark.parametrize("name", ["norm\nbuild x: phony", "a b$c:d", "..", ".", "", "a/b", "a\x00", "-x"])
def test_names_refuse_ninja_and_path_syntax(name):
    with pytest.raises(FormatError):
        grammar.parse("name", name, "manifest line 1")


def test_json_depth_is_refused_not_a_recursion_error():
    deep = "[" * 10000 + "]" * 10000
    with pytest.raises(FormatError, match="nested 10000 deep"):
        reads.loads_json(deep, "version.json")
    assert reads.loads_json('{"a": "[[[[[[[[["}', "x") == {"a": "[[[[[[[[["}
    with pytest.raises(FormatError):
        reads.loads_json("NaN", "x")


@given(st.one_of(st.binary(max_size=400), hostile_text,
                 st.integers(1, 3000).map(lambda n: "{\"a\":" * n + "1" + "}" * n)))
def test_loads_json_property(data):
    try:
        reads.loads_json(data, "f.json")
    except FormatError as exc:
        assert len(str(exc)) < MSG_MAX


def test_read_bytes_caps_while_reading(tmp_path):
    f = tmp_path / "big"
    f.write_bytes(b"x" * 5000)
    with pytest.raises(FormatError, match="5000 bytes"):
        reads.read_bytes(f, 1000)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(FormatError, match="not a regular file"):
        reads.read_bytes(fifo, 1000)
    with pytest.raises(FormatError, match="not a regular file"):
        reads.read_bytes("/dev/zero", 1000)
    link = tmp_path / "link"
    link.symlink_to(f)
    with pytest.raises(FormatError, match="symlink"):
        reads.read_bytes(link, 10000, follow=False)


def test_iter_lines_refuses_a_long_line_without_reading_it(tmp_path):
    f = tmp_path / "m.jsonl"
    f.write_bytes(b"short\n" + b"y" * 100000 + b"\nnext\n")
    got = []
    with pytest.raises(FormatError, match="line 2 is longer than 1000"):
        for n, line in fields.iter_lines(f, max_line=1000, max_lines=10):
            got.append(line)
    assert got == [b"short"]
    with pytest.raises(FormatError):
        list(fields.iter_lines("/dev/zero", max_line=1000, max_lines=10))


def test_field_types_are_explicit():
    src = "meta.json"
    assert fields.field({"a": 1}, "a", int, src) == 1
    for obj, key, kind in [({"a": True}, "a", int), ({"a": "1"}, "a", int), ([], "a", int), ({}, "a", str),
                           ({"a": float("nan")}, "a", float), ({"a": "x" * 10}, "a", str)]:
        with pytest.raises(FormatError, match="meta.json"):
            fields.field(obj, key, kind, src, max_len=5)
    assert fields.field({}, "a", str, src, default=None) is None


def test_make_private_dirs_ignores_the_umask(tmp_path):
    old = os.umask(0)
    try:
        places.make_private_dirs(tmp_path / "a" / "b" / "c")
    finally:
        os.umask(old)
    for p in (tmp_path / "a", tmp_path / "a" / "b", tmp_path / "a" / "b" / "c"):
        assert (os.stat(p).st_mode & 0o777) == 0o700


def test_messages_quote_a_bounded_value():
    big = "x " * 500000
    assert len(base.shown(big)) < 200
    assert "and 997 more" in base.some(range(1000))
    with pytest.raises(FormatError) as exc:
        fields.env_text("V", {"V": big})
    assert len(str(exc.value)) < 300


@pytest.mark.parametrize("conv,text", [(cli_int("-j"), "-1"), (cli_int("-j"), "0"),
                                       (cli_int("-j"), "x"), (cli_float("--timeout", 0.1, 3600), "nan"),
                                       (cli_float("--timeout", 0.1, 3600), "-1"),
                                       (cli_float("--timeout", 0.1, 3600), "1e999"),
                                       (cli_size("--memory"), "lots")])
def test_cli_numbers_are_refused_naming_the_flag(conv, text):
    with pytest.raises(argparse.ArgumentTypeError) as exc:
        conv(text)
    assert str(exc.value).split()[0] in ("-j", "--timeout", "--memory")


def test_cli_size_units():
    assert cli_size("--m")("512M") == 512 << 20
    assert cli_size("--m")("4GiB") == 4 << 30


def test_a_size_out_of_range_names_the_range_as_sizes_and_a_bare_number_its_unit():
    """``--mem-limit 8`` said ``from 6.71089e+07 to 1.1259e+15`` (the bytes in scientific notation)."""
    with pytest.raises(argparse.ArgumentTypeError) as exc:
        cli_size("--mem-limit", 64 << 20)("8")
    assert "from 64M to 1024T" in str(exc.value) and "did you mean 8G?" in str(exc.value), exc.value
    with pytest.raises(argparse.ArgumentTypeError) as exc:
        cli_size("--mem-limit", 64 << 20)("1M")
    assert "from 64M to 1024T" in str(exc.value) and "did you mean" not in str(exc.value), exc.value


# ----------------------------------------------------------------------------- issue 11 grammars


@pytest.mark.parametrize("text,ok", [("12.0", True), ("12.0f", True), ("9.0a", True), ("sm_120", False),
                                     ("12.0 ", False), (12.0, False), ("1 2 . 0 f", False), ("", False)])
def test_parse_target(text, ok):
    if ok:
        assert grammar.parse("target", text, "m") == text
    else:
        with pytest.raises(FormatError, match="major.minor"):
            grammar.parse("target", text, "m")


@pytest.mark.parametrize("flag,ok", [("-DENABLE_BF16", True), ("-gencode=arch=compute_120f,code=sm_120f", True),
                                     ("-I@FLASHINFER@/data/include", True), ("-isystem /usr/x", True),
                                     ("-O3\nbuild x: phony", False), ("-DX;rm -rf ~", False), ("$(id)", False),
                                     ("-D'x'", False)])
def test_parse_flag(flag, ok):
    if ok:
        assert params.parse_compile_flag(flag, "m")[0] == flag
    else:
        with pytest.raises(FormatError, match="^m: "):
            params.parse_compile_flag(flag, "m")


@pytest.mark.parametrize("path,ok", [("@FLASHINFER@/data/csrc/norm.cu", True), ("/abs/x.cu", True),
                                     ("a b.cu", False), ("a:b", False), ("a/../b", False), ("$x", False)])
def test_parse_path_text(path, ok):
    if ok:
        assert grammar.parse("path", path, "m") == path
    else:
        with pytest.raises(FormatError, match="not a plain path"):
            grammar.parse("path", path, "m")


def test_a_module_name_as_long_as_flashinfers_is_a_name():
    """The README's main job was refused: FlashInfer 0.7.4's FA2 prefill module (185 characters) was over a
    200-character name rule; a name Linux takes (255) passes, a longer one is refused."""
    prefill = ("batch_prefill_with_kv_cache_dtype_q_bf16_dtype_kv_bf16_dtype_o_bf16_dtype_idx_i32_head_dim_qk_128_"
               "head_dim_vo_128_posenc_0_use_swa_False_use_logits_cap_False_f16qk_False_kv_stride_equal")
    for name in (prefill, "a" * 255):
        assert grammar.parse("name", name, "m") == name
    with pytest.raises(FormatError, match="not a name"):
        grammar.parse("name", "a" * 256, "m")


def test_text_checks():
    with pytest.raises(FormatError, match="V is 100000 characters long"):
        fields.check_text("x" * 100000, "V")


def test_read_prefix_and_skipping_long_lines(tmp_path):
    f = tmp_path / "h"
    f.write_bytes(b"#define X 1\n" + b"y" * 100000)
    assert reads.read_bytes(f, 12, prefix=True) == b"#define X 1\n"
    with pytest.raises(FormatError, match="not a regular file"):
        reads.read_bytes("/dev/zero", 10, prefix=True)
    m = tmp_path / "m"
    m.write_bytes(b"a\n" + b"z" * 50000 + b"\nb\n")
    assert list(fields.iter_lines(m, max_line=100, max_lines=10, skip_long=True)) == [(1, b"a"), (2, None),
                                                                                       (3, b"b")]


@pytest.mark.parametrize("text,want", [("1.13.2.git.kitware.jobserver-pipe-1\n", "1.13.2"), ("1.11.1\n", "1.11.1"),
                                       ("1.12.0-rc1", "1.12.0"), ("1.10.2 extra words", "1.10.2")])
def test_leading_version_of_a_programs_version_line(text, want):
    assert str(grammar.parse_leading_version(text, "'ninja --version'")) == want


@pytest.mark.parametrize("text", ["", "ninja 1.13", "x1.13", "1..2", None, b"1.13.2", "1.2.3.4.5"])
def test_no_leading_version_is_refused_naming_the_source(text):
    with pytest.raises(FormatError, match="ninja --version"):
        grammar.parse_leading_version(text, "'ninja --version'")


@given(hostile_text)
def test_parse_leading_version_property(text):
    try:
        v = grammar.parse_leading_version(text, "src")
    except FormatError as exc:
        assert len(str(exc)) < MSG_MAX
    else:
        assert len(v.release) <= 4


@pytest.mark.parametrize("line,want", [(b"# ninja log v5", 5), (b"# ninja log v7\n", 7)])
def test_ninja_log_header(line, want):
    assert params.parse_ninja_log_header(line, ".ninja_log") == want


@pytest.mark.parametrize("line", [b"# ninja log v", b"# ninja log v7 x", b"ninja log v7", b"", b"# ninja log v12345", None, 7,
                                  "# ninja log v6"])
def test_bad_ninja_log_headers_are_refused(line):
    with pytest.raises(FormatError, match=".ninja_log"):
        params.parse_ninja_log_header(line, ".ninja_log")


@given(st.one_of(hostile_text, st.binary(max_size=300)))
def test_parse_ninja_log_header_property(line):
    try:
        n = params.parse_ninja_log_header(line, "src")
    except FormatError as exc:
        assert len(str(exc)) < MSG_MAX
    else:
        assert 0 <= n < 10000


@given(hostile_text)
def test_new_grammars_property(text):
    for kind in ("name", "target", "path"):
        try:
            out = grammar.parse(kind, text, "src")
        except FormatError as exc:
            assert len(str(exc)) < MSG_MAX
        else:
            assert out == text and "\n" not in out and "\0" not in out


def test_parse_command_words():
    assert grammar.parse_command_words("ccache  g++ -O2", "CXX") == ("ccache", "g++", "-O2")
    for bad in ["", "  ", "c++ $in", "c++ `id`", "c++;x", "a 'b'", "~/bin/cc", "c++ *", 12, "a\nb"]:
        with pytest.raises(FormatError) as exc:
            grammar.parse_command_words(bad, "CXX")
        assert "CXX" in str(exc.value)


@pytest.mark.parametrize("name", ["evil\x1b]2;pwned\x07\x1b[2J.tar", "x\r\x9b31m.tar", "a\u202egpj.tar", "a\x7fb"])
@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_a_refusal_never_carries_what_a_terminal_would_act_on(tmp_path, capsys, name, json_flag):
    """A refusal quoting a file's name never carries what a terminal would act on: a file named with
    escape sequences (``build --from downloads/*``) must not retitle the terminal, clear the screen or,
    with a bidirectional override, show another name.  Escaped on stderr and in the JSON document; newlines
    and tabs of multi-line messages kept (P8)."""
    import re

    from flashinfer_sm120.cli import main

    src = tmp_path / name
    src.write_bytes(b"not a manifest line\n")
    assert main(["build", "--arch", "12.0", "--from", str(src), *json_flag]) == 2  # a manifest refused: exit 2
    out, err = capsys.readouterr()
    acted_on = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
    shown = err + (json.loads(out)["error"] if json_flag else out)  # build --json: the message
    assert str(tmp_path) in shown and not acted_on.search(shown), shown
    assert base.bounded("line one\n\tline two") == "line one\n\tline two"


@pytest.mark.slow  # over 4 s in the quick run (--durations, 2026-12-02)
def test_doctor_shows_a_module_name_found_on_disk_without_acting_on_it(clean_env, tmp_path):
    """``doctor`` lists the JIT modules FlashInfer would load with their directory names escaped: a module
    directory named with escape sequences must not retitle the terminal (P8)."""
    from helpers.child import cli

    env = dict(clean_env, FLASHINFER_CUDA_ARCH_LIST="12.0")
    jit = json.loads(cli(["doctor", "--json"], env, 300).stdout)["after"]["jit_dir"]  # doctor creates nothing (P4)
    assert jit.startswith(env["FLASHINFER_WORKSPACE_BASE"]) and jit.endswith("cached_ops"), jit
    for d in [os.path.dirname(jit)]:  # the workspace, as a build would have made it
        evil = os.path.join(d, "cached_ops", "ev\x1b]2;PWN\x07il")
        os.makedirs(evil)
        open(os.path.join(evil, "ev\x1b]2;PWN\x07il.so"), "wb").close()
    out = cli(["doctor", "--verbose"], env, 300).stdout
    assert "PWN" in out and "\x1b" not in out and "\x07" not in out, out[-2000:]
