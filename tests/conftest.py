"""The fixtures the tests share, and the session's hooks (the fork server, the checkout guard).

Patching FlashInfer is process-wide, so every test that imports FlashInfer runs it in a fresh child
Python (``helpers.child.run_py``).  Functions live in ``tests/helpers``; test files import from there.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap

import pytest
from hypothesis import HealthCheck, settings

from helpers import ROOT, TESTS, child, probing, servers, warm
from helpers.checkout import checkout_entries
from helpers.host import REAL_NVCC13


# Property tests: a small, reproducible run by default (the same examples every run, no database
# written into the checkout, no health check that fails on a loaded machine); HYPOTHESIS_PROFILE=large
# searches wider and anew each run.  Test files name no example counts of their own.
_QUIET = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
settings.register_profile("default", max_examples=25, deadline=None, derandomize=True, database=None,
                          suppress_health_check=_QUIET)
settings.register_profile("large", max_examples=500, deadline=None, suppress_health_check=_QUIET)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


def pytest_addoption(parser):
    parser.addoption("--no-forkserver", action="store_true",
                     help="run every child Python as a new interpreter (see tests/helpers/forkserver.py)")
    parser.addoption("--cpu-profile", metavar="FILE",
                     help="append each test's CPU seconds (its own, its children's, the fork server's children's) "
                          "to FILE as JSON lines; benchmarks/suite_cpu.py sums them")


def pytest_configure(config):
    if config.getoption("--no-forkserver"):
        child.forkserver_off()


def _cpu_now() -> float:
    import resource

    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    server = child._SERVER[0].cpu_s if child._SERVER and child._SERVER[0] is not None else 0.0
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime + server


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    out = item.config.getoption("--cpu-profile")
    before = _cpu_now() if out else 0.0
    yield
    if out:
        with open(out, "a", encoding="utf-8") as fh:  # one short line per write: xdist workers may share it
            fh.write(json.dumps({"test": item.nodeid, "cpu_s": round(_cpu_now() - before, 3)}) + "\n")


def pytest_sessionfinish(session):
    child.close_forkserver()


@pytest.fixture
def real_nvcc13() -> str:
    """Prefix of a real CUDA 13 nvcc; skips the test where there is none."""
    if REAL_NVCC13 is None:
        pytest.skip("no CUDA 13 nvcc found (pip install 'cuda-toolkit[nvcc,cccl,curand]==13.0.*' "
                    "or install one at /usr/local/cuda-13.0)")
    return REAL_NVCC13


@pytest.fixture
def site_packages(tmp_path):
    """An empty directory named as Python's site directories are (``enable --site-dir`` takes only those)."""
    d = tmp_path / "site-packages"
    d.mkdir()
    return d


@pytest.fixture
def clean_env(tmp_path):
    """Environment for a child process: no CUDA_HOME/CUDA_PATH/arch list, a private
    JIT workspace and view cache, and the tests dir importable (for fakegpu)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("CUDA_HOME", "CUDA_PATH", "FLASHINFER_CUDA_ARCH_LIST", "FLASHINFER_SM120_DISABLE",
                        "CUDA_VISIBLE_DEVICES", "FAKE_GPU_CAPS", "FAKE_TORCH_CUDA")}
    env["FLASHINFER_WORKSPACE_BASE"] = str(tmp_path / "ws")
    env["FLASHINFER_SM120_CACHE_DIR"] = str(tmp_path / "sm120cache")
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


@pytest.fixture(autouse=True)
def _no_arch_option(monkeypatch):
    """An in-process command's ``--arch`` is remembered for its messages (``archopt.named``): never
    into the next test, which may set the same FLASHINFER_CUDA_ARCH_LIST itself."""
    from flashinfer_sm120.core.facts import archopt

    monkeypatch.setattr(archopt, "_option", None)


@pytest.fixture(autouse=True)
def _environ_restored():
    """Each test leaves ``os.environ`` as it found it: an in-process command that imports FlashInfer
    patches this process and exports ``CUDA_HOME``, ``PATH`` and Triton's ptxas, which every later
    test's children would inherit (a test then passed or failed by the order it ran in)."""
    saved = dict(os.environ)
    yield
    if dict(os.environ) != saved:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture(scope="session", autouse=True)
