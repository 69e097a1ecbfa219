"""``flashinfer-sm120 doctor``: a verdict on the first line and an exit status to match, one screen by
default (everything under --verbose and --json), typed findings, --arch."""

import json
import logging
import re

import pytest

from helpers.child import cli
from helpers.host import needs_flashinfer
from helpers.reports import doctor_report
from helpers.probing import NOBODY, created, home_env, needs_root, user_home
from flashinfer_sm120.cli import doctor, main
from flashinfer_sm120.cli.doctor import WIDTH
from flashinfer_sm120.diagnose.verify import diagnosis
from flashinfer_sm120.diagnose.verify.diagnosis import CHECKS, Finding, Level, diagnose

#: Words of the code base a user must not meet in the default report.
INTERNAL = ("CompilationContext", "_normalize_cuda_arch", "era sm120", "TARGET_CUDA_ARCHS", "patched_modules")


def _screen(text: str) -> list[str]:
    """One screen: the verdict whole on line 1; later lines over WIDTH only to hold one long value whole."""
    lines = text.splitlines()
    assert len(lines) <= doctor.SHORT_LINES, f"{len(lines)} lines:\n{text}"
    assert not [ln for ln in lines[1:] if len(ln) > WIDTH and len(ln.split()) > 1], text
    pointer = re.compile(r"^\.\.\. \d+ more findings?: --verbose$")  # findings that did not fit: named, not cut
    assert "..." not in "\n".join(ln for ln in lines if not pointer.match(ln)), text  # nothing cut
    assert not [w for w in INTERNAL if w in text], text
    return lines


@needs_flashinfer
def test_doctor_says_ok_first_and_fits_one_screen(clean_env, real_nvcc13):
    """58 lines, six over 200 characters, internal names on line 2, and no verdict."""
    proc = cli(["doctor", "--arch", "12.0", "--timeout", "60"], clean_env)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    lines = _screen(proc.stdout)
    assert lines[0].startswith("OK: FlashInfer will build sm_120f with nvcc 13."), lines[0]
    assert "Targets: sm_120f (from --arch 12.0)" in lines
    alone = [ln for ln in lines if ln.startswith("FlashInfer alone: ")]
    assert len(alone) == 1 and alone[0].startswith(("FlashInfer alone: would work", "FlashInfer alone: would fail because"))
    assert lines[-1].startswith("More: flashinfer-sm120 doctor --verbose")


@pytest.mark.slow  # a real doctor run, like the one above
@needs_flashinfer
def test_doctor_with_a_long_workspace_and_cache_keeps_every_path_whole(clean_env, real_nvcc13, tmp_path):
    """Issue 29: the JIT dir, the toolkit and FlashInfer's error were cut in the middle to fit 120 columns."""
    deep = tmp_path.joinpath(*["a-workspace-with-a-long-name"] * 6)
    env = dict(clean_env, FLASHINFER_WORKSPACE_BASE=str(deep / "ws"), FLASHINFER_SM120_CACHE_DIR=str(deep / "c"))
    proc = cli(["doctor", "--arch", "12.0", "--timeout", "60"], env)
    assert proc.returncode == 0 and len(str(deep)) > 150, proc.stdout + proc.stderr[-2000:]
    lines = _screen(proc.stdout)
    assert lines[0].startswith("OK: FlashInfer will build sm_120f with nvcc 13."), lines[0]
    jit = [w for w in proc.stdout.split() if w.startswith(str(deep / "ws"))]
    assert jit and jit[0].endswith("/cached_ops"), proc.stdout


@pytest.mark.slow  # over 4 s in the quick run (--durations, 2026-12-02)
@needs_flashinfer
def test_doctor_without_targets_says_problem_and_the_fix_and_exits_1(clean_env, real_nvcc13):
    proc = cli(["doctor", "--timeout", "60"], clean_env)
    assert proc.returncode == 1, proc.stdout + proc.stderr[-2000:]
    lines = _screen(proc.stdout)
    assert lines[0].startswith("PROBLEM: no targets: no GPU visible and no FLASHINFER_CUDA_ARCH_LIST")
    assert f"Fix: {diagnosis.NO_TARGETS_FIX}" in " ".join(" ".join(lines[:3]).split())
    verbose = cli(["doctor", "--verbose", "--timeout", "60"], clean_env)
    assert verbose.returncode == 1 and verbose.stdout.splitlines()[0] == lines[0]
    assert len(verbose.stdout.splitlines()) > len(lines) and "\n  \"candidates\": [" in verbose.stdout


