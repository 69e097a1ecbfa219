"""The command line: what a refusal prints is bounded, whatever was typed (P6, P8).

Unbounded, argparse's ``invalid choice: '<value>'``, the list of unrecognized arguments and
``unknown module(s)`` would quote the input whole (a 100,000-character argument back as 100 KB on
stderr; 20,000 short ones as a list of all of them).
"""

from __future__ import annotations

import os

import pytest
from hypothesis import example, given, strategies as st

from flashinfer_sm120 import cli
from flashinfer_sm120.safety.formats.base import bounded

BIG = "x" * 100_000
#: Generous bound on what one refusal prints (usage lines included).
MAX_OUT = 8192

ARGVS = [
    [BIG],                                   # argument cmd: invalid choice
    ["status", "--" + BIG],                  # unrecognized arguments
    ["build", "--" + BIG],                   # unrecognized option (close-match lookup too)
    ["status"] + ["--y"] * 4000,             # many short ones
    ["status"] + ["--y"] * 20_000,           # more than argparse parses in reasonable time (quadratic)
    ["build", "--dtype", BIG, "sampling"],   # invalid choice of an option
    ["build", "--for", BIG, "sampling"],
    ["build", BIG],                          # unknown module(s): the command's own message
    ["build", "--ninja-only"] + [f"m{i}" for i in range(4000)],
    ["enable", "--site-dir", "/nonexistent/" + BIG],
]


def _run(argv, capsys) -> tuple[int, str]:
    try:
        rc = cli.main(argv)
    except SystemExit as exc:
        rc = exc.code
    out = capsys.readouterr()
    return rc, out.out + out.err


@pytest.mark.parametrize("argv", ARGVS, ids=lambda a: " ".join(x[:12] for x in a[:3]))
def test_a_refusal_prints_a_bounded_message(argv, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("FLASHINFER_SM120_CACHE_DIR", str(tmp_path))
    rc, out = _run(argv, capsys)
    assert rc == 2, out[-2000:]
    assert len(out) < MAX_OUT, (len(out), out[:300])
    assert "Traceback" not in out and ("characters" in out or "arguments" in out or " more" in out)  # says how long it was


@pytest.mark.slow  # over 4 s in the quick run (--durations, 2026-12-02)
def test_paths_that_are_not_utf8_never_stop_a_report(clean_env, tmp_path):
    """Linux paths are bytes: a ``CUDA_HOME`` or JIT directory that is not UTF-8 reaches Python as lone
    surrogates, and stdout is ``strict`` under a UTF-8 locale: ``doctor`` ended in a UnicodeEncodeError."""
    import os
    import subprocess
    import sys

    env = dict(clean_env, PYTHONIOENCODING="utf-8", FLASHINFER_SM120_CACHE_DIR=str(tmp_path / "c"),
               CUDA_HOME=os.fsdecode(b"/opt/cuda-\xff"),
               FLASHINFER_WORKSPACE_BASE=os.fsdecode(os.fsencode(str(tmp_path)) + b"/w\xe9"))
    proc = subprocess.run([sys.executable, "-m", "flashinfer_sm120", "doctor"], env=env, capture_output=True,
                          timeout=300)
    err = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode in (0, 1) and "Traceback" not in err, err[-3000:]
    assert b"\\udcff" in proc.stdout or b"\\udcff" in proc.stderr  # named, escaped as Python's stderr does


@given(st.lists(st.sampled_from(["status", "doctor", "build", "enable", "disable", "--json",
                                 "--arch", "-j", "--timeout", "--from", "--mem-limit",
                                 "--site-dir"]) | st.text(max_size=30), max_size=6),
       st.integers(0, 5), st.integers(1_000, 60_000), st.sampled_from(["x", "-", " ", "\udcff", "é", "'"]))
@example(words=["--json"], pos=0, size=3900, char=" ")  # a bad choice just under the cut: printed whole twice
def test_cli_refusals_property(capsys, words, pos, size, char):
    """Any argv with one long token anywhere: exit 2 with a bounded message, or a run (stubbed out)."""
    from flashinfer_sm120.cli import build, doctor, enable, status

    argv = list(words)
    argv.insert(min(pos, len(argv)), char * size)
    ran = []
    saved = {}
    stub = lambda args: ran.append(args) or 0  # noqa: E731
    for mod, names in ((build, ["run_build"]), (doctor, ["run_doctor"]), (status, ["run_status"]),
                       (enable, ["_enable", "_disable"])):
        for n in names:
            if hasattr(mod, n):
                saved[(mod, n)] = getattr(mod, n)
                setattr(mod, n, stub)
    try:
        rc, out = _run(argv, capsys)
    finally:
        for (mod, n), f in saved.items():
            setattr(mod, n, f)
    if ran:
        return
    assert rc == 2, out[-500:]
    assert len(out) < MAX_OUT, (len(out), out[:300])


@given(st.text(max_size=6000))
def test_bounded_property(text):
    from flashinfer_sm120.safety.formats.base import MAX_MESSAGE, MAX_WORD, printable

    out = bounded(text)
    assert len(out) <= MAX_MESSAGE + 60
    if len(printable(text)) <= MAX_WORD:
        assert out == printable(text)  # what a terminal would act on is escaped, nothing else changes
    assert all(len(w) <= MAX_WORD + 40 for w in out.split())


@pytest.mark.slow  # over 4 s in the quick run (--durations, 2026-12-02)
@pytest.mark.parametrize("argv", [["doctor"], ["build", "--list"], ["status", "--json"]])
def test_a_reader_that_stops_early_gets_no_traceback(clean_env, tmp_path, argv):
    """``flashinfer-sm120 doctor | head -1``: the reader is gone before the report is written; the command
    ended in a ``BrokenPipeError`` traceback (or "Exception ignored" at exit)."""
    import os
    import subprocess
    import sys

    r, w = os.pipe()
    os.close(r)  # nobody will read: every write fails with EPIPE
    env = dict(clean_env, FLASHINFER_SM120_CACHE_DIR=str(tmp_path / "c"))
    try:
        proc = subprocess.run([sys.executable, "-m", "flashinfer_sm120", *argv], env=env, stdout=w,
                              stderr=subprocess.PIPE, timeout=300)
    finally:
        os.close(w)
    err = proc.stderr.decode("utf-8", "replace")
    assert "Traceback" not in err and "BrokenPipeError" not in err, err[-3000:]
    assert proc.returncode in (0, 1, 141), (proc.returncode, err[-2000:])


@pytest.mark.slow  # over 4 s in the quick run (--durations, 2026-12-02)
@pytest.mark.parametrize("argv", [["doctor"], ["build", "--list"], ["status"]])
def test_output_to_a_full_disk_is_a_message(clean_env, tmp_path, argv):
    """``flashinfer-sm120 doctor > report.txt`` on a full disk (``/dev/full`` stands in) ended in an
    ``OSError: [Errno 28]`` traceback; now our error naming the cause, exit 2."""
    import subprocess
    import sys

    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    env = dict(clean_env, FLASHINFER_SM120_CACHE_DIR=str(tmp_path / "c"))
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "flashinfer_sm120", *argv], env=env, stdout=full,
                              stderr=subprocess.PIPE, text=True, timeout=300)
    assert "Traceback" not in proc.stderr and proc.returncode == 2, proc.stderr[-3000:]
    assert "No space left on device" in proc.stderr and "stdout" in proc.stderr