def _nothing_written_into_the_checkout():
    """The suite writes only into temporary directories: an entry the checkout did not have
    before the run fails it (a test or command that wrote into the working directory)."""
    root = ROOT
    before = checkout_entries(root)
    yield
    after = checkout_entries(root)
    if before is not None and after is not None:
        new = sorted(after - before)
        assert not new, f"the test run wrote into the checkout {root}: {new}"


@pytest.fixture
def hiding(tmp_path, clean_env):
    """``hiding("flashinfer", "torch")``: an environment where those are not installed."""
    d = tmp_path / "hide"
    d.mkdir()
    (d / "sitecustomize.py").write_text(textwrap.dedent("""\
        import os, sys
        _HIDDEN = set(os.environ["HIDE_MODULES"].split(","))
        class _NotInstalled:
            def find_spec(self, name, path=None, target=None):
                if name.partition(".")[0] in _HIDDEN:
                    raise ModuleNotFoundError(f"No module named {name!r}", name=name)
                return None
        sys.meta_path.insert(0, _NotInstalled())
        """))

    def env(*names):
        return dict(clean_env, HIDE_MODULES=",".join(names),
                    PYTHONPATH=os.pathsep.join([str(d), clean_env["PYTHONPATH"]]))
    return env


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """flashinfer-sm120's own cache root in ``tmp_path/cache`` (``FLASHINFER_SM120_CACHE_DIR``),
    with the process's remembered root cleared before and after."""
    d = tmp_path / "cache"
    monkeypatch.setenv("FLASHINFER_SM120_CACHE_DIR", str(d))
    from flashinfer_sm120.safety.fs import statedir

    statedir.forget_cache_root()
    yield d
    statedir.forget_cache_root()


@pytest.fixture
def warmed(clean_env, tmp_path, real_nvcc13):
    """A JIT cache built by ``build --from`` a recorded manifest of two modules with a fake compiler
    (``helpers.warm``): ``(env, manifest, compiler log, tmp_path)``."""
    env, log = warm.fake_compiler_env(clean_env, tmp_path)
    manifest = tmp_path / "m.jsonl"
    child.run_py(warm.RECORD, dict(env, FAKE_GPU_CAPS="12.0", FAKE_TORCH_CUDA="13.0", FLASHINFER_DISABLE_JIT="1",
                                   FLASHINFER_SM120_RECORD=str(manifest)))
    assert len(manifest.read_text().splitlines()) == 2
    proc = child.cli(["build", "--from", str(manifest), "-j", "2", "--json"], env, fakegpu=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert {m["status"] for m in json.loads(proc.stdout)["modules"]} == {"built"}
    return env, manifest, log, tmp_path


@pytest.fixture
def shared_tmp():
    """A directory every uid may enter (pytest's tmp dirs are 0700, closed to other uids)."""
    with probing.reachable_dir() as d:
        yield d


@pytest.fixture
def server_env(clean_env, tmp_path):
    """A child environment: the stand-ins importable (vllm, sglang), the autoload's .pth in a
    site dir the child adds, HOME in tmp, no FLASHINFER_WORKSPACE_BASE, and a system PATH with
    neither ninja nor nvcc (the venv's bin is not on it, as under systemd)."""
    site_dir = tmp_path / "site-packages"
    site_dir.mkdir()
    assert child.cli(["enable", "--site-dir", str(site_dir)], clean_env, python=sys.executable).returncode == 0
    env = dict(clean_env, HOME=str(tmp_path / "home"), FAKE_GPU_CAPS="12.0",
               PATH=str(servers.system_bin_without(tmp_path / "sysbin", "ninja", "nvcc")))
    env.pop("FLASHINFER_WORKSPACE_BASE")
    env["PYTHONPATH"] += os.pathsep + str(servers.STANDINS)
    (tmp_path / "home").mkdir()
    return env, site_dir
