"""The ``.pth`` autoload: lazy, one line when broken or uninstalled, never fatal; enable/disable.

Children start from real venvs whose site-packages hold the ``.pth`` (so it is
processed by ``site`` at start-up, as in production), or call
``site.addsitedir`` first where the venv's own packages are needed.
"""

import json
import os
import subprocess
import sys

import pytest

from helpers.child import run_py
from helpers.host import needs_flashinfer
from helpers.toolkits import make_toolkit
from helpers import SRC
from helpers.child import cli
from helpers.deploy import PTH_NAME, copy_package, env_without, fake_package, make_venv, purelib

HOOK = "FlashInferSm120Autoload"
HOOK_FILE = "flashinfer_sm120_autoload.py"


@pytest.fixture(scope="module")
def bare_venv(tmp_path_factory):
    """A venv with nothing installed; its site-packages gets our .pth per test."""
    root = tmp_path_factory.mktemp("bare")
    py = make_venv(root / "venv")
    return py, purelib(py)


@pytest.fixture
def pth_in(bare_venv):
    py, site_dir = bare_venv
    env = env_without("FLASHINFER_SM120_DISABLE", "FLASHINFER_SM120_AUTOLOAD_TRIGGERS", "PYTHONPATH")
    proc = cli(["enable", "--site-dir", str(site_dir)], dict(env, PYTHONPATH=str(SRC)), python=sys.executable)
    assert proc.returncode == 0, proc.stderr
    yield py, site_dir
    for name in (PTH_NAME, HOOK_FILE):
        (site_dir / name).unlink(missing_ok=True)


def run(py, code, env, timeout=120):
    return subprocess.run([str(py), "-c", code], env=env, capture_output=True, text=True, timeout=timeout)


def test_enable_says_where_and_for_which_interpreter(tmp_path):
    d = tmp_path / "site-packages"
    d.mkdir()
    proc = cli(["enable", "--site-dir", str(d)], env_without("FLASHINFER_SM120_DISABLE"), python=sys.executable)
    assert proc.returncode == 0, proc.stderr
    pth = d / PTH_NAME
    assert str(pth) in proc.stdout and sys.executable in proc.stdout
    assert "flashinfer, vllm, sglang" in proc.stdout
    lines = pth.read_text().splitlines()
    assert len(lines) == 1 and lines[0].startswith("import ")
    assert (d / HOOK_FILE).is_file() and HOOK_FILE in proc.stdout
    assert not list(d.glob(".*.tmp"))  # written through a temp file, nothing left


def test_pth_costs_nothing_until_a_trigger_is_imported(pth_in):
    py, _ = pth_in
    code = ("import sys, json; hooks = [type(f).__name__ for f in sys.meta_path]; "
            "mods = sorted(m for m in ('flashinfer_sm120', 'wrapt', 'asyncio', 'logging', 'packaging', "
            "'importlib.metadata') if m in sys.modules); print(json.dumps([hooks, mods]))")
    env = env_without("FLASHINFER_SM120_DISABLE", "FLASHINFER_SM120_AUTOLOAD_TRIGGERS", PYTHONPATH=str(SRC))
    proc = run(py, code, env)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    hooks, mods = json.loads(proc.stdout)
    assert hooks[0] == HOOK and hooks.count(HOOK) == 1 and mods == []  # venv: lib and lib64 both read
    # FLASHINFER_SM120_DISABLE at start-up: not even the finder
    proc = run(py, code, dict(env, FLASHINFER_SM120_DISABLE="1"))
    assert HOOK not in json.loads(proc.stdout)[0]


