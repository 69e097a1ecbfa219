"""A toolkit's version is what its nvcc binary says; a version file beside it that disagrees is a
typed finding (``Toolkit.disagreement``), never the version used.  Fake toolkits are ``bin/nvcc``
scripts."""

import json


from helpers.child import run_py
from helpers.host import needs_flashinfer
from helpers.toolkits import lying_toolkit, make_toolkit



def test_a_version_file_that_disagrees_with_nvcc_is_a_finding(tmp_path, cache_dir):
    """A version.json saying 13.0.88 beside an nvcc 12.8 is a finding, not believed: the version is nvcc's
    (P1)."""
    from flashinfer_sm120.core.toolkit.model import VersionDisagreement
    from flashinfer_sm120.core.toolkit.probe import inspect

    runs = tmp_path / "runs"
    root = lying_toolkit(tmp_path / "cuda", runs=runs)
    tk = inspect(str(root))
    assert tk.nvcc_full == "12.8.93" and str(tk.nvcc_version) == "12.8" and tk.version_from == "nvcc --version"
    assert tk.disagreement == VersionDisagreement(str(root / "version.json"), "13.0.88", tk.nvcc, "12.8.93")
    assert tk.to_dict()["disagreement"]["file_version"] == "13.0.88"
    assert tk.problem and "12.8" in tk.problem and "13.0" in tk.problem  # nvcc 12.8 with headers 13.0
    # one run, remembered: a second look runs nothing
    inspect(str(root))
    assert runs.read_text().count("x") == 1


def test_a_version_file_that_agrees_names_the_source_and_nvcc_runs_once(tmp_path, cache_dir):
    from flashinfer_sm120.core.toolkit.probe import inspect

    runs = tmp_path / "runs"
    root = lying_toolkit(tmp_path / "cuda", says="13.0.88", file_says="13.0.88", runs=runs)
    for _ in range(3):
        tk = inspect(str(root))
        assert tk.nvcc_full == "13.0.88" and tk.version_from == str(root / "version.json")
        assert tk.disagreement is None and tk.problem is None
    assert runs.read_text().count("x") == 1


def test_an_nvcc_that_cannot_say_its_version_is_refused_whatever_the_file_says(tmp_path, cache_dir):
    from flashinfer_sm120.core.toolkit.probe import inspect

    root = make_toolkit(tmp_path / "cuda", "13.0.88", nvcc_script="#!/bin/sh\nexit 3\n", version_json=True)
    tk = inspect(str(root))
    assert tk.nvcc_full is None and tk.problem, tk


_CHILD = r"""
import json, helpers.fakegpu, flashinfer_sm120, flashinfer
import flashinfer.jit.env as env
st = flashinfer_sm120.status()
print("@@" + json.dumps({"jit": str(env.FLASHINFER_JIT_DIR), "mode": st["mode"], "summary": st.get("summary")}))
"""


@needs_flashinfer
def test_a_lying_version_file_neither_passes_as_correct_nor_names_the_workspace(tmp_path, clean_env):
    """A lying version file neither passes as 'already resolves correctly' nor tags the workspace
    nvcc13.0.88 (P1)."""
    root = lying_toolkit(tmp_path / "cuda", says="12.8.93", file_says="12.8.93")
    (root / "version.json").write_text(json.dumps({"cuda_nvcc": {"version": "13.0.88"}}))
    (root / "include" / "cuda_runtime_api.h").write_text("#define CUDART_VERSION 12080\n")
    env = dict(clean_env, CUDA_HOME=str(root), FAKE_GPU_CAPS="12.0", FAKE_TORCH_CUDA="12.8")
    out, proc = run_py(_CHILD, env)
    assert "nvcc13.0.88" not in out["jit"], out
    assert "13.0.88" not in (out["summary"] or ""), out


def test_a_process_that_cannot_start_programs_refuses_the_toolkit_for_now_unremembered(tmp_path, cache_dir,
                                                                                     monkeypatch):
    """E2BIG (1 MiB of environment: Linux starts no program) is this process's fault, not the binary's:
    the toolkit is refused for now, naming the environment as the cause, never given its version file's
    version (P1: only the binary's answer counts), and nothing is remembered against it."""
    from flashinfer_sm120.core.toolkit.probe import inspect
    from flashinfer_sm120.core.toolkit import memo
    from flashinfer_sm120.safety.ownership import fingerprint

    runs = tmp_path / "runs"
    root = lying_toolkit(tmp_path / "cuda", says="13.0.88", file_says="13.0.88", runs=runs)
    monkeypatch.setenv("JUNK", "x" * (1 << 20))
    tk = inspect(str(root))
    assert tk.nvcc_full is None and "environment is too large" in tk.problem and not runs.exists()
    assert memo.VERSIONS.lookup(tk.nvcc, fingerprint(tk.nvcc)) is None
    monkeypatch.delenv("JUNK")
    again = inspect(str(root))
    assert again.nvcc_full == "13.0.88" and again.problem is None and runs.exists()
