import json
import os

import pytest
from packaging.version import Version

from helpers.guards import until
from helpers.toolkits import make_toolkit, script
from flashinfer_sm120.core.toolkit.sources import flashinfer_naive_root
from flashinfer_sm120.core.toolkit.sources import discover
from flashinfer_sm120.core.toolkit.probe import inspect


def test_version_from_nvcc_fallback(tmp_path):
    tk = inspect(str(make_toolkit(tmp_path / "cuda-12.8")))
    assert tk.nvcc_version == Version("12.8") and tk.nvcc_full == "12.8.93"
    assert tk.version_from == "nvcc --version" and tk.problem is None
    assert tk.header_version == Version("12.8")


def test_version_json_is_named_as_the_source_once_nvcc_agrees(tmp_path):
    """nvcc is asked (threat-model P1: the binary, not a file beside it); the file that agrees is the source."""
    marker = tmp_path / "ran"
    root = make_toolkit(tmp_path / "cuda-12.9", "12.9.41", version_json=True,
                        nvcc_script=f"#!/bin/sh\n/usr/bin/touch {marker}\necho 'release 12.9, V12.9.41'\n")
    tk = inspect(str(root))
    assert tk.nvcc_full == "12.9.41" and tk.version_from.endswith("version.json")
    assert marker.exists() and tk.disagreement is None


def test_the_version_is_what_nvcc_says_never_a_file_beside_it(tmp_path, monkeypatch):
    """threat-model P1: nvcc printing 13.5 beside a version.json saying 11.8 is 13.5, labelled as nvcc's;
    when nvcc cannot be run for this process's own reasons (EAGAIN after a forking nvcc used the
    process limit), the toolkit is refused, never given the file's version labelled as the file's."""
    import errno

    from flashinfer_sm120.safety import proc

    monkeypatch.setenv("FLASHINFER_SM120_CACHE_DIR", str(tmp_path / "c"))
    root = make_toolkit(tmp_path / "cuda-x", "13.5.37", curand=True)
    (root / "version.json").write_text(json.dumps({"cuda_nvcc": {"version": "11.8.89"}}))
    tk = inspect(str(root))
    assert tk.nvcc_full == "13.5.37" and tk.version_from == "nvcc --version" and tk.problem is None
    assert tk.disagreement.file_version == "11.8.89" and tk.disagreement.nvcc_version == "13.5.37"
    liar = make_toolkit(tmp_path / "cuda-y", "11.8.89", header="13.5", curand=True)
    (liar / "version.json").write_text(json.dumps({"cuda_nvcc": {"version": "13.5.37"}}))
    monkeypatch.setattr(proc, "run", lambda *a, **k: proc.Result(None, b"", False, False, 0.0,
                                                                  "fork failed", errno.EAGAIN))
    tk = inspect(str(liar))
    assert tk.nvcc_full is None and tk.version_from is None, tk
    assert "ulimit -u" in tk.problem and "retry" in tk.problem


@pytest.mark.parametrize("err, fix", [("EMFILE", "ulimit -n"), ("ENOMEM", "free memory"), ("EAGAIN", "ulimit -u")])
def test_a_limit_hit_while_probing_is_the_fix_not_a_toolkit_or_ninja(tmp_path, monkeypatch, err, fix):
    """threat-model P8: nvcc and ninja that cannot be run because this process hit a limit (EMFILE under
    `ulimit -n 8`) get the limit and its fix, never 'pip install cuda-toolkit' or 'reinstall ninja'."""
    import errno

    from flashinfer_sm120.core.toolkit import fixes, ninja
    from flashinfer_sm120.safety import proc

    root = make_toolkit(tmp_path / "cuda-x", "13.0.88", curand=True)
    monkeypatch.setattr(proc, "run", lambda *a, **k: proc.Result(None, b"", False, False, 0.0,
                                                                  "nvcc could not be run", getattr(errno, err)))
    tk = inspect(str(root))
    assert fix in tk.problem and str(root) in tk.problem, tk.problem
    chosen = fixes.choose_fix([(12, "0f")], None, [tk])
    assert fix in chosen and "pip install" not in chosen, chosen
    if err == "EMFILE":
        import resource

        assert f"ulimit -n: {resource.getrlimit(resource.RLIMIT_NOFILE)[0]}" in tk.problem  # the value
    n = ninja.Ninja("/x/ninja", "/x/ninja", ("PATH",), None, tk.problem)
    with pytest.raises(ninja.NinjaError) as e:
        ninja.choose(found=[n])
    assert f"Fix: {chosen}" in str(e.value) and "pip install" not in str(e.value)


def test_version_from_pip_dist_info(tmp_path):
    site_dir = tmp_path / "site-packages"
    root = make_toolkit(site_dir / "nvidia" / "cu13", "13.0.88", lib64=False)
    dist = site_dir / "nvidia_cuda_nvcc-13.0.88.dist-info"
    dist.mkdir()
    (dist / "RECORD").write_text("nvidia/cu13/bin/nvcc,sha256=x,1\n")
    tk = inspect(str(root))
    assert tk.nvcc_full == "13.0.88" and tk.version_from == str(dist)


def test_garbage_nvcc_is_rejected_with_message(tmp_path):
    root = make_toolkit(tmp_path / "cuda-x", nvcc_script="#!/bin/sh\necho 'hello world'\n")
    tk = inspect(str(root))
    assert tk.nvcc_version is None
    assert str(root / "bin" / "nvcc") in tk.problem and "first line: 'hello world'" in tk.problem
    assert "CUDA_HOME" in tk.problem and "if any" not in tk.problem


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHINFER_SM120_CACHE_DIR", str(tmp_path / "cache"))


