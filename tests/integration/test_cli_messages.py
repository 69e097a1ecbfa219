"""What a new user is told, each case held by a test (P8): never a fix that names
``pip install flashinfer-sm120`` (not on PyPI), a traceback for a missing dependency,
``status --json`` printing text, an unwritable home with no fix, a set-but-bad arch list
reported as unset, no hint for ``--arch 12`` or a mistyped module, a launcher called "sccache
None", two different fixes for one mixed pip toolkit, a broken ninja reported per module, a
malformed ``CUDA_HOME`` said twice, or ``doctor`` silent about modules built for other targets."""

import errno
import json
import os

import pytest

from helpers.child import cli
from helpers.host import needs_flashinfer
from packaging.version import Version

from flashinfer_sm120.core.facts import arch, refusals, reinstall
from flashinfer_sm120.cli import main
from flashinfer_sm120.cli.status import status_line
from flashinfer_sm120.core.patch.laststatus import from_status
from flashinfer_sm120.core.facts.arch import ArchListError
from flashinfer_sm120.core.toolkit import fixes, ninja
from flashinfer_sm120.core.toolkit.model import Toolkit
from flashinfer_sm120.warmup import modules


# --------------------------------------------------------------------------- the reinstall fix


def test_a_missing_dependency_names_that_dependency():
    exc = ModuleNotFoundError("No module named 'filelock'", name="filelock")
    assert reinstall.fix_for(exc) == "pip install filelock (a dependency of flashinfer-sm120)"
    assert reinstall.fix_for(ModuleNotFoundError("x", name="pynvml")).startswith("pip install nvidia-ml-py")


def test_any_other_break_reinstalls_from_the_checkout_never_from_pypi(monkeypatch):
    class Dist:
        def read_text(self, name):
            assert name == "direct_url.json"
            return json.dumps({"url": "file:///home/me/flashinfer-sm120", "dir_info": {}})

    import importlib.metadata

    monkeypatch.setattr(importlib.metadata, "distribution", lambda name: Dist())
    fix = reinstall.fix_for(RuntimeError("boom"))
    assert fix.startswith("pip install --force-reinstall /home/me/flashinfer-sm120 ")
    monkeypatch.setattr(importlib.metadata, "distribution", lambda name: (_ for _ in ()).throw(OSError()))
    assert "--force-reinstall /path/to/flashinfer-sm120" in reinstall.fix_for(RuntimeError("boom"))


def test_no_message_in_the_package_installs_flashinfer_sm120_from_pypi():
    src = os.path.join(os.path.dirname(reinstall.__file__))
    for root, _, files in os.walk(src):
        for name in files:
            if name.endswith(".py"):
                text = open(os.path.join(root, name)).read()
                assert "install --force-reinstall flashinfer-sm120" not in text, name
                assert "pip install flashinfer-sm120" not in text, name


@pytest.mark.parametrize("args", [["doctor", "--timeout", "30"], ["status"]])
def test_missing_dependency_is_one_line_with_the_fix_not_a_traceback(hiding, tmp_path, args):
    home = tmp_path / "home"
    home.mkdir()
    proc = cli(args, dict(hiding("filelock"), HOME=str(home)), timeout=300)
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.returncode != 0
    assert "pip install filelock" in proc.stderr + proc.stdout


@pytest.mark.parametrize("args", [["status", "--json"], ["doctor", "--json", "--timeout", "30"]])
def test_json_is_json_even_with_a_dependency_missing(hiding, args):
    proc = cli(args, hiding("filelock"), timeout=300)
    assert proc.returncode != 0
    st = json.loads(proc.stdout)  # each command's own failure document: status's mode, doctor's ok/error
    assert (st.get("mode") == "failed" if args[0] == "status" else st.get("ok") is False), st
    assert "pip install filelock" in json.dumps(st)


def test_no_command_prints_the_help_and_exits_2(capsys):
    """A bare ``flashinfer-sm120`` printed only argparse's 'required: command' error."""
    assert main([]) == 2
    out = capsys.readouterr().out
    assert out.startswith("usage: flashinfer-sm120") and "doctor" in out and "Start with 'flashinfer-sm120 doctor'" in out


# --------------------------------------------------------------------------- status


@needs_flashinfer
def test_status_json_is_json_when_flashinfer_is_missing(hiding):
    proc = cli(["status", "--json"], hiding("flashinfer"))
    assert proc.returncode == 1
    st = json.loads(proc.stdout)
    assert st["mode"] == "not installed" and "pip install flashinfer-python" in st["error"]


