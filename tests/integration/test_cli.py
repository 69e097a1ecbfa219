import json
import os
import subprocess
import sys

import pytest

from helpers.child import cli
from helpers.host import needs_flashinfer
from helpers.toolkits import make_toolkit


@pytest.mark.parametrize("value", ["blackwell", "12.x", "12.0 rtx5090"])
def test_build_rejects_garbled_arch(clean_env, value):
    proc = cli(["build", "--arch", value, "sampling"], clean_env)
    assert proc.returncode == 2
    assert f"--arch={value!r}" in proc.stderr and "e.g." in proc.stderr


def test_build_rejects_unknown_module(clean_env):
    proc = cli(["build", "--arch", "12.0", "attention-everything"], clean_env)
    assert proc.returncode == 2 and "attention-everything" in proc.stderr and "sampling" in proc.stderr


@needs_flashinfer
def test_build_without_gpu_or_arch_says_what_to_pass(clean_env, real_nvcc13):
    env = dict(clean_env, FAKE_GPU_CAPS="")
    proc = cli(["build", "sampling"], env, fakegpu=True)
    assert proc.returncode == 2 and "--arch 12.0" in proc.stderr


@needs_flashinfer
def test_doctor_json_reports_candidates_choice_and_before_after(clean_env, tmp_path, real_nvcc13):
    fake = make_toolkit(tmp_path / "cuda-12.8")
    env = dict(clean_env, CUDA_HOME=str(fake), FLASHINFER_CUDA_ARCH_LIST="12.0")
    env["PATH"] = f"{fake}/bin:{env['PATH']}"
    proc = cli(["doctor", "--json"], env)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    by_root = {c["root"]: c for c in r["candidates"]}
    assert by_root[str(fake)]["state"] == "rejected"
    # with a CUDA torch the reasons start with its CUDA major (13 vs this 12.8): the arch reason is there too
    assert "nvcc 12.8 cannot build sm_120f" in by_root[str(fake)]["why"]
    chosen = [c for c in r["candidates"] if c["state"] == "chosen"]
    assert len(chosen) == 1 and chosen[0]["nvcc_version"].startswith("13.")
    assert r["resolution"]["choice"]["targets"] == ["sm_120f"]
    assert r["before"]["cuda_home"] == str(fake) and r["before"]["cuda_version"] == "12.8"
    assert r["after"]["status"]["mode"] == "patched"
    assert r["after"]["status"]["target_cuda_archs"] == ["sm_120f"]
    assert r["after"]["cuda_version"].startswith("13.")
    alone = r["diagnosis"]["alone"]  # FlashInfer alone picks the 12.8 toolkit, which cannot build sm_120f
    assert alone["works"] is False and "cannot build sm_120f" in alone["why"], alone
    assert r["diagnosis"]["ok"] is True and r["diagnosis"]["targets"] == ["sm_120f"]


@needs_flashinfer
def test_doctor_human_output(clean_env, real_nvcc13):
    proc = cli(["doctor", "--verbose"], dict(clean_env, FLASHINFER_CUDA_ARCH_LIST="12.1"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("OK: FlashInfer will build sm_121a with nvcc 13.")
    whole = json.loads(proc.stdout.split("as doctor --json prints it:\n", 1)[1])
    assert "chosen" in [c["state"] for c in whole["candidates"]]
    assert whole["resolution"]["choice"]["targets"] == ["sm_121a"]
    assert "FlashInfer alone:" in proc.stdout and "With flashinfer-sm120: patched" in proc.stdout


def test_enable_disable_pth(tmp_path):
    site_dir = tmp_path / "site-packages"
    site_dir.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "FLASHINFER_SM120_DISABLE"}
    proc = cli(["enable", "--site-dir", str(site_dir)], env)
    assert proc.returncode == 0, proc.stderr
    pth = site_dir / "flashinfer_sm120_autoload.pth"
    assert pth.is_file() and len(pth.read_text().splitlines()) == 1
    # the autoload is lazy: a trigger module (here a cheap stand-in) loads the package
    env["FLASHINFER_SM120_AUTOLOAD_TRIGGERS"] = "colorsys"
    check = (f"import site, sys; site.addsitedir({str(site_dir)!r}); import colorsys; "
             "print('flashinfer_sm120' in sys.modules)")

    def loaded(e):
        r = subprocess.run([sys.executable, "-c", check], env=e, capture_output=True, text=True)
        assert "Error processing line" not in r.stderr, r.stderr
        return r.stdout.strip()

    assert loaded(env) == "True"
    assert loaded(dict(env, FLASHINFER_SM120_DISABLE="1")) == "False"
    # a broken package must not stop the interpreter from starting
    broken = tmp_path / "broken"
    (broken / "flashinfer_sm120").mkdir(parents=True)
    (broken / "flashinfer_sm120" / "__init__.py").write_text("raise ImportError('boom')\n")
    r = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True,
                       env=dict(env, PYTHONPATH=str(broken)))
    assert r.returncode == 0 and r.stdout.strip() == "False" and "autoload failed" in r.stderr
    assert cli(["disable", "--site-dir", str(site_dir)], env).returncode == 0
    assert not pth.exists()


@needs_flashinfer
@pytest.mark.slow  # waits out doctor's --timeout and the 10 s bound on a hung nvcc
def test_doctor_with_a_hung_nvcc_finishes_and_says_so(clean_env, tmp_path, real_nvcc13):
    hang = make_toolkit(tmp_path / "cuda-hang", nvcc_script="#!/bin/sh\nexec /usr/bin/sleep 300\n")
    env = dict(clean_env, CUDA_HOME=str(hang), FLASHINFER_CUDA_ARCH_LIST="12.0")
    proc = cli(["doctor", "--json", "--timeout", "8"], env, timeout=200)  # a bound against a hang
    r = json.loads(proc.stdout)
    assert r["before"]["error"].startswith("FlashInfer hung in ")  # at import or in get_cuda_version()
    (c,) = [c for c in r["candidates"] if c["root"] == str(hang)]
    assert c["state"] == "rejected" and "did not answer 'nvcc --version' within 10 s" in c["why"]
    assert r["after"]["cuda_version"].startswith("13.")


