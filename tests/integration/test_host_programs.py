"""What every JIT build runs by name (nvcc's host compiler ``gcc``, FlashInfer's ``c++``, nvcc's ``rm``)
is held to the trust rule where PATH finds it: FlashInfer's own JIT build, ``build`` and
``doctor`` refuse before anything runs it (threat model P2)."""

import json
import os

import pytest

from helpers.cgroups import install_fake_nvcc
from helpers.child import cli, run_py
from helpers.host import needs_flashinfer
from helpers.toolkits import make_toolkit, script

pytestmark = needs_flashinfer


@pytest.fixture
def planted(clean_env, tmp_path):
    """A toolkit that fits, and a ``gcc`` in a directory everyone may write, first on PATH: running it
    leaves a mark."""
    tk = make_toolkit(tmp_path / "cuda-13.0", "13.0.88", curand=True)
    install_fake_nvcc(tk)  # a binary, as a real nvcc is (a script is refused for the PATH entry itself)
    opened = tmp_path / "open"
    opened.mkdir()
    mark = tmp_path / "gcc-ran"
    gcc = script(opened / "gcc", f"#!/bin/sh\ntouch {mark}\nexec /usr/bin/gcc \"$@\"\n")
    opened.chmod(0o777)
    env = dict(clean_env, CUDA_HOME=str(tk), FAKE_GPU_CAPS="12.0", FAKE_TORCH_CUDA="13.0",
               PATH=f"{opened}:{clean_env['PATH']}")
    return env, gcc, mark


def test_flashinfer_jit_build_is_refused_before_nvcc_runs(planted):
    """A gcc planted early on PATH is never nvcc's host compiler (P2)."""
    env, gcc, mark = planted
    code = ("import helpers.fakegpu, json, flashinfer_sm120\n"
            "from flashinfer.jit.sampling import gen_sampling_module\n"
            "out = {'mode': flashinfer_sm120.status()['mode']}\n"
            "try:\n    gen_sampling_module().build_and_load()\n    out['build'] = 'ran'\n"
            "except Exception as e:\n    out['build'] = type(e).__name__ + ': ' + str(e)\n"
            "print('@@' + json.dumps(out))\n")
    out, _ = run_py(code, env)
    assert out["mode"] == "noop", out  # the CUDA_HOME fits: FlashInfer builds with it, the gate still stands
    assert out["build"].startswith("ToolkitError: flashinfer-sm120 stopped this FlashInfer JIT build"), out
    assert "nvcc's host compiler" in out["build"] and str(gcc) in out["build"] and "NVCC_CCBIN" in out["build"]
    assert not mark.exists()


@pytest.mark.slow  # over 4 s in the quick run (--durations, 2026-12-02)
def test_build_and_doctor_refuse_it(planted):
    env, gcc, mark = planted
    proc = cli(["build", "--arch", "12.0", "--json", "sampling"], env)
    assert proc.returncode != 0
    doc = json.loads(proc.stdout)
    assert "nvcc's host compiler" in doc["error"] and str(gcc) in doc["error"], doc
    proc = cli(["doctor", "--json", "--arch", "12.0"], env)
    found = {f["code"]: f for f in json.loads(proc.stdout)["diagnosis"]["findings"]}
    assert proc.returncode == 1 and "untrusted-host-program" in found, found
    assert str(gcc) in found["untrusted-host-program"]["text"] and "NVCC_CCBIN" in found["untrusted-host-program"]["fix"]
    assert not mark.exists()
    # naming a trusted host compiler instead is the fix doctor gives: the finding goes
    proc = cli(["doctor", "--json", "--arch", "12.0"], dict(env, NVCC_CCBIN="/usr/bin/g++"))
    assert "untrusted-host-program" not in {f["code"] for f in json.loads(proc.stdout)["diagnosis"]["findings"]}


def test_build_refuses_a_temporary_directory_another_uid_may_change(clean_env, tmp_path):
    """``build`` makes no jobserver FIFO in a TMPDIR everyone may write, where nvcc would also
    write its intermediate files (P4, P5)."""
    tk = make_toolkit(tmp_path / "cuda-13.0", "13.0.88", curand=True)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    theirs.chmod(0o777)
    env = dict(clean_env, CUDA_HOME=str(tk), FAKE_GPU_CAPS="12.0", FAKE_TORCH_CUDA="13.0", TMPDIR=str(theirs))
    proc = cli(["build", "--arch", "12.0", "--json", "sampling"], env)
    assert proc.returncode != 0
    text = json.dumps(json.loads(proc.stdout))
    assert "the temporary directory (TMPDIR" in text and str(theirs) in text and "Fix: set TMPDIR" in text, text
    assert os.listdir(theirs) == []


def test_build_json_names_a_compiler_setting_it_refused_and_built_without(clean_env, tmp_path):
    """A refused CXX is named in the ``--json`` document too, not only in a stderr line beside an ok (P8)."""
    tk = make_toolkit(tmp_path / "cuda-13.0", "13.0.88", curand=True)
    opened = tmp_path / "open"
    opened.mkdir()
    cxx = script(opened / "g++", "#!/bin/sh\nexec /usr/bin/g++ \"$@\"\n")
    opened.chmod(0o777)
    env = dict(clean_env, CUDA_HOME=str(tk), FAKE_GPU_CAPS="12.0", FAKE_TORCH_CUDA="13.0", CXX=str(cxx))
    proc = cli(["build", "--arch", "12.0", "--json", "--ninja-only", "sampling"], env, fakegpu=True)
    doc = json.loads(proc.stdout)
    assert doc["ok"] is True, doc["error"]
    assert [(r["variable"], r["value"]) for r in doc["refused_settings"]] == [("CXX", repr(str(cxx)))], doc["refused_settings"]
    assert "Fix:" in doc["refused_settings"][0]["why"]