@needs_flashinfer
@pytest.mark.parametrize("args", [["status", "--json"], ["build", "--arch", "12.0", "sampling"]])
def test_an_unwritable_home_names_flashinfer_workspace_base(clean_env, tmp_path, args):
    home = tmp_path / "home"
    home.write_text("a file, not a directory")  # FlashInfer cannot create ~/.cache/flashinfer
    env = dict(clean_env, HOME=str(home))
    env.pop("FLASHINFER_WORKSPACE_BASE")
    proc = cli(args, env)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "Traceback" not in out, out[-3000:]
    # refused before FlashInfer's import, which would fail on it (P4: a missing home is not created)
    assert "Fix: set FLASHINFER_WORKSPACE_BASE to a directory of your own" in out and str(home) in out, out[-2000:]
    assert "Please report" not in out
    if args[0] == "status":
        assert json.loads(proc.stdout)["mode"] == "refused"


def test_status_says_a_set_but_unusable_arch_list_is_unusable():
    st = {"mode": "patched", "target_cuda_archs": [],
          "resolution": {"choice": {"toolkit": {"nvcc_full": "13.0.88", "root": "/tk"}},
                         "arch_list_error": "FLASHINFER_CUDA_ARCH_LIST='12.0x': entry '12.0x' is not ..."}}
    line = status_line(from_status(st))
    assert "'12.0x'" in line and "no FLASHINFER_CUDA_ARCH_LIST" not in line
    st["resolution"]["arch_list_error"] = None
    assert "no FLASHINFER_CUDA_ARCH_LIST" in status_line(from_status(st))


# --------------------------------------------------------------------------- hints


@pytest.mark.parametrize("value, meant", [("12", "12.0"), ("9", "9.0"), ("10", "10.0")])
def test_a_bare_major_gets_did_you_mean(value, meant):
    with pytest.raises(ArchListError, match=f"Did you mean '{meant}'"):
        arch.parse_arch_list(value, source="--arch")


def test_a_mistyped_module_gets_did_you_mean():
    with pytest.raises(modules.ModuleError, match="did you mean 'sampling'"):
        modules.expand(["samplng"])
    with pytest.raises(modules.ModuleError) as exc:
        modules.expand(["qqqq"])
    assert "did you mean" not in str(exc.value)


# --------------------------------------------------------------------------- one fix per fault


def test_a_mixed_pip_toolkit_gets_one_fix():
    mixed = Toolkit(root="/sp/nvidia/cu13", nvcc="/sp/nvidia/cu13/bin/nvcc", sources=("pip",),
                    nvcc_version=Version("13.0"), nvcc_full="13.0.88", header_version=Version("13.5"), problem="nvcc 13.0 with CUDA headers 13.5 (...): install one "
                    "consistent set: pip install 'cuda-toolkit[nvcc,cccl,curand]==13.0.*'")
    fix = fixes.toolkit_fix(Version("12.9"), "13.0", [mixed])
    assert fix.count("pip install") == 1, fix
    assert "==13.0.*" in fix and "--force-reinstall" not in fix


def test_a_broken_ninja_says_reinstall_and_build_stops_once(clean_env, tmp_path):
    broken = ninja.Ninja("/venv/bin/ninja", "/venv/bin/ninja", ("wheel",), None, "could not be run")
    with pytest.raises(ninja.NinjaError, match="pip install --force-reinstall ninja"):
        ninja.choose(found=[broken])


def test_an_import_failure_under_the_guard_ends_with_the_fix():
    msg = refusals.import_failure(RuntimeError("nvcc not found"),
                                 {"mode": "guard", "resolution": {"fix": "pip install 'cuda-toolkit[nvcc]'"}})
    assert msg.endswith("Fix: pip install 'cuda-toolkit[nvcc]'")
    assert refusals.import_failure(ValueError("x"), {"mode": "patched"}) == "importing FlashInfer failed: ValueError('x')"
    # P8: FlashInfer's import hitting this process's open-file limit names the limit, not a toolkit to install
    emfile = refusals.import_failure(OSError(errno.EMFILE, "Too many open files"),
                                     {"mode": "failed", "resolution": {"fix": "pip install 'cuda-toolkit[nvcc]'"}})
    assert "ulimit -n" in emfile and "pip install" not in emfile, emfile


def test_a_mistyped_option_does_not_call_a_module_unrecognized(capsys):
    with pytest.raises(SystemExit):
        main(["build", "--headdim", "128", "--arch", "12.0", "decode"])
    err = capsys.readouterr().err
    assert "unrecognized arguments: --headdim;" in err and "did you mean --head-dim?" in err
    assert "decode" not in err.split("unrecognized arguments:")[1]