def test_a_bad_arch_is_refused_naming_the_value(capsys):
    assert main(["doctor", "--arch", "12.x"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("flashinfer-sm120: error: ") and "12.x" in err


def test_a_new_check_is_one_line_and_its_warning_is_printed(monkeypatch):
    """How other checks add a doctor line: a function yielding typed findings, appended to CHECKS."""
    def jit_verbose(report):
        yield Finding(Level.WARNING, "jit-verbose", "FLASHINFER_JIT_VERBOSE=1 changes every build line",
                      "unset FLASHINFER_JIT_VERBOSE")

    monkeypatch.setattr(diagnosis, "CHECKS", [*CHECKS, jit_verbose])
    lines = doctor.render(doctor_report())
    assert lines[0].startswith("OK: FlashInfer will build sm_120f with nvcc 13.0.88 at /opt/cu13")
    assert ("WARNING: FLASHINFER_JIT_VERBOSE=1 changes every build line. Fix: unset FLASHINFER_JIT_VERBOSE"
            in lines)

    def broken(report):
        yield Finding(Level.PROBLEM, "x", "something fails", "do this")

    monkeypatch.setattr(diagnosis, "CHECKS", [*CHECKS, broken])
    d = diagnose(doctor_report())
    assert not d.ok and d.problems[0].code == "x"
    assert doctor.render(doctor_report())[0] == "PROBLEM: something fails. Fix: do this"

    def on_lines(report):
        yield Finding(Level.PROBLEM, "y", "no toolkit fits:\n  /opt/cuda: nvcc 12.8 is too old", "pip install nvidia-cuda-nvcc")

    monkeypatch.setattr(diagnosis, "CHECKS", [on_lines])
    assert doctor.render(doctor_report())[0] == ("PROBLEM: no toolkit fits: /opt/cuda: nvcc 12.8 is too old. "
                                           "Fix: pip install nvidia-cuda-nvcc")


NOPE = {"variable": "CUDA_HOME", "value": "/opt/nope", "why": "directory does not exist; the toolkit was chosen as if it "
        "were unset", "fix": "unset CUDA_HOME or point it at a toolkit prefix (the directory above bin/nvcc)"}


def test_a_refused_toolkit_setting_is_on_the_verdict_line(monkeypatch):
    """CUDA_HOME=/opt/nope: doctor said OK with '1 refused' in its details; worked around, so OK (exit 0, as a
    cleaned CUDA_HOME), but the first line names the variable, its value, why and the fix (P8)."""
    for verbose in (False, True):
        lines = doctor.render(doctor_report(settings=[NOPE]), verbose=verbose)
        assert lines[0].startswith("OK: FlashInfer will build sm_120f") and "CUDA_HOME='/opt/nope'" in lines[0], lines
        assert NOPE["why"] in lines[0] and f"Fix: {NOPE['fix']}" in lines[0], lines
        assert sum("'/opt/nope'" in ln for ln in lines) == 1, lines  # said once (--verbose: the report has its fields)
    assert diagnose(doctor_report(settings=[NOPE])).ok
    lines = doctor.render(doctor_report(settings=[NOPE], before={}, resolution=None, resolution_error="boom"))
    assert lines[0] == "PROBLEM: boom" and lines[1].startswith("WARNING: CUDA_HOME='/opt/nope'"), lines  # then it
    assert lines[1].endswith(f"Fix: {NOPE['fix']}"), lines


def test_a_raising_check_is_a_note_and_the_rest_still_run(monkeypatch):
    def bad(report):
        raise KeyError("x")
        yield  # pragma: no cover

    monkeypatch.setattr(diagnosis, "CHECKS", [bad, *CHECKS])
    d = diagnose(doctor_report())
    assert d.ok and [f.code for f in d.findings] == ["check-error"]


@pytest.mark.parametrize("over, works, why", [
    ({}, True, "with /opt/cu13 (nvcc 13.0), for sm_120f"),
    ({"before": {"error": "RuntimeError('boom')"}}, False, "its own import or toolkit lookup failed"),
    ({"before": {"error": "not run: x", "skipped": "x"}}, None, "not checked: x"),
    ({"before": {"cuda_home": "/opt/cu13", "cuda_version": "13.0", "target_cuda_archs": []}}, False,
     "it targets nothing"),
])
def test_flashinfer_alone_says_would_work_or_would_fail_because(over, works, why, tmp_path):
    r = doctor_report(**over)
    if "cuda_home" in r["before"]:  # a complete toolkit where FlashInfer alone looks
        _complete_home(tmp_path)
        r["before"]["cuda_home"] = str(tmp_path)
        why = why.replace("/opt/cu13", str(tmp_path))
    a = diagnosis.alone(r)
    assert a.works is works and a.why.startswith(why), a
    said = {True: f"FlashInfer alone: would work, {a.why}", False: f"FlashInfer alone: would fail because "
            f"{a.why}", None: f"FlashInfer alone: {a.why}"}[works]
    assert " ".join(said.split()) in " ".join(" ".join(doctor.render(r)).split())  # whole, maybe wrapped


def _complete_home(root):
    """What FlashInfer's build lines need from CUDA_HOME (core.view.meta.REQUIRED and curand.h), as empty files."""
    from flashinfer_sm120.core.view.meta import REQUIRED

    for rel in (*REQUIRED, "include/curand.h"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("")


@pytest.mark.parametrize("drop", ["lib64/libcudart.so", "lib64/stubs/libcuda.so", "include/curand.h"])
def test_flashinfer_alone_with_a_home_it_cannot_link_with_would_fail_naming_what_is_missing(tmp_path, drop):
    """A wrapper at /usr/local/bin/nvcc makes FlashInfer alone use CUDA_HOME=/usr/local, where neither
    lib64/libcudart.so nor the stub is: its link fails (-L$cuda_home/lib64 -lcudart -lcuda), so doctor
    must not say it would work (it did, while the import kept that nvcc in a view)."""
    _complete_home(tmp_path)
    (tmp_path / drop).unlink()
    r = doctor_report(before={"cuda_home": str(tmp_path), "cuda_version": "13.0", "target_cuda_archs": ["sm_120f"]})
    a = diagnosis.alone(r)
    assert a.works is False and f"which lacks {drop} " in a.why, a
    assert f"FlashInfer alone: would fail because it would use {tmp_path}" in " ".join(" ".join(doctor.render(r)).split())


def test_flashinfer_alone_with_a_refused_toolkit_would_fail_with_the_reason(tmp_path):
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "nvcc").write_text("")
    r = doctor_report(before={"cuda_home": str(tmp_path), "cuda_version": "12.8", "target_cuda_archs": ["sm_120a"]})
    r["candidates"].append({"root": str(tmp_path), "sources": ["CUDA_HOME"], "state": "rejected",
                            "why": "nvcc 12.8 cannot build sm_120f"})
    a = diagnosis.alone(r)
    assert a.works is False and a.why.endswith("nvcc 12.8 cannot build sm_120f")


def test_long_paths_are_never_cut_and_the_verdict_is_one_whole_line():
    """Issue 29: paths were cut in the middle (``flashinfer-sm1...ib/python3.11``, ``site-p...dia/cu13``,
    ``(...dError(``) and a long interpreter path wrapped the verdict's fix onto line 2."""
    deep = "/" + "/".join(["a-checkout-with-a-long-name"] * 7)  # 196 characters
    root = f"{deep}/.venv/lib/python3.11/site-packages/nvidia/cu13"
    tk = {"root": root, "nvcc": f"{root}/bin/nvcc", "sources": ["pip"], "nvcc_full": "13.5.37"}
    base = doctor_report()
    r = doctor_report(candidates=[dict(base["candidates"][0], **tk)],
                resolution=dict(base["resolution"], choice=dict(base["resolution"]["choice"], toolkit=tk)),
                after=dict(base["after"], jit_dir=f"{deep}/cache/0.7.4/120f/nvcc13.5.37/cached_ops"),
                before={"error": "ModuleNotFoundError(\"No module named 'flashinfer'\")"})
    lines = _screen("\n".join(doctor.render(r)))
    assert lines[0] == f"OK: FlashInfer will build sm_120f with nvcc 13.5.37 at {root}"
    words = " ".join(lines[1:]).split()
    assert root in words and r["after"]["jit_dir"] in words
    assert "(ModuleNotFoundError(\"No" in words and "'flashinfer'\"))" in words
    python = f"{deep}/.venv/bin/python"
    r = doctor_report(flashinfer_installed=False, flashinfer=None, python=python)
    lines = _screen("\n".join(doctor.render(r)))
    assert lines[0] == f"PROBLEM: FlashInfer is not installed for {python}. Fix: pip install flashinfer-python"


def test_help_has_a_description_and_the_exit_codes(capsys):
    with pytest.raises(SystemExit):
        main(["doctor", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "the first line is OK or PROBLEM with the fix" in text
    for code in doctor.EXIT_CODES:
        assert f"{code}: " in text
    assert "--verbose" in text and "--arch" in text


def _with_build_line(report: dict) -> dict:
    """``report`` with its build-line section as doctor collects it (from this process's environment)."""
    from flashinfer_sm120.diagnose.verify.report import build_line_section

    report["build_line"] = build_line_section(report)
    return report


def test_a_build_line_variable_and_modules_warmed_with_other_values_are_warnings_on_the_default_screen(
        monkeypatch, tmp_path):
    """A build-line variable set (FLASHINFER_JIT_VERBOSE=1) and the modules it makes rebuild are warnings on
    doctor's default screen, not shown under --verbose only (P8)."""
    from flashinfer_sm120.core.facts import buildline

    for v in buildline.BUILD_VARS:
        monkeypatch.delenv(v.name, raising=False)
    jit = tmp_path / "jit"
    (jit / "sampling").mkdir(parents=True)
    assert buildline.record(jit / "sampling", buildline.snapshot({}, "0.7.4")) is None  # warmed with nothing set
    monkeypatch.setenv("FLASHINFER_JIT_VERBOSE", "1")
    report = _with_build_line(doctor_report(after={"status": {"mode": "patched", "steps": {}}, "jit_dir": str(jit),
                                             "exported": {}}))
    d = diagnose(report)
    assert d.ok and {"build-line-variable", "build-line-stale"} <= {f.code for f in d.findings}
    lines = _screen("\n".join(doctor.render(report)))
    text = " ".join(" ".join(lines).split())
    assert "WARNING: FLASHINFER_JIT_VERBOSE=1 changes every build line" in text
    assert ("debug flags -O0 -g --device-debug -lineinfo --ptxas-options=-v -DCUTLASS_DEBUG_TRACE_LEVEL=2 on every "
            "CUDA compile line (-O0 -g on C++ lines), dropping -DNDEBUG -O3") in text  # FlashInfer 0.7.4's whole list
    assert "the warm cache will be rebuilt" in text
    assert "WARNING: 1 built module was built with other values of FLASHINFER_JIT_VERBOSE" in text
    monkeypatch.delenv("FLASHINFER_JIT_VERBOSE")
    assert not {f.code for f in diagnose(_with_build_line(doctor_report())).findings} & {"build-line-variable"}


def test_a_toolkit_whose_version_file_disagrees_with_its_nvcc_is_a_warning_with_the_fix(tmp_path, cache_dir):
    """A toolkit whose version.json disagrees with its nvcc is a warning with the fix on doctor's screen, not
    in ``doctor --json`` only (P1)."""
    from flashinfer_sm120.core.toolkit.probe import inspect
    from helpers.toolkits import lying_toolkit

    lying = inspect(str(lying_toolkit(tmp_path / "cuda"))).to_dict()
    chosen = doctor_report()["candidates"][0]
    report = doctor_report(candidates=[chosen, dict(lying, state="rejected", why="nvcc 12.8")])
    found = [f for f in diagnose(report).findings if f.code == "version-disagreement"]
    assert len(found) == 1 and found[0].level is Level.WARNING
    assert "says CUDA 13.0.88" in found[0].text and "12.8.93" in found[0].text and "reinstall" in found[0].fix
    screen = " ".join(_screen("\n".join(doctor.render(report))))
    assert "WARNING: " in screen and "says CUDA 13.0.88, but" in screen and "Fix: reinstall that toolkit" in screen
    assert not [f for f in diagnose(doctor_report()).findings if f.code == "version-disagreement"]


def test_sglangs_own_targets_are_a_note_on_the_default_screen(tmp_path, monkeypatch):
    """SGLang's set_cuda_arch() sets 12.0a in its model processes: said on the default screen, not only --verbose."""
    import importlib

    from helpers.servers import install_standins

    for v in ("FLASHINFER_JIT_VERBOSE", "SGLANG_IS_FLASHINFER_AVAILABLE"):
        monkeypatch.delenv(v, raising=False)
    monkeypatch.syspath_prepend(str(install_standins(tmp_path / "site", "sglang")))
    importlib.invalidate_caches()
    base = doctor_report()
    base["resolution"]["choice"]["capabilities"] = ["12.0"]
    report = _with_build_line(base)
    notes = [f for f in diagnose(report).findings if f.code == "server-arch"]
    assert len(notes) == 1 and notes[0].level is Level.NOTE
    assert notes[0].text.startswith("SGLang will build for sm_120a (its ") and "set_cuda_arch" in notes[0].text
    assert any(ln.startswith("NOTE: SGLang will build for sm_120a") for ln in _screen("\n".join(doctor.render(report))))


@needs_root
def test_doctor_as_root_with_a_users_home_refuses_to_import_flashinfer_there(shared_tmp):
    """doctor as root with a user's HOME (sudo -E) refuses to import FlashInfer there, itself or in the
    FlashInfer-alone child, so no root-owned ~/.cache/flashinfer is made in that home; it asks first, as
    status does, and says the fix (P4)."""
    home = user_home(shared_tmp)
    env = home_env(home, shared_tmp / "tmp")
    env.pop("FLASHINFER_WORKSPACE_BASE", None)
    proc = cli(["doctor", "--json", "--arch", "12.0", "--timeout", "60"], env, timeout=300)
    assert proc.returncode == 1 and created(home) == [], proc.stderr[-2000:]
    first = json.loads(proc.stdout)["diagnosis"]["findings"][0]
    assert first["level"] == "problem" and first["code"] == "workspace-foreign-tree"
    assert str(home) in first["text"] and "sudo -H" in first["fix"] and "FLASHINFER_WORKSPACE_BASE" in first["fix"]
    text = cli(["doctor", "--arch", "12.0", "--timeout", "60"], env, timeout=300)
    assert text.returncode == 1 and created(home) == []
    assert text.stdout.startswith("PROBLEM: FlashInfer was not imported: its JIT cache"), text.stdout[:500]


@needs_root
def test_root_with_a_users_home_whose_cache_exists_imports_nothing_there(shared_tmp):
    """With the user's ``~/.cache/flashinfer/<version>/<arch>`` already there, ``doctor`` and ``build`` as
    root (``sudo -E``) do not import FlashInfer, which would leave a root-owned ``flashinfer_jit.log`` in it;
    and the refusal's fix never offers the user's home as "a directory of your own" (P4, P8)."""
    import os
    import pwd

    home = user_home(shared_tmp)
    level = home / ".cache" / "flashinfer" / "0.7.4" / "120f"
    level.mkdir(parents=True)
    for d in (home / ".cache", home / ".cache" / "flashinfer", level.parent, level):
        os.chown(d, NOBODY, NOBODY)
    env = home_env(home, shared_tmp / "tmp")
    env.pop("FLASHINFER_WORKSPACE_BASE", None)
    ours = pwd.getpwuid(0).pw_dir
    proc = cli(["doctor", "--json", "--arch", "12.0", "--timeout", "60"], env, timeout=300)
    first = json.loads(proc.stdout)["diagnosis"]["findings"][0]
    assert proc.returncode == 1 and first["code"] == "workspace-not-ours", first
    assert f"for example {ours}" in first["fix"] and "sudo -H" in first["fix"] and str(home) not in first["fix"]
    build = cli(["build", "--json", "--arch", "12.0", "--ninja-only", "activation"], env, timeout=300)
    assert build.returncode != 0 and "FlashInfer was not imported" in json.loads(build.stdout)["error"]
    assert [p for p in created(home) if os.lstat(p).st_uid != NOBODY] == []


def test_the_report_says_which_servers_jit_directory_it_used():
    """The servers' JIT directories differ (``apply_server_cache`` chose none): read from the data, not its wording."""
    differ = {"server": None, "why": "vLLM and SGLang are installed here and use different directories", "base": None,
              "how": "", "before": None, "changed": False}
    (note,) = [f for f in diagnose(doctor_report(server_cache=differ)).findings if f.code == "server-cache"]
    assert note.level is Level.NOTE and differ["why"] in note.text and "build --for vllm|sglang" in note.fix
    assert not [f for f in diagnose(doctor_report(server_cache={})).findings if f.code == "server-cache"]
    moved = dict(differ, server="sglang", why="sglang is installed here", base="/s", how="SGLANG_CACHE_DIR", changed=True)
    (note,) = [f for f in diagnose(doctor_report(server_cache=moved)).findings if f.code == "server-cache"]
    assert "sglang's FLASHINFER_WORKSPACE_BASE=/s" in note.text


def test_verbose_prints_the_whole_report_as_json_holds_it():
    """--verbose ends with the --json data (one report, P7): every value, a multi-line message whole."""
    r = doctor_report(autoload={}, servers={"servers": [{"label": "vLLM 0.33.0", "without": [False, "no ninja"]}]},
                      resolution_error="no toolkit fits:\n  /opt/cuda: nvcc 12.8 is too old")
    lines = doctor.render(r, verbose=True)
    at = lines.index("The whole report, as doctor --json prints it:")
    assert lines[0] == doctor.render(r)[0] and any(ln.startswith("FlashInfer alone: ") for ln in lines[:at])
    assert json.loads("\n".join(lines[at + 1:])) == json.loads(json.dumps(r, default=str))


@pytest.mark.parametrize("autoload", [False, True])
def test_a_second_ninja_gets_advice_that_fits_whether_the_autoload_is_enabled(autoload):
    """With the autoload enabled, the ninja warning still said to run 'flashinfer-sm120 enable', on the line
    after 'Autoload: enabled'."""
    conflict = {"path": "/usr/bin/ninja", "version": "1.11.1", "log_format": 5}
    ninja = {"chosen": {"path": "/venv/bin/ninja", "version": "1.13.2", "log_format": 7},
             "conflicts": [conflict]}
    auto = {"pth": ["/venv/site/flashinfer_sm120_autoload.pth"]} if autoload else {}
    text = " ".join("\n".join(_screen("\n".join(doctor.render(doctor_report(ninja=ninja, autoload=auto))))).split())
    assert "WARNING: /usr/bin/ninja (ninja 1.11.1, .ninja_log v5) is reachable too" in text
    assert ("'flashinfer-sm120 enable'" in text) is not autoload, text
    if autoload:
        assert "Autoload: enabled" in text and "the autoload puts it first on PATH" in text
        assert "remove the other ninja (e.g. apt-get remove ninja-build) or put /venv/bin first on its PATH" in text


def _doctor_in_process(monkeypatch, capsys, *argv, tty=False, report=None):
    """``main(["doctor", ...])`` on a report built by hand: (exit status, stdout, stderr)."""
    def collect(timeout, *, say=None, **_):
        if say is not None:
            say(f"(asking unpatched FlashInfer in a child process, up to {timeout:g} s ...)")
        logged.append(logging.getLogger("flashinfer_sm120").isEnabledFor(logging.ERROR))  # the guard's line
        return report or doctor_report()

    logged: list[bool] = []

    monkeypatch.setenv("FLASHINFER_SM120_QUIET", "")  # doctor sets it for its own process: restored after
    monkeypatch.setattr(doctor, "collect", collect)
    monkeypatch.setattr("sys.stderr.isatty", lambda: tty)
    rc = main(["doctor", *argv])
    out, err = capsys.readouterr()
    assert logged == [False] and logging.getLogger("flashinfer_sm120").isEnabledFor(logging.ERROR)
    return rc, out, err


def test_the_verdict_comes_first_and_the_last_line_ends_with_a_newline(monkeypatch, capsys):
    """doctor's progress note and the guard's log line on stderr came before the verdict (2>&1, a log
    file): the note is shown on a terminal only, and erased before the report; the report says the rest."""
    rc, out, err = _doctor_in_process(monkeypatch, capsys, "--arch", "12.0")
    assert rc == 0 and out.startswith("OK: FlashInfer will build") and out.endswith("\n") and err == ""
    rc, out, err = _doctor_in_process(monkeypatch, capsys, "--arch", "12.0", "--timeout", "7", tty=True)
    assert err == "(asking unpatched FlashInfer in a child process, up to 7 s ...)\r\x1b[K"


def test_without_targets_doctor_says_there_is_no_jit_dir_and_why(monkeypatch, capsys):
    """Without --arch, doctor showed a JIT dir without the targets' part (120f), which no build uses."""
    report = doctor_report()
    report["resolution"]["choice"]["targets"] = []
    report["after"]["jit_dir"] = "/ws/.cache/flashinfer/0.7.4/nvcc13.0.88-abcd/cached_ops"
    lines = _screen("\n".join(doctor.render(report)))
    assert "With flashinfer-sm120: patched; no JIT dir: it is named after the targets, and there are none" in lines
    assert "nvcc13.0.88-abcd" not in "\n".join(lines)


def test_flashinfer_alone_killed_for_flooding_says_so_and_the_fix(monkeypatch, tmp_path):
    """An nvcc flooding its output made the FlashInfer-alone line 'exit -9: ' and nothing else."""
    from helpers.toolkits import make_toolkit
    from flashinfer_sm120.diagnose.verify import report
    from flashinfer_sm120.safety import proc

    root = make_toolkit(tmp_path / "cuda", "13.0.88")
    monkeypatch.setattr(report, "_ORIGINAL_ENV", {"CUDA_HOME": str(root)})
    monkeypatch.setattr(proc, "run", lambda *a, **k: proc.Result(-9, b"\x00" * 100 + b"x" * 1000, False, True, 1.0))
    before = report._flashinfer_alone(5)
    why = diagnosis.alone(doctor_report(before=before)).why
    assert "killed after printing more than 1 MiB" in why and f"run '{root}/bin/nvcc --version'" in why, why
    assert "fix or remove that toolkit" in why and "exit -9" not in why


def test_without_the_autoload_where_flashinfer_alone_fails_the_ok_line_warns_with_the_fix(tmp_path):
    """After 'disable', doctor said OK with no warning while its details said 'FlashInfer alone: would fail'
    and 'Autoload: not enabled': a server that does not import flashinfer_sm120 itself would fail."""
    off = doctor_report(autoload={})  # FlashInfer alone finds no nvcc at /opt/cu13
    assert diagnosis.alone(off).works is False
    d = diagnose(off)
    lines = doctor.render(off)
    assert d.ok and lines[0].startswith("OK: FlashInfer will build sm_120f") and "flashinfer-sm120 enable" in lines[0]
    assert "autoload-off" in [f.code for f in d.findings]
    assert "flashinfer-sm120 enable" not in doctor.render(doctor_report())[0]  # enabled: nothing to say
    _complete_home(tmp_path)
    works = doctor_report(autoload={}, before={"cuda_home": str(tmp_path), "cuda_version": "13.0",
                                               "target_cuda_archs": ["sm_120f"]})
    assert "autoload-off" not in [f.code for f in diagnose(works).findings]  # FlashInfer alone works: no warning


def test_a_report_on_another_environment_than_the_activated_one_says_so_with_the_fix():
    """venvA's flashinfer-sm120 run with venvB activated reported venvA without a word."""
    other = doctor_report(prefix="/venvA", virtual_env="/venvB")
    d = diagnose(other)
    (f,) = [f for f in d.findings if f.code == "other-env"]
    assert d.ok and "/venvA" in f.text and "/venvB" in f.text and "/venvB/bin/flashinfer-sm120" in f.fix
    assert "/venvB/bin/flashinfer-sm120" in doctor.render(other)[0]
    assert "other-env" not in [f.code for f in diagnose(doctor_report(prefix="/venvA", virtual_env="/venvA")).findings]
    assert "other-env" not in [f.code for f in diagnose(doctor_report(prefix="/venvA", virtual_env=None)).findings]


def test_doctor_names_each_refused_toolkit_and_why():
    """"1 more usable, 1 refused" named neither: an old nvcc first on PATH moved the choice with no word of it (P8)."""
    old = {"root": "/opt/cuda-12.4", "nvcc": "/opt/cuda-12.4/bin/nvcc", "sources": ["PATH"], "nvcc_full": "12.4.131",
           "state": "rejected", "why": "nvcc 12.4 cannot build sm_120f (needs 12.9)"}
    r = doctor_report()
    r["candidates"].append(old)
    lines = "\n".join(doctor.render(r))
    assert "refused: nvcc 12.4.131 at '/opt/cuda-12.4' (PATH): nvcc 12.4 cannot build sm_120f" in lines, lines
