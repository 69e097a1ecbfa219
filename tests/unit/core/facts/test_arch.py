import pytest
from packaging.version import Version

from flashinfer_sm120.core.facts import arch


@pytest.mark.parametrize(
    "cap, nvcc, expected",
    [
        ((12, 0), "13.0", (12, "0f")),
        ((12, 0), "12.9", (12, "0f")),
        ((12, 0), "12.8", (12, "0a")),
        ((12, 1), "12.9", (12, "1a")),
        ((12, 1), "13.0", (12, "1a")),
        ((10, 0), "12.8", (10, "0a")),
        ((10, 3), "12.9", (10, "3a")),
        ((11, 0), "13.0", (11, "0a")),
        ((9, 0), "12.0", (9, "0a")),
        ((8, 9), "12.8", (8, "9")),
        ((8, 0), "13.0", (8, "0")),
    ],
)
def test_normalize_table(cap, nvcc, expected):
    assert arch.normalize(*cap, Version(nvcc)) == expected


@pytest.mark.parametrize(
    "cap, nvcc, needs",
    [((12, 1), "12.8", "12.9"), ((12, 0), "12.6", "12.9"), ((10, 3), "12.8", "12.9"),
     ((11, 0), "12.9", "13.0"), ((9, 0), "11.8", "12.0")],
)
def test_normalize_refuses_with_named_fix(cap, nvcc, needs):
    with pytest.raises(arch.ArchNotSupported) as exc:
        arch.normalize(*cap, Version(nvcc))
    msg = str(exc.value)
    assert f"{cap[0]}.{cap[1]}" in msg and f"nvcc >= {needs}" in msg and nvcc in msg
    # the fix names the toolkit to set, never a pip 12.x toolkit (no pip wheel before 13.0 ships nvcc)
    assert "Fix:" in msg and "CUDA_HOME" in msg and "cuda-toolkit[" not in msg


def test_nvcc13_dropped_pre_turing_and_sm101():
    assert not arch.target_supported((7, "0"), Version("13.0"))
    assert arch.target_supported((7, "0"), Version("12.8"))
    assert not arch.target_supported((10, "1a"), Version("13.0"))
    assert arch.target_supported((10, "1a"), Version("12.8"))


def test_min_nvcc_table_matches_field_facts():
    # sm_90a 12.0, sm_100a 12.8, sm_120a 12.8, sm_120f/121a/103a 12.9, sm_110a 13.0
    expect = {"90a": "12.0", "100a": "12.8", "120a": "12.8", "120f": "12.9",
              "121a": "12.9", "103a": "12.9", "110a": "13.0"}
    for key, ver in expect.items():
        assert arch.MIN_NVCC[key] == Version(ver), key


@pytest.mark.parametrize(
    "value, expected",
    [
        ("12.0", [(12, 0, None)]),
        ("12.0f", [(12, 0, "f")]),
        ("9.0a 12.0f", [(9, 0, "a"), (12, 0, "f")]),
        ("8.9,12.1", [(8, 9, None), (12, 1, None)]),
        (" sm_120 ; 121a ", [(12, 0, None), (12, 1, "a")]),
        ("12.0 12.0", [(12, 0, None)]),
        ("8.6+PTX 12.0", [(8, 6, None), (12, 0, None)]),
    ],
)
def test_parse_arch_list(value, expected):
    got = [(s.major, s.minor, s.suffix) for s in arch.parse_arch_list(value)]
    assert got == expected


@pytest.mark.parametrize("value, bad", [("12.x", "12.x"), ("blackwell", "blackwell"), ("", None),
                                        ("12.0 hopper", "hopper"), ("99.0", "99.0"), ("12..0", "12..0")])
def test_parse_arch_list_garbled_names_value_and_fix(value, bad):
    with pytest.raises(arch.ArchListError) as exc:
        arch.parse_arch_list(value)
    msg = str(exc.value)
    assert "FLASHINFER_CUDA_ARCH_LIST=" + repr(value) in msg
    if bad:
        assert repr(bad) in msg
    assert "12.0" in msg  # shows the accepted form


@pytest.mark.parametrize("value, plain", [("8.6a", "8.6"), ("8.9f", "8.9"), ("9.0f", "9.0"), ("sm_86a", "sm_86"),
                                         ("8.6a+PTX", "8.6+PTX")])
def test_a_suffix_no_nvcc_has_for_that_capability_is_refused_naming_the_plain_one(value, plain):
    """``status --arch 8.6a`` said patched (exit 0): no nvcc has compute_86a ('a' targets begin at 9.0, 'f' at 10.0),
    so every build would fail (P1)."""
    with pytest.raises(arch.ArchListError) as exc:
        arch.parse_arch_list(value)
    assert repr(value) in str(exc.value) and f"e.g. {plain!r}" in str(exc.value), exc.value
    assert [(s.major, s.minor, s.suffix) for s in arch.parse_arch_list("9.0a 10.0f")] == [(9, 0, "a"), (10, 0, "f")]


def test_explicit_suffix_kept_as_given():
    (spec,) = arch.parse_arch_list("12.0a")
    assert spec.target(Version("13.0")) == (12, "0a")
    (spec,) = arch.parse_arch_list("12.0")
    assert spec.target(Version("13.0")) == (12, "0f")


def test_family_targets_known():
    for t, v in (((12, "1f"), "12.9"), ((10, "3f"), "12.9"), ((11, "0f"), "13.0")):
        assert arch.target_supported(t, Version(v)) and not arch.target_supported(t, Version("12.8"))


def test_lenient_parse_keeps_good_entries():
    specs, errors = arch.parse_arch_list_lenient("12.0 garbage 12.1")
    assert [(s.major, s.minor) for s in specs] == [(12, 0), (12, 1)]
    assert len(errors) == 1 and "'garbage'" in errors[0]


def test_unknown_capability_message_says_upgrade():
    with pytest.raises(arch.ArchNotSupported) as exc:
        arch.normalize(13, 0, Version("13.5"))
    assert "not in flashinfer-sm120's table" in str(exc.value) and "None" not in str(exc.value)


def test_a_non_ascii_digit_entry_is_refused_with_a_message_not_an_exception():
    """Hypothesis found that '²' (str.isdigit() true, int() fails) crashed the 'did you mean' hint; a list with a
    digit other than 0-9 is refused whole (the ASCII-digits rule), in words."""
    from flashinfer_sm120.core.facts import arch as arch_mod

    specs, errors = arch_mod.parse_arch_list_lenient("² 12.0")
    assert specs == [] and len(errors) == 1 and "'² 12.0'" in errors[0] and "0-9" in errors[0]


def test_an_arch_list_of_more_entries_than_gpu_families_is_refused_whole():
    """A 929-character list of 180 valid entries was taken, and FlashInfer's JIT directory, named by the targets
    joined, could not be made (ENAMETOOLONG) with 16 KB of messages and no fix (P6, P8)."""
    value = " ".join(f"{m}.{n}" for m in range(9, 13) for n in range(10))
    specs, errors = arch.parse_arch_list_lenient(value)
    assert specs == [] and len(errors) == 1 and "40 entries, more than 16" in errors[0] and len(errors[0]) < 300
    assert len(arch.parse_arch_list_lenient(" ".join(["12.0"] * 16))[0]) == 1