@needs_flashinfer
def test_build_when_disabled_says_how_to_enable(clean_env):
    proc = cli(["build", "--arch", "12.0", "sampling"], dict(clean_env, FLASHINFER_SM120_DISABLE="1"))
    assert proc.returncode == 2 and "FLASHINFER_SM120_DISABLE is set" in proc.stderr and "unset it" in proc.stderr


def test_enable_twice_says_already_enabled_and_writes_nothing(tmp_path, capsys):
    """``enable`` twice said "wrote" twice."""
    from flashinfer_sm120.cli import main

    site_dir = tmp_path / "site-packages"
    site_dir.mkdir()
    assert main(["enable", "--site-dir", str(site_dir)]) == 0
    assert capsys.readouterr().out.startswith("wrote ")
    pth = site_dir / "flashinfer_sm120_autoload.pth"
    before = pth.stat().st_ino, pth.stat().st_mtime_ns
    assert main(["enable", "--site-dir", str(site_dir)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("already enabled: ") and "wrote" not in out and " now loads " not in out
    assert (pth.stat().st_ino, pth.stat().st_mtime_ns) == before
    pth.write_text(pth.read_text() + "import os\n")  # a line of yours is kept; ours unchanged: nothing to write
    assert main(["enable", "--site-dir", str(site_dir)]) == 0 and capsys.readouterr().out.startswith("already")
    pth.chmod(0o600)  # not what enable writes: written again
    assert main(["enable", "--site-dir", str(site_dir)]) == 0 and capsys.readouterr().out.startswith("wrote ")


def test_every_subcommand_has_a_description():
    """``doctor``, ``enable``, ``disable`` --help opened with no description."""
    import argparse

    from flashinfer_sm120.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert len(sub.choices) >= 5
    missing = [p.prog for p in sub.choices.values() if not (p.description or "").strip()]
    assert missing == []


def test_version_names_flashinfer_torch_and_the_chosen_nvcc(capsys, monkeypatch, tmp_path, real_nvcc13):
    """``--version`` printed ``0.2.0`` only."""
    from flashinfer_sm120 import __version__
    from flashinfer_sm120.cli import main

    monkeypatch.setenv("FLASHINFER_SM120_CACHE_DIR", str(tmp_path / "c"))
    monkeypatch.setenv("FLASHINFER_CUDA_ARCH_LIST", "12.0")
    assert main(["--version"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"flashinfer-sm120 {__version__} (") and lines[1].startswith("Python 3.")
    assert lines[2].startswith("FlashInfer 0.") or lines[2].startswith("FlashInfer: not installed")
    assert lines[3].startswith("torch ") and ("(CUDA 1" in lines[3] or "(CPU build)" in lines[3])
    assert lines[4].startswith("nvcc 13.") and lines[4].endswith("(chosen)")


def test_plural():
    from flashinfer_sm120.safety.formats.base import plural

    assert [plural(1, "module"), plural(2, "step"), plural(0, "module"), plural(2, "day"),
            plural(1, "stale entry", "stale entries"), plural(3, "stale entry", "stale entries")] == [
        "1 module", "2 steps", "0 modules", "2 days", "1 stale entry", "3 stale entries"]


@pytest.mark.parametrize("argv", [
    ["doctor", "--json", "--timeout", "nan"],
    ["build", "sampling", "--json", "--mem-limit", "zz"],
    ["build", "sampling", "--json", "--mem-per-compile", "1"],
    ["build", "sampling", "--json", "-j", "abc"],
    ["status", "--json", "--bogus"],
    ["doctor", "--json", "--bogus"],
])
def test_a_usage_error_with_json_still_prints_one_json_document(argv, capsys):
    """A value argparse refuses (``--timeout nan``, ``--mem-limit zz``, an unknown option) still ends a
    ``--json`` command with exactly one JSON document on stdout and the usage on stderr: a script parsing
    stdout must never be left with no document (P8)."""
    from flashinfer_sm120.cli import main

    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own exit, where a parser still ends the process
        code = exc.code
    assert code == 2
    out, err = capsys.readouterr()
    doc = json.loads(out)  # exactly one document: json.loads refuses trailing data
    assert doc.get("ok") is False or doc.get("mode") == "failed", doc
    text = json.dumps(doc)
    assert "error" in err and ("nan" in text or "zz" in text or "out of range" in text or "abc" in text
                               or "--bogus" in text), doc


def test_build_without_gpu_or_arch_asks_before_importing_torch(clean_env, tmp_path):
    """On a GPU-less machine ``build sampling`` asks for --arch from cheap facts (NVML, device nodes),
    before torch or FlashInfer is imported; 0.3.0 imported both first (5.5 s)."""
    import glob

    from flashinfer_sm120.core.facts import gpus

    if gpus.query(torch_fallback=False).gpus or glob.glob("/dev/nvidia[0-9]*"):
        pytest.skip("this machine has a GPU")
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("raise SystemExit('torch was imported')\n")
    env = {k: v for k, v in clean_env.items() if k != "FLASHINFER_CUDA_ARCH_LIST"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(tmp_path), clean_env.get("PYTHONPATH"))))
    proc = cli(["build", "sampling"], env, python=sys.executable)
    assert "torch was imported" not in proc.stderr, proc.stderr
    assert proc.returncode == 2 and "--arch 12.0" in proc.stderr, proc.stderr
