"""The grammar of a manifest's generator and parameters (docs/threat-model.md P2): plain values only."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, strategies as st

from flashinfer_sm120.safety.formats.params import parse_generator, parse_params
from flashinfer_sm120.errors import FormatError
from flashinfer_sm120.core.jitenv import record
from flashinfer_sm120.warmup import replay

_TOKEN = re.compile(r"(?:[A-Za-z0-9_][A-Za-z0-9_.+-]{0,63})?")

json_leaf = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(1 << 70), max_value=1 << 70),
                      st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=80),
                      st.sampled_from(["silu", "fa2", "bfloat16", "#include \"/etc/passwd\"", "a b", "x/y", "{"]))
json_value = st.recursive(json_leaf, lambda inner: st.one_of(
    st.lists(inner, max_size=6),
    st.dictionaries(st.sampled_from(["dtype", "tuple", "args", "kwargs", "x"]), inner, max_size=3)), max_leaves=40)


def _leaves(v):
    if isinstance(v, list):
        for x in v:
            yield from _leaves(x)
    elif isinstance(v, dict) and "tuple" in v:
        yield from _leaves(v["tuple"])
    elif not isinstance(v, dict):
        yield v


@given(st.one_of(json_value, st.fixed_dictionaries({"args": json_value, "kwargs": json_value}),
                 st.fixed_dictionaries({"args": st.lists(json_value, max_size=5)},
                                       optional={"kwargs": st.dictionaries(st.text(max_size=10), json_value,
                                                                           max_size=3)})))
def test_parse_params_property(obj):
    """Only FormatError, a bounded message naming the source; what passes holds plain values only
    (no string that could be C++ or a path) and parses again to itself."""
    try:
        got = parse_params(obj, "m.jsonl:1 'params'", fix="record again")
    except FormatError as exc:
        assert str(exc).startswith("m.jsonl:1 'params'") and len(str(exc)) < 600
        return
    assert set(got) == {"args", "kwargs"}
    for leaf in _leaves([got["args"], list(got["kwargs"].values())]):
        assert leaf is None or type(leaf) in (bool, int, float) or (isinstance(leaf, str) and _TOKEN.fullmatch(leaf))
    assert parse_params(got, "again") == got


@given(st.one_of(st.text(max_size=120), st.sampled_from([
    "flashinfer.jit.sampling:gen_sampling_module", "os:system", "flashinfer.jit:gen_x_module:y",
    "flashinfer.jit.attention.modules:gen_customize_batch_decode_module", "flashinfer.__main__:gen_a_module",
    "flashinfer.jit.core:gen_jit_spec", "flashinfer.jit.x:_gen_y_module", "builtins:eval"])))
def test_parse_generator_property(text):
    """Only FormatError, a bounded message; what passes is a gen_*_module name under flashinfer."""
    try:
        module, name = parse_generator(text, "m.jsonl:1 'generator'")
    except FormatError as exc:
        assert str(exc).startswith("m.jsonl:1 'generator'") and len(str(exc)) < 600
        return
    assert module == "flashinfer" or module.startswith("flashinfer.")
    assert "__" not in module and re.fullmatch(r"_?gen_\w+_module", name) and "customize" not in name


@pytest.mark.parametrize("value", ["#include \"/home/u/.ssh/id_rsa\"", "a b", "x/y", "{", "'", "\n", "..", ".x",
                                   "x" * 65, 1 << 54, float("nan"), {"dtype": "torch.float16"}, {"eval": "x"},
                                   [[[[["deep"]]]]], {"dtype": "bfloat16", "x": 1}])
def test_values_that_are_not_plain_are_refused(value):
    with pytest.raises(FormatError):
        parse_params({"args": [value]}, "m")


def test_too_many_values_are_refused():
    with pytest.raises(FormatError, match="more than 256"):
        parse_params({"args": [list(range(200)), list(range(200))]}, "m")


_PLAIN = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(min_value=-(1 << 53), max_value=1 << 53),
              st.floats(allow_nan=False, allow_infinity=False), st.from_regex(_TOKEN, fullmatch=True),
              st.sampled_from(["float16", "bfloat16", "int32", "float8_e4m3fn", "uint8"])
              .map(lambda n: getattr(__import__("torch"), n))),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.lists(inner, max_size=4).map(tuple)), max_leaves=20)


@given(st.lists(_PLAIN, max_size=6))
def test_recorded_arguments_come_back_as_the_same_values(args):
    """What recording writes for a generator's arguments parses and decodes to equal values and types."""
    try:
        encoded = [record.encode_value(a) for a in args]
    except FormatError:  # nested deeper than the grammar allows
        return
    try:
        parsed = parse_params(json.loads(json.dumps({"args": encoded})), "m")
    except FormatError:
        return  # too deep or too many: recording marks such an entry not regenerable
    back = [replay._decode(v) for v in parsed["args"]]
    assert back == args and [type(b) for b in back] == [type(a) for a in args]


def test_enums_and_callables_are_not_data():
    import enum

    class Mode(enum.IntEnum):
        NONE = 0

    for value in (Mode.NONE, print, object()):
        with pytest.raises(FormatError):
            record.encode_value(value)


_BASE = {"format": 1, "name": "sampling", "flashinfer": "0.7.4", "targets": ["12.0f"], "toolchain": "nvcc",
         "regenerable": True}


@given(st.one_of(st.text(max_size=60), st.sampled_from(["flashinfer.jit.sampling:gen_sampling_module", "os:system"]),
                 json_value),
       st.one_of(json_value, st.fixed_dictionaries({"args": st.lists(json_value, max_size=4)})))
def test_manifest_entry_generator_property(generator, params):
    """A whole entry: only FormatError with a bounded message naming the line; what passes names a
    FlashInfer gen_*_module and plain parameters, and parses again to itself."""
    from flashinfer_sm120.core.jitenv import record

    try:
        got = record.parse_entry(dict(_BASE, generator=generator, params=params), "m.jsonl:7")
    except FormatError as exc:
        assert str(exc).startswith("m.jsonl:7") and len(str(exc)) < 600
        return
    assert got["generator"].startswith("flashinfer") and got["generator"].endswith("_module")
    assert record.parse_entry(got, "again") == got
