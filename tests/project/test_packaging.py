"""The sdist and wheel, built with the project's own backend (hatchling): the Apache-2.0 LICENSE
in both, everything a packager needs in the sdist (it builds a wheel by itself), nothing local."""

import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytest.importorskip("hatchling", reason="hatchling (the build backend) is not installed: pip install -e '.[test]'")

_BUILD = "import sys\nfrom hatchling.build import build_{kind}\nprint(build_{kind}(sys.argv[1]))\n"


def _build(kind: str, src: Path, out: Path) -> Path:
    proc = subprocess.run([sys.executable, "-c", _BUILD.format(kind=kind), str(out)], cwd=src,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out / proc.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def sdist(tmp_path_factory):
    """Built from a copy of the working tree with local files added, never from the checkout itself: another
    worker's checkout guard (tests/conftest.py) would see them."""
    tree = tmp_path_factory.mktemp("tree") / "flashinfer-sm120"
    tree.mkdir()
    for name in ("src", "tests", "docs", "examples", "benchmarks", ".ci", "mkdocs.yml", "README.md", "CHANGELOG.md",
                 "LICENSE", "pyproject.toml", ".gitignore"):
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, tree / name, ignore=shutil.ignore_patterns(".venv", ".hypothesis", ".pytest_cache"))
        elif src.exists():
            shutil.copy2(src, tree / name)
    for p in (tree / "src" / "flashinfer_sm120" / "__pycache__" / "local.pyc", tree / "notes-local.txt"):
        p.parent.mkdir(parents=True, exist_ok=True)  # things a working tree has and a release must not carry
        p.write_text("local\n")
    return _build("sdist", tree, tmp_path_factory.mktemp("sdist"))


def test_sdist_carries_what_a_packager_needs_and_nothing_local(sdist):
    with tarfile.open(sdist) as tar:
        names = [n.split("/", 1)[1] for n in tar.getnames() if "/" in n]
    for needed in ("LICENSE", "README.md", "CHANGELOG.md", "pyproject.toml", "mkdocs.yml", "docs/gen_ref.py",
                   "docs/index.md", "src/flashinfer_sm120/__init__.py", "src/flashinfer_sm120/core/autoload_hook.py",
                   "tests/conftest.py", "examples/Dockerfile", "benchmarks/bench.py", ".ci/run"):
        assert needed in names, needed
    local = [n for n in names if n.endswith((".pyc", ".pyo")) or n.startswith((".venv", "site/", "dist/", ".git/"))
             or any(part in (".pytest_cache", ".hypothesis", "__pycache__") for part in n.split("/"))
             or n == "notes-local.txt"]
    assert local == []


def test_sdist_builds_a_wheel_with_the_license_and_the_package(sdist, tmp_path):
    with tarfile.open(sdist) as tar:
        tar.extractall(tmp_path, filter="data")
    (top,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    wheel = _build("wheel", top, tmp_path / "wheel")
    with zipfile.ZipFile(wheel) as whl:
        names = whl.namelist()
        meta = whl.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        license_text = whl.read(next(n for n in names if n.endswith(".dist-info/licenses/LICENSE"))).decode()
    assert "License-Expression: Apache-2.0" in meta and "License-File: LICENSE" in meta
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    assert license_text == (ROOT / "LICENSE").read_text()
    for module in ("flashinfer_sm120/__init__.py", "flashinfer_sm120/core/autoload_hook.py", "flashinfer_sm120/py.typed",
                   "flashinfer_sm120/cli/status.py"):
        assert module in names, module
    assert not [n for n in names if n.startswith(("tests/", "docs/")) or n.endswith(".pyc")]
    assert "Provides-Extra: docs" in meta and "Provides-Extra: test" in meta
    assert os.path.getsize(wheel) < 1 << 20  # source only


@pytest.mark.slow  # builds a wheel and a fresh venv
def test_a_wheel_from_python_m_build_installs_without_a_clone_and_reports_its_versions(tmp_path):
    """docs/deploy.md, "Install without a clone": ``python -m build --wheel``, then the wheel in a
    fresh venv.  ``--no-deps`` keeps it offline: ``--version`` still answers, naming what is missing."""
    pytest.importorskip("build", reason="the 'build' frontend is not installed: pip install -e '.[test]'")
    out = tmp_path / "dist"
    proc = subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(ROOT)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (wheel,) = out.glob("flashinfer_sm120-*-py3-none-any.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, timeout=300)
    pip = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                          str(wheel)], capture_output=True, text=True, timeout=300)
    assert pip.returncode == 0, pip.stderr[-2000:]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["HOME"] = str(tmp_path / "home")
    ver = subprocess.run([str(venv / "bin" / "flashinfer-sm120"), "--version"], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert ver.returncode == 0 and "Traceback" not in ver.stderr, ver.stdout + ver.stderr
    lines = ver.stdout.splitlines()
    assert lines[0].startswith("flashinfer-sm120 0.") and str(venv) in lines[0]  # the wheel's, not the checkout's
    assert "FlashInfer: not installed (pip install flashinfer-python)" in lines
    assert "torch: not installed" in lines and lines[-1].startswith("nvcc")


def test_every_hook_in_history_is_recognised_by_enable():
    """``enable`` over a hook an earlier version wrote replaces it as ours; one it does not recognise is kept as
    someone else's (P5), so an upgrade would refuse its own old hook. Every version of the hook file in git
    history is this release's text or listed in ``EARLIER_HOOKS``."""
    import hashlib
    import shutil

    from flashinfer_sm120.cli.enable import EARLIER_HOOKS

    git = shutil.which("git")
    paths = ["src/flashinfer_sm120/core/autoload_hook.py", "src/flashinfer_sm120/autoload_hook.py"]
    log = subprocess.run([git, "-C", str(ROOT), "log", "--format=%H", "--", *paths], capture_output=True,
                         text=True) if git else None
    if log is None or log.returncode != 0 or not log.stdout.strip():
        pytest.skip("no git history of the hook here (not a git checkout, or a shallow clone)")
    current = hashlib.sha256((ROOT / paths[0]).read_bytes()).hexdigest()
    unknown = []
    for commit in log.stdout.split():
        for path in paths:
            blob = subprocess.run([git, "-C", str(ROOT), "show", f"{commit}:{path}"], capture_output=True)
            digest = hashlib.sha256(blob.stdout).hexdigest()
            if blob.returncode == 0 and digest != current and digest not in EARLIER_HOOKS:
                unknown.append((commit[:9], path, digest))
    assert not unknown, unknown