def test_trigger_loads_the_package_once_and_leaves(pth_in, tmp_path):
    py, _ = pth_in
    fake_package(tmp_path, "flashinfer", "import sys\nLOADED_BEFORE = 'flashinfer_sm120' in sys.modules\n")
    code = ("import sys, json; a = 'flashinfer_sm120' in sys.modules; import flashinfer; "
            "import flashinfer_sm120.core.autoload as al; "
            "print(json.dumps([a, flashinfer.LOADED_BEFORE, al.state.triggered_by, "
            "[type(f).__name__ for f in sys.meta_path].count('" + HOOK + "')]))")
    env = env_without("FLASHINFER_SM120_DISABLE", "FLASHINFER_SM120_AUTOLOAD_TRIGGERS",
                      PYTHONPATH=os.pathsep.join([str(tmp_path), str(SRC)]), FLASHINFER_SM120_CACHE_DIR=str(tmp_path / "c"))
    proc = run(py, code, env)
    assert proc.returncode == 0, proc.stderr
    before, loaded_before_flashinfer_body, by, left = json.loads(proc.stdout)
    assert before is False and loaded_before_flashinfer_body is True and by == "flashinfer" and left == 0


def test_after_uninstall_the_trigger_says_once_what_to_do(pth_in, tmp_path):
    """The package gone, the hook left: a server must not die later on an unexplained error (P1, P8)."""
    py, site_dir = pth_in
    fake_package(tmp_path, "flashinfer", "VALUE = 42\n")
    env = env_without("FLASHINFER_SM120_DISABLE", "FLASHINFER_SM120_AUTOLOAD_TRIGGERS", PYTHONPATH=str(tmp_path))
    proc = run(py, "pass", env)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr  # nothing before a trigger
    proc = run(py, "import flashinfer; import flashinfer; print(flashinfer.VALUE)", env)
    assert proc.returncode == 0 and proc.stdout.strip() == "42", proc.stderr
    assert proc.stderr.count("flashinfer-sm120:") == 1, proc.stderr
    assert "pip install --force-reinstall" in proc.stderr and str(site_dir / PTH_NAME) in proc.stderr
    assert "pip install flashinfer-sm120" not in proc.stderr  # not on PyPI: that name may install anything
    assert "FLASHINFER_SM120_DISABLE=1" in proc.stderr
    proc = run(py, "import flashinfer", dict(env, FLASHINFER_SM120_DISABLE="1"))
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr


@pytest.mark.parametrize("body", ["raise SystemExit(3)", "raise ImportError('boom')", "import no_such_dependency_x"])
def test_a_broken_package_never_stops_the_interpreter(pth_in, tmp_path, body):
    py, site_dir = pth_in
    fake_package(tmp_path / "fi", "flashinfer", "VALUE = 42\n")
    fake_package(tmp_path / "pkg", "flashinfer_sm120", body + "\n")
    env = env_without("FLASHINFER_SM120_DISABLE", "FLASHINFER_SM120_AUTOLOAD_TRIGGERS",
                      PYTHONPATH=os.pathsep.join([str(tmp_path / "fi"), str(tmp_path / "pkg")]))
    proc = run(py, "pass", env)
    assert proc.returncode == 0 and proc.stderr == ""  # nothing happens before a trigger
    proc = run(py, "import flashinfer; print(flashinfer.VALUE)", env)
    assert proc.returncode == 0 and proc.stdout.strip() == "42", proc.stderr
    assert proc.stderr.count("autoload failed") == 1 and str(site_dir / PTH_NAME) in proc.stderr


@pytest.mark.parametrize("missing", ["core/facts/gpus.py", "core/facts/arch.py", "core/toolkit/sources.py", "safety/fs/statedir.py"])
def test_disable_works_with_the_package_broken(tmp_path, missing):
    copy = copy_package(tmp_path / "copy")
    victim = copy / "flashinfer_sm120" / missing
    if not victim.exists():
        pytest.skip(f"{missing} no longer exists in this layout")
    victim.unlink()
    site_dir = tmp_path / "site-packages"
    site_dir.mkdir()
    env = env_without("FLASHINFER_SM120_DISABLE", PYTHONPATH=str(copy))
    assert cli(["enable", "--site-dir", str(site_dir)], env, python=sys.executable).returncode == 0
    proc = cli(["disable", "--site-dir", str(site_dir)], env, python=sys.executable)
    assert proc.returncode == 0, proc.stderr
    assert not (site_dir / PTH_NAME).exists() and "removed" in proc.stdout


