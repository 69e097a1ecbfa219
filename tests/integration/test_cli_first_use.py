"""The CLI as a new user meets it (issue 13): missing FlashInfer or torch, a mistyped option or
subcommand, how --arch was read, headers a module needs, and the one-line ``status``.

"Not installed" is simulated faithfully: a ``sitecustomize`` on ``PYTHONPATH`` makes every
import of the named top-level modules raise ``ModuleNotFoundError`` (as for a venv without
them), in the command and in every child it starts.
"""

import os

import pytest

from helpers.child import cli
from helpers.host import needs_flashinfer
from helpers.toolkits import make_toolkit
from flashinfer_sm120.cli import main
from flashinfer_sm120.cli import build as build_cli
from flashinfer_sm120.cli.common import say_arch_notes
from flashinfer_sm120.cli.status import status_line
from flashinfer_sm120.warmup import modules


# --------------------------------------------------------------------------- not installed


def test_build_without_flashinfer_names_the_pip_fix(hiding):
    proc = cli(["build", "--arch", "12.0", "sampling"], hiding("flashinfer"))
    assert proc.returncode == 2, proc.stderr
    assert "FlashInfer is not installed" in proc.stderr and "pip install flashinfer-python" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_doctor_without_torch_or_flashinfer_says_not_installed_and_fails(hiding):
    proc = cli(["doctor", "--timeout", "30"], hiding("flashinfer", "torch"), timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("Versions:"))
    verdict, versions = " ".join(line.strip() for line in lines[:at]), lines[at]  # wrapped as the path's length decides
    assert verdict.startswith("PROBLEM: FlashInfer is not installed") and "pip install flashinfer-python" in verdict
    assert "torch not installed" in versions and "CPU build" not in versions
    assert "FlashInfer not installed" in versions


def test_doctor_from_a_venv_at_a_long_path_keeps_the_verdict_and_its_fix_on_line_1(hiding, tmp_path):
    """With the checkout at a long path, line 1 of doctor's verdict keeps its fix: the verdict must not wrap at
    120 columns and lose it.  The venv here is this one, seen from a 170-character directory (as ``python -m
    venv`` makes it: ``pyvenv.cfg`` next to ``bin``), with a cache directory as long (P8)."""
    import shutil
    import sys

    venv = tmp_path.joinpath(*["a-checkout-with-a-long-name"] * 6)
    (venv / "bin").mkdir(parents=True)
    shutil.copy(os.path.join(sys.prefix, "pyvenv.cfg"), venv / "pyvenv.cfg")
    (venv / "lib").symlink_to(os.path.join(sys.prefix, "lib"))
    (venv / "bin" / "python").symlink_to(sys.executable)
    env = dict(hiding("flashinfer", "torch"), FLASHINFER_SM120_CACHE_DIR=str(venv / "cache"))
    proc = cli(["doctor", "--timeout", "30"], env, timeout=300, python=str(venv / "bin" / "python"))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert len(str(venv)) > 150 and proc.stdout.splitlines()[0] == (
        f"PROBLEM: FlashInfer is not installed for {venv / 'bin' / 'python'}. Fix: pip install flashinfer-python")


@needs_flashinfer
def test_doctor_with_flashinfer_but_no_torch_still_says_torch_not_installed(hiding):
    proc = cli(["doctor", "--json", "--timeout", "30"], hiding("torch"), timeout=300)
    import json

    report = json.loads(proc.stdout)
    assert report["torch_from"] is None and report["flashinfer_installed"] is True


def test_status_without_flashinfer_names_the_fix(hiding):
    proc = cli(["status"], hiding("flashinfer"))
    assert proc.returncode == 1 and len(proc.stdout.splitlines()) == 1
    assert proc.stdout.startswith("not installed:") and "pip install flashinfer-python" in proc.stdout


# --------------------------------------------------------------------------- mistyped


def test_mistyped_option_shows_the_subcommands_usage_and_the_close_match(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["build", "--headdim", "128", "decode"])
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert err.startswith("usage: flashinfer-sm120 build ")  # build's usage, not the top-level one
    assert "unrecognized arguments: --headdim; did you mean --head-dim?" in err