def test_hanging_nvcc_times_out_kills_its_children_and_is_remembered(tmp_path):
    pidfile = tmp_path / "sleep.pid"
    runs = tmp_path / "runs"
    # a wrapper whose child (not the shell itself) hangs, as in real wrappers
    root = make_toolkit(tmp_path / "cuda-hang",
                        nvcc_script=f"#!/bin/sh\necho x >> {runs}\n/usr/bin/sleep 60 &\necho $! > {pidfile}\nwait\n")
    tk = inspect(str(root), timeout=1.0)
    assert tk.nvcc_version is None
    assert "did not answer" in tk.problem and "1 s" in tk.problem and str(root) in tk.problem
    pid = int(pidfile.read_text())
    assert until(lambda: _gone(pid)), "the hung nvcc's child outlived the timeout"  # SIGKILL takes a moment
    # a second process-worth of discovery does not wait again: nvcc is not run again
    again = inspect(str(root), timeout=1.0)
    assert again.problem == tk.problem and runs.read_text() == "x\n"


def _gone(pid):
    """Dead, or a zombie waiting for an init that does not reap (containers)."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            return any(line.startswith("State:") and "Z" in line.split()[1] for line in fh)
    except FileNotFoundError:
        return True


def test_remembered_answer_is_dropped_when_nvcc_changes(tmp_path):
    root = make_toolkit(tmp_path / "cuda-x", nvcc_script="#!/bin/sh\necho garbage\n")
    assert inspect(str(root)).nvcc_version is None
    make_nvcc = root / "bin" / "nvcc"
    make_nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 12.9, V12.9.41'\n")
    assert inspect(str(root)).nvcc_version == Version("12.9")


def test_header_mismatch_is_rejected(tmp_path):
    tk = inspect(str(make_toolkit(tmp_path / "mix", "13.0.88", header="13.5")))
    assert "nvcc 13.0 with CUDA headers 13.5" in tk.problem and "cuda-toolkit" in tk.problem


def test_untrusted_nvcc_is_never_run(tmp_path):
    marker = tmp_path / "ran"
    shared = tmp_path / "shared"
    shared.mkdir()
    root = make_toolkit(shared / "cuda", nvcc_script=f"#!/bin/sh\n/usr/bin/touch {marker}\necho 'release 12.8, V12.8.1'\n")
    os.chmod(shared, 0o777)  # world-writable, no sticky bit
    try:
        tk = inspect(str(root))
    finally:
        os.chmod(shared, 0o755)
    assert not marker.exists()
    assert tk.problem.startswith("not run:") and "writable by other users" in tk.problem


def test_missing_cuda_home_named(tmp_path):
    env = {"CUDA_HOME": str(tmp_path / "nope"), "PATH": ""}
    tks = discover(env)
    bad = [t for t in tks if "CUDA_HOME" in t.sources]
    assert len(bad) == 1 and "does not exist" in bad[0].problem and str(tmp_path / "nope") in bad[0].problem


@pytest.mark.parametrize("form", [":{p}", "{p}/bin", "{p}/", "{p}/bin/nvcc"])
def test_cuda_home_cleaned(tmp_path, form):
    root = make_toolkit(tmp_path / "cuda-12.8")
    env = {"CUDA_HOME": form.format(p=root), "PATH": ""}
    (first,) = [t for t in discover(env) if "CUDA_HOME" in t.sources]
    assert first.root == str(root) and first.problem is None


def test_wrapper_script_on_path_resolves_to_toolkit(tmp_path):
    real = make_toolkit(tmp_path / "cuda-13.0", "13.0.88")
    bindir = tmp_path / "usr-local-bin"
    bindir.mkdir()
    wrapper = bindir / "nvcc"
    script(wrapper, f'#!/bin/sh\nexec {real}/bin/nvcc "$@"\n')
    link_dir = tmp_path / "links"
    link_dir.mkdir()
    (link_dir / "nvcc").symlink_to(wrapper)
    for d in (bindir, link_dir):
        env = {"PATH": str(d)}
        (tk,) = [t for t in discover(env) if "PATH" in t.sources]
        assert tk.root == str(real) and tk.nvcc_version == Version("13.0")
        # FlashInfer's own rule would take dirname(dirname(which nvcc)):
        assert flashinfer_naive_root(env) == str(d.parent)


def test_same_nvcc_from_two_sources_is_one_candidate(tmp_path):
    root = make_toolkit(tmp_path / "cuda-12.9", "12.9.41")
    env = {"CUDA_HOME": str(root), "PATH": str(root / "bin")}
    hits = [t for t in discover(env) if t.root == str(root)]
    assert len(hits) == 1 and hits[0].sources[:2] == ("CUDA_HOME", "PATH")


def test_cuda_home_pointing_at_our_view_means_the_toolkit_behind_it(tmp_path):
    real = make_toolkit(tmp_path / "cuda-13.0", "13.0.88", curand=True)
    view = tmp_path / "view"
    view.mkdir()
    (view / "flashinfer_sm120_view.json").write_text(json.dumps({"toolkit": str(real)}))
    (first,) = [t for t in discover({"CUDA_HOME": str(view), "PATH": ""}) if "CUDA_HOME" in t.sources]
    assert first.root == str(real) and "flashinfer-sm120 view" in first.given_as
