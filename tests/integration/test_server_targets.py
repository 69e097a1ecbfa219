"""The FlashInfer targets a server's model processes choose themselves: SGLang 0.5.23's
``set_cuda_arch()`` (``sglang/srt/utils/common.py``, called by ``ModelRunner.load_model()``), against the
stand-in written from it (tests/standins/sglang) and the rule read from the installed source."""

from __future__ import annotations

import importlib
import json
import os
import sys

import pytest

from helpers.child import cli, run_py
from helpers.host import needs_flashinfer
from helpers.servers import install_standins

from flashinfer_sm120.core.facts import serverprobe, servers

#: A model process of SGLang: import it (FlashInfer comes in with model_runner), load the model
#: (set_cuda_arch), then FlashInfer's first JIT build writes its build.ninja.
SGLANG_MODEL_PROCESS = """
    import helpers.fakegpu, json, os, site
    site.addsitedir({site!r})
    import sglang
    from sglang.srt.model_executor.model_runner import ModelRunner
    ModelRunner().load_model()
    from flashinfer_sm120.warmup import modules
    spec = modules.expand(["activation"])[0].spec()
    spec.write_ninja()
    print("@@" + json.dumps(dict(arch=os.environ.get("FLASHINFER_CUDA_ARCH_LIST"), ninja=str(spec.ninja_path),
                                 text=spec.ninja_path.read_text())))
"""


def _warm(env, *extra):
    proc = cli(["build", "--for", "sglang", "--arch", "12.0", "--ninja-only", "--json", *extra, "activation"],
               env, timeout=600, python=sys.executable)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    built = json.loads(proc.stdout)
    path = built["modules"][0]["ninja"]
    return built, path, open(path).read(), proc


@pytest.mark.slow  # seconds: whole builds, servers or worker fleets in child processes
@needs_flashinfer
def test_a_warm_up_for_sglang_is_what_its_model_process_builds(server_env, real_nvcc13):  # noqa: F811
    """SGLang's set_cuda_arch() sets 12.0a after FlashInfer's import: the warm-up builds that, in the
    directory of import time, so the model process's build.ninja is the warm-up's, byte for byte."""
    env, site_dir = server_env
    env = dict(env, FAKE_TORCH_CUDA="13.0")
    built, path, text, proc = _warm(env)
    assert built["server_arch"]["value"] == "12.0a" and built["server_arch"]["targets"] == ["sm_120a"]
    assert built["server_arch"]["how"].startswith("read from ")  # the installed (stand-in) source's rule
    assert "SGLang will build for sm_120a (its sglang/srt/utils/common.py set_cuda_arch() sets" in proc.stderr
    server, sproc = run_py(SGLANG_MODEL_PROCESS.format(site=str(site_dir)), env)
    assert server["arch"] == "12.0a", sproc.stderr[-2000:]
    assert server["ninja"] == path  # the same JIT directory (targets of import: 120f) ...
    assert "compute_120a" in server["text"] and server["text"] == text  # ... and the same build line
    shown = cli(["build", "--for", "sglang", "--arch", "12.0", "--ninja-only", "activation"], env, timeout=600,
                python=sys.executable)
    (head,) = [line for line in shown.stdout.splitlines() if line.startswith("nvcc: ")]
    assert "targets sm_120a" in head and "directory of sm_120f" in head, head  # what is built, where


@pytest.mark.slow  # seconds: whole builds, servers or worker fleets in child processes
@needs_flashinfer
def test_without_sglangs_rule_the_warm_up_would_be_rebuilt(server_env, real_nvcc13):  # noqa: F811
    """The case the rule exists for: a warm-up for 120f alone differs from what SGLang writes."""
    env, site_dir = server_env
    env = dict(env, FAKE_TORCH_CUDA="13.0")
    built, path, text, _ = _warm(dict(env, SGLANG_IS_FLASHINFER_AVAILABLE="false"))  # the rule sets nothing
    assert built["server_arch"] is None and "compute_120f" in text
    server, _ = run_py(SGLANG_MODEL_PROCESS.format(site=str(site_dir)), env)
    assert server["ninja"] == path and server["text"] != text


def test_the_rule_is_run_from_the_installed_source(tmp_path, monkeypatch):
    site = install_standins(tmp_path / "site", "sglang")
    common = site / "sglang" / "srt" / "utils" / "common.py"
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    env = {"PATH": "/usr/bin:/bin"}
    got = serverprobe.server_arch("sglang", [(12, 0)], env)
    assert (got.value, got.targets) == ("12.0a", ("sm_120a",)) and got.how == f"read from {common} set_cuda_arch()"
    assert serverprobe.server_arch("sglang", [(12, 1)], env).targets == ("sm_121a",)
    assert serverprobe.server_arch("sglang", [(8, 9)], env).value == "8.9"  # no "a" below major 9
    assert serverprobe.server_arch("sglang", [(12, 0)], dict(env, SGLANG_IS_FLASHINFER_AVAILABLE="false")).value is None
    # a later release that picks "f": the installed source decides, not our row
    common.write_text(common.read_text().replace("{'a' if capability[0] >= 9 else ''}",
                                                 "{'f' if capability[0] >= 9 else ''}"))
    serverprobe._run_rule.cache_clear()
    assert serverprobe.server_arch("sglang", [(12, 0)], env).value == "12.0f"
    assert serverprobe.server_arch("vllm", [(12, 0)], env) is None  # vLLM leaves the arch list alone


