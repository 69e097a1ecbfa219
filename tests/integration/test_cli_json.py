"""``--json`` anywhere on a command line: exactly one JSON document on stdout, for every outcome
(threat-model: P8), refused command lines included."""

from __future__ import annotations

import io
import json
import os
from contextlib import redirect_stderr, redirect_stdout

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flashinfer_sm120.cli import build_parser, main

_COMMANDS = (["doctor"], ["status"], ["build"])


def _options(words: list[str]) -> list[str]:
    p = build_parser()
    for w in words:
        p = next(a for a in p._actions if a.__class__.__name__ == "_SubParsersAction").choices[w]
    return sorted(o for a in p._actions for o in a.option_strings if o not in ("-h", "--help"))


_OPTIONS = {tuple(c): _options(c) for c in _COMMANDS}
_VALUES = st.one_of(st.sampled_from(["0", "-1", "nan", "inf", "foo", "99", "12.0", "1e400", "", "sampling", "all"]),
                    st.text(max_size=20).filter(lambda s: s not in ("-h", "--help")))


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, errs = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(errs):
        rc = main(argv)
    return rc, out.getvalue(), errs.getvalue()


@pytest.fixture
def stubbed(monkeypatch):
    """The commands' work replaced by one JSON line (what they print is covered by their own tests);
    --arch is still read by the one arch reading, as the real commands do first."""
    from flashinfer_sm120.cli import build, common, doctor, status

    def ran(args):
        common.apply_arch(getattr(args, "arch", None))
        print(json.dumps({"ok": True}))
        return 0

    for mod, name in ((doctor, "run_doctor"), (status, "run_status")):
        monkeypatch.setattr(mod, name, ran)
    monkeypatch.setattr(build, "_build", lambda args: (common.apply_arch(args.arch), build.buildjson.document())[1])
    monkeypatch.setenv("FLASHINFER_CUDA_ARCH_LIST", "12.0")


@given(data=st.data())
def test_every_command_line_with_json_prints_exactly_one_json_document(stubbed, data):
    # the stubs are the same for every input; the arch variable is restored below
    words = data.draw(st.sampled_from(_COMMANDS))
    rest = data.draw(st.lists(st.one_of(st.sampled_from(_OPTIONS[tuple(words)] + ["--bogus", "-j", "x"]), _VALUES),
                              max_size=6))
    argv = list(words) + rest
    argv.insert(data.draw(st.integers(0, len(argv))), "--json")
    saved = os.environ.get("FLASHINFER_CUDA_ARCH_LIST")
    try:
        rc, out, err = _run(argv)
    finally:
        os.environ["FLASHINFER_CUDA_ARCH_LIST"] = saved or ""
    assert rc in (0, 1, 2), (argv, rc, err)
    json.loads(out)  # the whole of stdout: one document
    assert "Traceback" not in err
    if rc == 2:
        assert err.startswith("flashinfer-sm120: error: ") and len(err) < 20000


@pytest.mark.parametrize("argv, field", [
    (["build", "--jobs", "0", "--json"], "error"),
    (["build", "--mem-limit", "foo", "--json"], "error"),
    (["doctor", "--timeout", "nan", "--json"], "error"),
    (["status", "--arch", "twelve", "--json"], "error"),
    (["doctor", "--json", "--arch", "sm_x"], "error"),
    (["status", "--json", "--nope"], "error"),
])
def test_a_refused_command_line_with_json_is_the_commands_failure_document(stubbed, argv, field):
    """A command line argparse refuses, given --json, prints the command's failure document on stdout, not
    the usage on stderr only (P8)."""
    rc, out, err = _run(argv)
    doc = json.loads(out)
    assert rc == 2 and doc[field], doc
    text = json.dumps(doc[field])
    assert argv[argv.index("--json") - 1] in text or "unrecognized" in text or argv[-1] in text


def test_build_list_json_is_a_document_of_the_modules():
    """``build --list --json`` prints a JSON document of the modules, not the text list (P8)."""
    from flashinfer_sm120.warmup.modules import NAMES

    rc, out, _ = _run(["build", "--list", "--json"])
    doc = json.loads(out)
    assert rc == 0 and [m["name"] for m in doc["modules"]] == list(NAMES)


def test_a_usage_failure_has_the_fields_of_the_commands_other_failures(stubbed):
    from flashinfer_sm120.cli import buildjson

    rc, out, _ = _run(["build", "--mem-limit", "foo", "--json"])
    doc = json.loads(out)
    assert rc == 2 and doc["ok"] is False and set(doc) == set(buildjson.document()), doc
    assert "'foo'" in doc["error"] and "Fix:" in doc["error"]
