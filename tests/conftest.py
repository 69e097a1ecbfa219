"""Shared fixtures: fake toolkits, a real CUDA 13 nvcc, and a subprocess runner.

Patching FlashInfer is process-wide, so every test that imports FlashInfer runs
it in a fresh child Python (see :func:`run_py`).
"""

from __future__ import annotations

import glob
import json
import os
import site
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent


def make_toolkit(root: Path, version: str = "12.8.93", header: str | None = None, *,
                 nvcc_script: str | None = None, lib64: bool = True, curand: bool = False,
                 version_json: bool = False) -> Path:
    """A fake CUDA toolkit: ``bin/nvcc`` is a shell script printing ``version``."""
    mm = ".".join(version.split(".")[:2])
    (root / "bin").mkdir(parents=True)
    nvcc = root / "bin" / "nvcc"
    nvcc.write_text(nvcc_script or textwrap.dedent(f"""\
        #!/bin/sh
        echo "nvcc: NVIDIA (R) Cuda compiler driver"
        echo "Cuda compilation tools, release {mm}, V{version}"
        echo "Build cuda_{mm}.r{mm}/compiler.0_0"
        """))
    nvcc.chmod(0o755)
    inc = root / "include"
    inc.mkdir()
    hmaj, hmin = (header or mm).split(".")[:2]
    (inc / "cuda_runtime_api.h").write_text(f"#define CUDART_VERSION {int(hmaj) * 1000 + int(hmin) * 10}\n")
    if curand:
        (inc / "curand.h").write_text("/* fake */\n")
    if lib64:
        (root / "lib64" / "stubs").mkdir(parents=True)
        (root / "lib64" / "libcudart.so").write_text("")
        (root / "lib64" / "stubs" / "libcuda.so").write_text("")
    if version_json:
        (root / "version.json").write_text(json.dumps({"cuda_nvcc": {"version": version}}))
    return root


def _real_nvcc13_root() -> str | None:
    dirs = []
    for getter in (site.getsitepackages, lambda: [sysconfig.get_paths()["purelib"]]):
        try:
            dirs += getter()
        except Exception:
            pass
    roots = [p for d in dirs for p in glob.glob(os.path.join(d, "nvidia", "cu13"))]
    roots += sorted(glob.glob("/usr/local/cuda-13*"), reverse=True)
    for root in roots:
        nvcc = os.path.join(root, "bin", "nvcc")
        if os.access(nvcc, os.X_OK):
            try:
                out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=30).stdout
            except Exception:
                continue
            if "release 13." in out:
                return root
    return None


REAL_NVCC13 = _real_nvcc13_root()


@pytest.fixture
def real_nvcc13() -> str:
    """Prefix of a real CUDA 13 nvcc; skips the test where there is none."""
    if REAL_NVCC13 is None:
        pytest.skip("no CUDA 13 nvcc found (pip install 'cuda-toolkit[nvcc,cccl,curand]==13.0.*' "
                    "or install one at /usr/local/cuda-13.0)")
    return REAL_NVCC13


def wheels_dir() -> str:
    """The documented cache of downloaded wheels (old FlashInfer releases, the aarch64 CUDA
    wheels): ``$FLASHINFER_SM120_TEST_WHEELS``, default ``~/.cache/flashinfer-sm120-test-wheels``."""
    return os.environ.get("FLASHINFER_SM120_TEST_WHEELS") or os.path.expanduser(
        "~/.cache/flashinfer-sm120-test-wheels")


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


_FORKSERVER: list = []  # the session's forkserver.Client, started on first use; [None] when off


def pytest_addoption(parser):
    parser.addoption("--no-forkserver", action="store_true",
                     help="run every child Python as a new interpreter (see tests/helpers/forkserver.py)")


def pytest_configure(config):
    if config.getoption("--no-forkserver"):
        _FORKSERVER.append(None)


def pytest_sessionfinish(session):
    if _FORKSERVER and _FORKSERVER[0] is not None:
        _FORKSERVER[0].close()


#: What a test run may leave in the checkout: the environment and the tools' own caches.
CHECKOUT_ALLOWED = (".venv", "venv", ".pytest_cache", ".hypothesis", "__pycache__", "*.egg-info")


def _allowed(path: str) -> bool:
    return any(part == a or (a.startswith("*") and part.endswith(a[1:]))
               for part in path.rstrip("/").split("/") for a in CHECKOUT_ALLOWED)


def checkout_entries(root: Path) -> set[str] | None:
    """``git status --porcelain --ignored`` of ``root`` (untracked and ignored entries, changed
    files), less :data:`CHECKOUT_ALLOWED`; ``None`` when ``root`` is not a git checkout."""
    try:
        proc = subprocess.run(["git", "status", "--porcelain", "--ignored"], cwd=root, capture_output=True,
                              text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    return {line for line in proc.stdout.splitlines() if not _allowed(line[3:])}


@pytest.fixture(scope="session", autouse=True)
def _nothing_written_into_the_checkout():
    """The suite writes only into temporary directories: an entry the checkout did not have
    before the run fails it (a test or command that wrote into the working directory)."""
    root = TESTS.parent
    before = checkout_entries(root)
    yield
    after = checkout_entries(root)
    if before is not None and after is not None:
        new = sorted(after - before)
        assert not new, f"the test run wrote into the checkout {root}: {new}"


def run_code(code: str, env: dict, timeout: float = 600, args: tuple = ()) -> subprocess.CompletedProcess:
    """``python -c code *args`` with ``env``, captured as text: a fresh process, forked from the
    session's fork server (torch and FlashInfer's dependencies already imported, FlashInfer and
    flashinfer_sm120 not) when the environment allows it, else a new interpreter."""
    code = textwrap.dedent(code)
    if not _FORKSERVER:
        try:
            from helpers import forkserver

            _FORKSERVER.append(forkserver.Client())
        except Exception:  # no fork server: new interpreters, as before
            _FORKSERVER.append(None)
    server = _FORKSERVER[0]
    if server is not None and server.usable_for(env):
        return server.run(code, env, timeout, args=list(args))
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


#: ``python -m flashinfer_sm120`` as code for :func:`run_code` (its arguments follow in ``args``).
RUN_MODULE = "import runpy\nrunpy.run_module('flashinfer_sm120', run_name='__main__', alter_sys=True)\n"


def run_py(code: str, env: dict, timeout: float = 600) -> tuple[dict, subprocess.CompletedProcess]:
    """Run ``code`` in a fresh Python (:func:`run_code`); it must print one JSON line prefixed ``@@``."""
    proc = run_code(code, env, timeout)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("@@"):
            return json.loads(line[2:]), proc
    raise AssertionError(f"child printed no result (exit {proc.returncode}):\n"
                         f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-5000:]}")


def has_flashinfer() -> bool:
    try:
        import importlib.util

        return importlib.util.find_spec("flashinfer") is not None
    except Exception:
        return False


needs_flashinfer = pytest.mark.skipif(not has_flashinfer(), reason="flashinfer-python is not installed")


def cli(args, env, timeout=600):
    """``python -m flashinfer_sm120 ARGS`` (a forked child where the environment allows, see run_code)."""
    return run_code(RUN_MODULE, env, timeout, args)


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