def test_disable_works_with_a_dependency_missing(tmp_path, hiding):
    site_dir = tmp_path / "site-packages"
    site_dir.mkdir()
    env = env_without("FLASHINFER_SM120_DISABLE")
    assert cli(["enable", "--site-dir", str(site_dir)], env, python=sys.executable).returncode == 0
    proc = cli(["disable", "--site-dir", str(site_dir)], dict(hiding("filelock", "wrapt")), python=sys.executable)
    assert proc.returncode == 0, proc.stderr
    assert not (site_dir / PTH_NAME).exists() and "removed" in proc.stdout


def test_disable_removes_the_old_eager_pth(tmp_path):
    site_dir = tmp_path / "site-packages"
    site_dir.mkdir()
    (site_dir / PTH_NAME).write_text("import os, sys; exec(\"import flashinfer_sm120\")\n")  # 0.1.0 style
    proc = cli(["disable", "--site-dir", str(site_dir)], env_without("FLASHINFER_SM120_DISABLE"), python=sys.executable)
    assert proc.returncode == 0 and not (site_dir / PTH_NAME).exists()


def test_enable_user_inside_a_venv_refuses_with_the_reason(tmp_path, bare_venv):
    home = tmp_path / "home"
    home.mkdir()
    env = env_without("FLASHINFER_SM120_DISABLE", "PYTHONUSERBASE", HOME=str(home))
    for python in (sys.executable, str(bare_venv[0])):
        proc = cli(["enable", "--user"], dict(env, PYTHONPATH=str(SRC)), python=python)
        assert sys.prefix != sys.base_prefix  # the test venv is one
        assert proc.returncode == 1, proc.stdout  # refused (the environment), not bad usage
        assert "virtual environment" in proc.stderr and "Fix: run 'flashinfer-sm120 enable' without --user" in proc.stderr
        assert "ENABLE_USER_SITE" in proc.stderr
    assert not list(home.rglob(PTH_NAME))


@needs_flashinfer
def test_vllm_import_exports_the_toolkit_before_flashinfer_is_imported(clean_env, tmp_path, real_nvcc13):
    """A server's ``shutil.which('nvcc')`` check runs after ``import vllm``, before FlashInfer."""
    fake = make_toolkit(tmp_path / "cuda-12.8")
    site_dir = tmp_path / "site-packages"
    site_dir.mkdir()
    assert cli(["enable", "--site-dir", str(site_dir)], clean_env, python=sys.executable).returncode == 0
    fake_package(tmp_path / "srv", "vllm", "import os\nCUDA_HOME_AT_IMPORT = os.environ.get('CUDA_HOME')\n")
    env = dict(clean_env, CUDA_HOME=str(fake), FAKE_GPU_CAPS="12.0", FAKE_TORCH_CUDA="13.0",
               PATH=f"{fake}/bin:/usr/bin:/bin")
    env["PYTHONPATH"] += os.pathsep + str(tmp_path / "srv")
    out, proc = run_py(f"""
        import helpers.fakegpu, site, sys, os, shutil, json
        site.addsitedir({str(site_dir)!r})
        import vllm
        res = __import__("flashinfer_sm120").resolve()
        from flashinfer_sm120.core import autoload
        print("@@" + json.dumps(dict(
            flashinfer_loaded="flashinfer" in sys.modules, at_import=vllm.CUDA_HOME_AT_IMPORT,
            which=os.path.realpath(shutil.which("nvcc")), chosen=os.path.realpath(os.path.join(res.home.path, "bin", "nvcc")),
            cuda_home=os.environ.get("CUDA_HOME"), home=res.home.path, early=autoload.state.early_export)))
    """, env)
    assert out["flashinfer_loaded"] is False, "FlashInfer must not be imported early (it initialises CUDA)"
    assert out["at_import"] == str(fake)  # exported after vllm's own import, not before
    assert out["which"] == out["chosen"] and not out["which"].startswith(str(fake)), (out, proc.stderr)
    assert out["cuda_home"] == out["home"], out