def test_mistyped_subcommand_gets_a_suggestion(capsys):
    with pytest.raises(SystemExit):
        main(["buidl"])
    err = capsys.readouterr().err
    assert "invalid choice: 'buidl'" in err and ("did you mean 'build'?" in err or "maybe you meant 'build'?" in err)


def test_an_unrelated_word_gets_no_made_up_suggestion(capsys):
    with pytest.raises(SystemExit):
        main(["build", "--zzzzzz", "sampling"])
    err = capsys.readouterr().err
    assert "unrecognized arguments: --zzzzzz" in err and "did you mean" not in err


# --------------------------------------------------------------------------- --arch


@pytest.mark.parametrize("value, note", [
    ("120", "--arch '120' read as 12.0"),
    ("sm_120", "--arch 'sm_120' read as 12.0"),
    ("sm_121a", "--arch 'sm_121a' read as 12.1a"),
    ("12.0+PTX", "--arch '12.0+PTX' read as 12.0"),
])
def test_arch_spellings_say_how_they_were_read(value, note, capsys):
    say_arch_notes(value)
    notes = capsys.readouterr().err.splitlines()
    assert len(notes) == 1 and notes[0].startswith(f"flashinfer-sm120: {note}")


@pytest.mark.parametrize("value", ["12.0", "12.0 12.1", "9.0a,12.0f", None, ""])
def test_canonical_arch_needs_no_note(value, capsys):
    say_arch_notes(value)
    assert capsys.readouterr().err == ""


@needs_flashinfer
def test_build_summary_names_the_arch_flag_not_the_variable(clean_env, real_nvcc13):
    proc = cli(["build", "--arch", "120", "--ninja-only", "sampling"], clean_env)
    assert proc.returncode == 0, proc.stderr
    assert "--arch '120' read as 12.0" in proc.stderr
    assert "targets sm_120f (from --arch 120)" in proc.stderr  # the one summary line
    assert "FLASHINFER_CUDA_ARCH_LIST" not in proc.stderr
    nvcc_line = next(line for line in proc.stdout.splitlines() if line.startswith("nvcc: "))
    assert nvcc_line.endswith("targets sm_120f (from --arch 120)")


# --------------------------------------------------------------------------- extra headers


def test_list_marks_the_modules_that_need_extra_headers():
    text = modules.describe_all()
    norm = next(line for line in text.splitlines() if line.strip().startswith("norm "))
    assert "needs cublasLt.h (pip: cuda-toolkit[cublas])" in norm
    assert sum("needs " in line for line in text.splitlines()) == sum(bool(n.headers) for n in modules.NAMES.values())


def test_missing_header_message_names_the_wheel_of_the_nvcc_release(tmp_path):
    inc = tmp_path / "cu13" / "include"
    inc.mkdir(parents=True)
    variants = modules.expand(["sampling", "norm"])
    ((labels, why, fix),) = modules.missing_headers(variants, [str(inc)], "13.0", True, str(tmp_path / "cu13"))
    assert labels == ["norm"] and "cublasLt.h" in why and str(tmp_path / "cu13") in why
    assert fix.startswith("pip install 'cuda-toolkit[cublas]==13.0.*'")
    ((_, _, system),) = modules.missing_headers(variants, [str(inc)], "13.0", False, "/usr/local/cuda-13.0")
    assert "pip install" not in system and "cuBLAS for CUDA 13.0" in system
    (inc / "cublasLt.h").write_text("")
    assert modules.missing_headers(variants, [str(inc)], "13.0", True, str(tmp_path)) == []


@pytest.mark.parametrize("asked, left", [(["all"], ["norm"]), (["all", "norm"], []), (["sampling"], [])])
def test_all_leaves_out_a_module_the_toolkit_lacks_headers_for_with_the_fix(asked, left, tmp_path, capsys):
    """'build all' with a CPU torch was refused over norm's cuBLAS, with a fix ('leave norm out') that 'all'
    cannot take: all is every module this toolkit can build; norm named besides it is still refused."""
    from types import SimpleNamespace

    args = SimpleNamespace(modules=asked, head_dim=None, dtype=None, kv_dtype=None, act=None, arch="12.0")
    variants = modules.expand(asked)
    missing = modules.missing_headers(variants, [str(tmp_path)], "13.0", False, "/usr/local/cuda-13.0")
    kept, out = build_cli._leave_out(args, variants, missing)
    assert [r["module"] for r in out] == left and [v.label for v in kept] == [v.label for v in variants
                                                                              if v.label not in left]
    err = capsys.readouterr().err
    for r in out:  # why, and how to get it: the toolkit's own fix, then the command
        assert "cuBLAS for CUDA 13.0" in r["why"] and "flashinfer-sm120 build --arch 12.0 norm" in r["why"]
        assert r["why"] in err


