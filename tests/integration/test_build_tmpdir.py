"""Every build's compilers write into a temporary directory of this process's own (threat model P5):
nvcc names its intermediate files ``tmpxft_<pid>_00000000-<k>_<name>`` and opens them with ``O_TRUNC``
and without ``O_EXCL``, so in a shared ``$TMPDIR`` a symlink planted under the name of a coming pid
gets a file of yours truncated and overwritten."""

import json
import os
import stat

import pytest

from helpers.child import cli, run_py
from helpers.host import needs_flashinfer
from helpers.toolkits import make_toolkit

pytestmark = needs_flashinfer

#: An nvcc that answers ``--version`` and otherwise logs where its temporary variables point, then fails.
#: (A script nvcc computes no word, so the variables are printed by printenv: TMPDIR TMP TEMP on one line.)
_LOGGING_NVCC = """#!/bin/sh
[ "$1" = --version ] && echo "Cuda compilation tools, release 13.0, V13.0.88" && exit 0
/usr/bin/printenv TMPDIR TMP TEMP | /usr/bin/paste -sd " " >> {log}
exit 1
"""


@pytest.fixture
def logged(clean_env, tmp_path):
    """``(env, log, shared)``: a fitting toolkit whose nvcc logs its temporary variables, and a
    ``TMPDIR`` (``shared``) that is a place of ours but where the planted names would be."""
    log = tmp_path / "nvcc.log"
    tk = make_toolkit(tmp_path / "cuda-13.0", "13.0.88", curand=True, nvcc_script=_LOGGING_NVCC.format(log=log))
    shared = tmp_path / "shared-tmp"
    shared.mkdir(mode=0o700)
    env = dict(clean_env, CUDA_HOME=str(tk), FAKE_GPU_CAPS="12.0", FAKE_TORCH_CUDA="13.0", TMPDIR=str(shared),
               TMP=str(shared), TEMP=str(shared))
    return env, log, shared


def _private_dirs(log, shared) -> set[str]:
    """The directories nvcc was given, after checking every variable named one private directory."""
    seen = set()
    for line in log.read_text().splitlines():
        values = set(line.split())
        assert len(line.split()) == 3 and len(values) == 1, line  # TMPDIR, TMP and TEMP alike
        (value,) = values
        assert os.path.dirname(value) == str(shared) and os.path.basename(value).startswith("fi-sm120-build-"), line
        seen.add(value)
    assert seen, "nvcc never ran"
    return seen


def test_flashinfers_own_jit_build_gives_nvcc_a_private_temporary_directory(logged):
    """FlashInfer's run_ninja gives nvcc a private TMPDIR, not the shared one; the variables are restored after (P5)."""
    env, log, shared = logged
    code = ("import helpers.fakegpu, json, os, flashinfer_sm120\n"
            "from flashinfer.jit.sampling import gen_sampling_module\n"
            "out = {'mode': flashinfer_sm120.status()['mode']}\n"
            "try:\n    gen_sampling_module().build_and_load()\nexcept Exception as e:\n"
            "    out['build'] = type(e).__name__\n"
            "out['after'] = [os.environ.get(v) for v in ('TMPDIR', 'TMP', 'TEMP')]\n"
            "out['dirs'] = [os.path.join(os.environ['TMPDIR'], n) for n in os.listdir(os.environ['TMPDIR'])]\n"
            "out['modes'] = [os.stat(d).st_mode & 0o777 for d in out['dirs']]\n"
            "print('@@' + json.dumps(out))\n")
    out, _ = run_py(code, env)
    assert out["mode"] == "noop" and out["build"] == "RuntimeError", out  # our nvcc fails: ninja failed
    assert out["after"] == [str(shared)] * 3, out
    dirs = _private_dirs(log, shared)
    assert set(out["dirs"]) >= dirs and set(out["modes"]) == {0o700}, out
    assert not any(os.path.exists(d) for d in dirs)  # removed when the process exited


def test_build_gives_nvcc_a_private_temporary_directory(logged):
    env, log, shared = logged
    proc = cli(["build", "--arch", "12.0", "--json", "sampling"], env, fakegpu=True)
    assert proc.returncode != 0 and json.loads(proc.stdout)["ok"] is False, proc.stdout[-2000:]
    dirs = _private_dirs(log, shared)
    assert not any(os.path.exists(d) for d in dirs)


def test_planted_links_under_nvccs_temporary_names_leave_the_victim_alone(clean_env, tmp_path, real_nvcc13):
    """A real nvcc compile (``build activation``) with a link planted under one of nvcc's temporary names
    (``-1``: nvcc 13.0 probes only the bare name before it opens the others) for each of the next
    30000 pids, all pointing at one file of the user's."""
    shared = tmp_path / "shared-tmp"
    shared.mkdir(mode=0o700)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    with open("/proc/sys/kernel/ns_last_pid") as f:
        last = int(f.read())
    with open("/proc/sys/kernel/pid_max") as f:
        pid_max = int(f.read())
    for n in range(1, 30001):
        os.symlink(victim, shared / f"tmpxft_{(last + n) % pid_max:08x}_00000000-1")
    env = dict(clean_env, CUDA_HOME=real_nvcc13, TMPDIR=str(shared))
    proc = cli(["build", "--arch", "12.0", "--json", "activation"], env, timeout=900)
    (mod,) = json.loads(proc.stdout)["modules"]
    assert proc.returncode == 0 and mod["status"] == "built", proc.stdout[-3000:] + proc.stderr[-3000:]
    assert victim.read_text() == "precious\n"
    assert all(stat.S_ISLNK(os.lstat(shared / n).st_mode) for n in os.listdir(shared) if n.startswith("tmpxft_"))