ENCODED = ("marshal", "exec(", "eval(", "bytes.fromhex", "base64", "codecs", "compile(", "zlib")


def test_what_enable_writes_is_readable_standard_library_source(tmp_path):
    """No encoded payload: the .pth is one plain import, its module is readable stdlib-only Python."""
    import ast

    d = tmp_path / "site-packages"
    d.mkdir()
    assert cli(["enable", "--site-dir", str(d)], env_without("FLASHINFER_SM120_DISABLE"), python=sys.executable).returncode == 0
    assert sorted(p.name for p in d.iterdir()) == sorted([PTH_NAME, HOOK_FILE, "__pycache__"])
    pth, hook = (d / PTH_NAME).read_text(), (d / HOOK_FILE).read_text()
    assert pth == "import flashinfer_sm120_autoload; flashinfer_sm120_autoload.install()\n"
    for text in (pth, hook):
        assert text.isascii() and max(map(len, text.splitlines())) <= 120
        for word in ENCODED:
            assert word not in text, word
    assert hook == (SRC / "flashinfer_sm120" / "core/autoload_hook.py").read_text()  # the package's own file
    tree = ast.parse(hook)
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported <= {"os", "sys", "flashinfer_sm120.core.autoload"}, imported
    top = {a.name for n in tree.body if isinstance(n, ast.Import) for a in n.names}
    assert top <= {"os", "sys"}  # the package itself is imported only by a trigger


def test_disable_removes_the_module_and_its_bytecode(pth_in):
    py, site_dir = pth_in
    env = env_without("FLASHINFER_SM120_DISABLE", "PYTHONPATH", "PYTHONDONTWRITEBYTECODE")
    assert run(py, "pass", env).returncode == 0  # another interpreter version caches its own .pyc
    pycs = list((site_dir / "__pycache__").glob("flashinfer_sm120_autoload.*.pyc"))
    assert pycs, "enable caches the module's bytecode (as pip does for installed files)"
    proc = cli(["disable", "--site-dir", str(site_dir)], env_without("FLASHINFER_SM120_DISABLE", PYTHONPATH=str(SRC)), python=sys.executable)
    assert proc.returncode == 0, proc.stderr
    left = [p for p in site_dir.rglob("*flashinfer_sm120*")]
    assert left == [] and str(site_dir / HOOK_FILE) in proc.stdout


def test_a_pth_whose_module_was_deleted_never_stops_the_interpreter(pth_in):
    py, site_dir = pth_in
    (site_dir / HOOK_FILE).unlink()
    proc = run(py, "print(42)", env_without("FLASHINFER_SM120_DISABLE", "PYTHONPATH"))
    assert proc.returncode == 0 and proc.stdout.strip() == "42"


def test_doctor_names_a_pth_left_without_its_module(tmp_path):
    from flashinfer_sm120.diagnose import autoload

    d = tmp_path / "site-packages"
    d.mkdir()
    assert cli(["enable", "--site-dir", str(d)], env_without("FLASHINFER_SM120_DISABLE"), python=sys.executable).returncode == 0
    assert autoload.current(str(d))
    (d / HOOK_FILE).unlink()
    assert not autoload.current(str(d))
    from flashinfer_sm120.diagnose.verify.diagnosis import diagnose
    from helpers.reports import doctor_report

    report = doctor_report(autoload={"pth": [str(d / PTH_NAME)], "outdated": [str(d / PTH_NAME)], "triggers": ["flashinfer"]})
    (found,) = [f for f in diagnose(report).findings if f.code == "autoload-outdated"]
    assert str(d / PTH_NAME) in found.text and HOOK_FILE in found.text and "enable' again" in found.fix


def test_the_hook_reads_disable_as_the_package_does():
    """The hook is a standalone copy (standard library only): its own reading of FLASHINFER_SM120_DISABLE."""
    from flashinfer_sm120.core import autoload_hook
    from flashinfer_sm120.safety.formats.reads import FALSE_VALUES

    assert autoload_hook._OFF == FALSE_VALUES