def test_without_sglang_the_rule_comes_from_the_row(monkeypatch):
    monkeypatch.setattr(serverprobe, "package_dir", lambda key: None)
    got = serverprobe.server_arch("sglang", [(12, 0)], {})
    assert got.value == "12.0a" and "sglang is not installed" in got.how and got.how.startswith("as in SGLang 0.5.23")
    assert servers.newest("sglang").arch_rule.function == "set_cuda_arch"


@pytest.mark.slow  # seconds: whole builds, servers or worker fleets in child processes
@needs_flashinfer
def test_gpus_of_two_capabilities_cannot_share_one_sglang_warm_up(server_env, real_nvcc13):  # noqa: F811
    env, _ = server_env
    proc = cli(["build", "--for", "sglang", "--arch", "12.0 12.1", "--ninja-only", "activation"],
               dict(env, FAKE_TORCH_CUDA="13.0"), timeout=600, python=sys.executable)
    assert proc.returncode != 0
    assert "makes each model process build for its own GPU only (sm_120a, sm_121a)" in proc.stderr


@pytest.mark.slow  # seconds: whole builds, servers or worker fleets in child processes
@needs_flashinfer
def test_doctor_shows_sglangs_own_targets_and_warns_for_jit_verbose(server_env, real_nvcc13):  # noqa: F811
    env, site_dir = server_env
    env["PYTHONPATH"] += os.pathsep + str(site_dir)
    proc = cli(["doctor", "--verbose", "--timeout", "60"], dict(env, FLASHINFER_CUDA_ARCH_LIST="12.0",
                                                               FAKE_TORCH_CUDA="13.0", FLASHINFER_JIT_VERBOSE="1"),
               timeout=600, python=sys.executable)
    text = " ".join(proc.stdout.split())  # both are findings (one renderer per fact), wrapped at spaces
    assert "WARNING: FLASHINFER_JIT_VERBOSE=1 changes every build line" in text, proc.stderr[-3000:] + text[-3000:]
    assert "NOTE: SGLang will build for sm_120a (its sglang/srt/utils/common.py set_cuda_arch() sets " \
           "FLASHINFER_CUDA_ARCH_LIST=12.0a)" in text, proc.stderr[-3000:] + text[-3000:]


#: After the real build: the model process writes its build.ninja, and the ninja on its PATH (the one
#: flashinfer-sm120 exported, as FlashInfer's run_ninja finds it) is asked what it would do.
SGLANG_MODEL_PROCESS_NINJA = """
    import helpers.fakegpu, json, os, shutil, site, subprocess
    site.addsitedir({site!r})
    import sglang
    from sglang.srt.model_executor.model_runner import ModelRunner
    ModelRunner().load_model()
    from flashinfer_sm120.warmup import modules
    spec = modules.expand(["activation"])[0].spec()
    spec.write_ninja()
    ran = subprocess.run([shutil.which("ninja"), "-n", "-C", str(spec.build_dir)], capture_output=True, text=True)
    print("@@" + json.dumps(dict(arch=os.environ.get("FLASHINFER_CUDA_ARCH_LIST"), out=ran.stdout + ran.stderr)))
"""


@pytest.mark.slow  # one real compile of the smallest module (activation, about 30 s on 2 cores)
@needs_flashinfer
def test_sglangs_model_process_finds_the_real_warm_up_built(server_env, real_nvcc13):  # noqa: F811
    """A real `build --for sglang --arch 12.0 activation`, then a model process (set_cuda_arch())
    writes its build.ninja and the ninja on its PATH says there is nothing to do."""
    env, site_dir = server_env
    env = dict(env, FAKE_TORCH_CUDA="13.0")
    proc = cli(["build", "--for", "sglang", "--arch", "12.0", "--json", "activation"], env, timeout=900, python=sys.executable)
    assert proc.returncode == 0, proc.stderr[-3000:]
    built = json.loads(proc.stdout)["modules"][0]
    assert built["status"] == "built" and built["binary"] == ["SASS sm_120a"]
    out, sproc = run_py(SGLANG_MODEL_PROCESS_NINJA.format(site=str(site_dir)), env)
    assert out["arch"] == "12.0a" and "no work to do" in out["out"], (out, sproc.stderr[-2000:])