def test_too_many_arguments_with_json_is_one_document(capsys):
    """``build --json`` with more than 4096 arguments prints one JSON document on stdout, not nothing (P8)."""
    import json

    from flashinfer_sm120.cli import MAX_ARGS, main

    assert main(["build", "--json", "--ninja-only"] + ["page"] * MAX_ARGS) == 2
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert doc["ok"] is False and f"more than the {MAX_ARGS} taken" in json.dumps(doc) and "--from" in err, doc


@pytest.mark.parametrize("option", ["--mem-limit", "--step-timeout"])
def test_a_value_starting_with_a_dash_is_named_with_how_to_give_it(option, capsys):
    """``--mem-limit -5G`` names the value and how to give it, not only "expected one argument" (P8)."""
    argv = ["build", "--arch", "12.0", option, "-5G", "sampling"]
    with pytest.raises(SystemExit) as exited:  # argparse's own exit, as for every refused command line
        cli.main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "'-5G'" in err and f"{option}=-5G" in err, err


@pytest.mark.parametrize("argv", [["status", "--fresh", "--arch", "12.0", "--json"], ["build", "--arch", "12.0",
                                                                                      "sampling", "--json"]])
def test_a_removed_working_directory_is_one_document_naming_the_fix(tmp_path, argv):
    """A relative FLASHINFER_WORKSPACE_BASE in a removed working directory ended in a traceback from
    os.path.abspath and no JSON (P8)."""
    import json
    import subprocess
    import sys

    gone = tmp_path / "gone"
    gone.mkdir()
    env = dict(os.environ, FLASHINFER_WORKSPACE_BASE="rel")
    proc = subprocess.run(["sh", "-c", 'cd "$1" && rmdir "$1" && shift && exec "$@"', "sh", str(gone),
                           sys.executable, "-m", "flashinfer_sm120", *argv], env=env, capture_output=True, text=True,
                          timeout=120)
    doc = json.loads(proc.stdout)
    assert proc.returncode == 1 and doc["ok"] is False and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "working directory" in json.dumps(doc) and "cd to an existing directory" in proc.stderr


def test_a_command_makes_nothing_others_may_write_whatever_the_umask(tmp_path, monkeypatch):
    """Under ``umask 000`` FlashInfer made its JIT tree 0777 for ``build``, which then refused it as writable by
    others; a command now makes everything at most 0755, and the caller's umask is back afterwards (P4)."""
    made = tmp_path / "made"
    monkeypatch.setattr(cli, "_main", lambda argv: (os.makedirs(made / "a" / "b"), (made / "f").write_text(""), 0)[2])
    old = os.umask(0)
    try:
        assert cli.main([]) == 0
        assert os.umask(0) == 0
    finally:
        os.umask(old)
    assert [p for p in (made, made / "a", made / "a" / "b", made / "f") if p.stat().st_mode & 0o022] == []