@needs_flashinfer
def test_build_norm_without_cublas_fails_before_compiling(clean_env, tmp_path):
    """A toolkit without cuBLAS headers (what a CPU torch leaves): refused before any ninja file
    is written or nvcc runs, with the fix; the real compile would stop on the #include minutes in."""
    import torch

    if torch.version.cuda is not None:  # its CUDA wheels (cuBLAS included) are chosen over CUDA_HOME
        pytest.skip(f"the premise is a CPU torch; this one is built for CUDA {torch.version.cuda}")
    fake = make_toolkit(tmp_path / "cuda-13.0", "13.0.88", curand=True,
                        nvcc_script="#!/bin/sh\necho \"$@\" >> \"$(dirname \"$0\")/ran\"\n"
                                    "echo 'Cuda compilation tools, release 13.0, V13.0.88'\n",
                        version_json=True)
    env = dict(clean_env, CUDA_HOME=str(fake))
    proc = cli(["build", "--arch", "12.0", "norm"], env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "norm includes cublasLt.h" in proc.stderr and "Fix: " in proc.stderr
    assert not list((tmp_path / "ws").rglob("build.ninja"))
    ran = (fake / "bin" / "ran").read_text() if (fake / "bin" / "ran").exists() else ""
    assert ".cu" not in ran, ran  # at most 'nvcc --version' ran, never a compile


# --------------------------------------------------------------------------- status


def test_status_line_for_each_mode():
    tk = {"nvcc_full": "13.0.88", "root": "/opt/cu13"}
    st = {"mode": "patched", "toolkit": tk, "targets": ["sm_120f"]}
    assert status_line(st) == "patched: nvcc 13.0.88 at /opt/cu13; targets sm_120f"
    assert status_line(dict(st, targets=[])).endswith(
        "nothing can be built (no GPU visible and no FLASHINFER_CUDA_ARCH_LIST; fix: FLASHINFER_CUDA_ARCH_LIST=12.0 "
        "for a server, build --arch 12.0 for an image (12.1 on DGX Spark); check with flashinfer-sm120 doctor "
        "--arch 12.0)")
    assert status_line({"mode": "guard"}).startswith("guard: no CUDA toolkit fits")
    assert status_line({"mode": "disabled"}).startswith("disabled: FLASHINFER_SM120_DISABLE")
    assert status_line({"mode": "failed", "error": "boom"}) == "failed: boom"


@needs_flashinfer
def test_status_prints_one_line_with_mode_toolkit_and_targets(clean_env, real_nvcc13):
    proc = cli(["status"], dict(clean_env, FLASHINFER_CUDA_ARCH_LIST="12.0"))
    assert proc.returncode == 0, proc.stderr
    (line,) = proc.stdout.splitlines()
    assert line.startswith(("patched: nvcc 13.", "noop: nvcc 13.")) and line.endswith("; targets sm_120f")


def test_module_names_after_an_option_are_modules_too(monkeypatch):
    """``build activation --act gelu page``: argparse alone refuses 'page' (a positional after an
    option); module names given anywhere on the line are built, unknown options still refused."""
    import flashinfer_sm120.cli.build as build_cli
    from flashinfer_sm120.cli import main

    seen = {}
    monkeypatch.setattr(build_cli, "run_build", lambda a: seen.setdefault("modules", list(a.modules)) and 0)
    assert main(["build", "activation", "--act", "gelu", "page", "--ninja-only"]) == 0
    assert seen["modules"] == ["activation", "page"]
    with pytest.raises(SystemExit) as exc:
        main(["build", "activation", "--headdim", "128", "page"])
    assert exc.value.code == 2
