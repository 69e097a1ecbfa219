"""``flashinfer-sm120 status``: answered from what the last resolution recorded (no torch, no
FlashInfer import) while nothing it was made from changed; exit 1 when nothing can be built."""

import json
import os
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers.host import needs_flashinfer
from helpers.toolkits import script
from flashinfer_sm120.cli import main, status
from flashinfer_sm120.core.patch import laststatus

#: ``status`` in a new interpreter (not the fork server, which has torch loaded already), reporting
#: which of torch and FlashInfer it imported.
_STATUS = ("import sys\nfrom flashinfer_sm120.cli import main\nrc = main(sys.argv[1:])\n"
           "print('@@loaded', sorted({m.partition('.')[0] for m in sys.modules} & {'torch', 'flashinfer'}))\n"
           "sys.exit(rc)\n")


def _status(env, *args):
    proc = subprocess.run([sys.executable, "-c", _STATUS, "status", *args], env=env, capture_output=True,
                          text=True, timeout=600)
    out, _, loaded = proc.stdout.rpartition("@@loaded ")
    return proc, out, loaded.strip()


@pytest.mark.slow  # over 4 s in the quick run (--durations, 2026-12-02)
@needs_flashinfer
def test_a_second_status_reads_the_record_without_importing_torch_or_flashinfer(clean_env, real_nvcc13):
    """``status`` took 8-20 s for one line: it imported torch and FlashInfer every time."""
    env = dict(clean_env)
    first, line, loaded = _status(env, "--arch", "12.0")
    assert first.returncode == 0, first.stderr[-3000:]
    assert "no usable record (nothing recorded yet" in first.stderr and loaded == "['flashinfer', 'torch']"
    again, line2, loaded2 = _status(env, "--arch", "12.0")
    assert again.returncode == 0 and line2 == line and line.rstrip().endswith("; targets sm_120f")
    assert loaded2 == "[]" and "importing FlashInfer" not in again.stderr, again.stderr
    as_json, out, _ = _status(env, "--arch", "12.0", "--json")
    st_ = json.loads(out)
    assert st_["source"] == "record" and st_["targets"] == ["sm_120f"] and st_["mode"] in ("patched", "noop")
    # another input (the targets): the record does not hold, and says why
    other, line3, loaded3 = _status(env, "--arch", "12.1")
    assert "FLASHINFER_CUDA_ARCH_LIST changed from '12.0' to '12.1'" in other.stderr, other.stderr
    assert loaded3 == "['flashinfer', 'torch']" and line3.rstrip().endswith("; targets sm_121a")
    # each target set keeps its answer: alternating them reads the records (issue 29 item 3)
    for arch, target in (("12.0", "sm_120f"), ("12.1", "sm_121a")):
        proc, line4, loaded4 = _status(env, "--arch", arch)
        assert loaded4 == "[]" and line4.rstrip().endswith(f"; targets {target}"), proc.stderr
    fresh, _, loaded4 = _status(env, "--arch", "12.1", "--fresh")
    assert fresh.returncode == 0 and loaded4 == "['flashinfer', 'torch']"


@pytest.mark.slow  # over 4 s in the quick run (--durations, 2026-12-02)
@needs_flashinfer
def test_a_package_installed_since_invalidates_the_record(clean_env, real_nvcc13, tmp_path):
    """A ``pip install`` adds or removes a ``.dist-info`` on ``sys.path``: a record made before it
    may no longer hold (another FlashInfer, torch or nvcc wheel)."""
    site = tmp_path / "site"
    site.mkdir()
    env = dict(clean_env, PYTHONPATH=f"{site}:{clean_env['PYTHONPATH']}")
    assert _status(env, "--arch", "12.0")[0].returncode == 0
    assert _status(env, "--arch", "12.0")[2] == "[]"
    (site / "newpkg-1.0.dist-info").mkdir()
    proc, _, loaded = _status(env, "--arch", "12.0")
    assert f"'{site}' changed (a package installed or removed)" in proc.stderr, proc.stderr
    assert loaded == "['flashinfer', 'torch']"


@needs_flashinfer
def test_no_targets_exits_1_from_both_paths(clean_env, real_nvcc13):
    """No GPU and no arch list printed ``patched: ...; targets none`` and exited 0, so a CI gate passed
    a set-up whose first JIT build fails."""
    for source in ("import", "record"):
        proc, line, loaded = _status(clean_env)
        assert proc.returncode == 1, (source, proc.stderr[-2000:])
        assert "targets none, nothing can be built" in line and "doctor --arch 12.0" in line
        assert (loaded == "[]") == (source == "record")
    proc, out, _ = _status(clean_env, "--json")  # the document says it too, not only the exit status
    doc = json.loads(out)
    assert proc.returncode == 1 and doc["ok"] is False and "nothing can be built" in doc["error"], out


@pytest.mark.slow  # two FlashInfer imports
@needs_flashinfer
@pytest.mark.parametrize("var, value", [("CUDA_HOME", "/opt/nope"), ("FLASHINFER_NVCC", "/opt/nope/bin/nvcc")])
def test_a_setting_naming_no_toolkit_changes_no_choice_and_is_told(clean_env, var, value):
    """CUDA_HOME=/opt/nope moved the choice from the system CUDA 13.0 (FlashInfer's own, via PATH) to pip's 13.5
    (another JIT directory, every module rebuilt), and status said nothing of it (P1, P8)."""
    docs = []
    for env in (clean_env, dict(clean_env, **{var: value})):
        proc, out, _ = _status(env, "--arch", "12.0", "--json", "--fresh")
        docs.append(json.loads(out))
    assert docs[1]["toolkit"] == docs[0]["toolkit"], docs
    (note,) = docs[1]["resolution"]["settings"]
    assert (note["variable"], note["value"]) == (var, value) and note["fix"].startswith(f"unset {var} or "), note
    proc, line, _ = _status(dict(clean_env, **{var: value}), "--arch", "12.0")
    assert f"{var}='{value}' " in line and f"Fix: {note['fix']}" in line, line
    assert proc.returncode == (0 if docs[0]["ok"] else 1), line  # the exit status as without it
    proc, out, _ = _status(dict(clean_env, **{var: value}), "--arch", "12.0", "--json")  # the record says the same
    assert json.loads(out)["source"] == "record" and json.loads(out)["settings"] == [note], out


def test_exit_codes_follow_what_can_be_built():
    tk = {"nvcc_full": "13.0.88", "root": "/tk", "nvcc": "/tk/bin/nvcc"}
    assert status.exit_code({"mode": "patched", "toolkit": tk, "targets": ["sm_120f"]}) == 0
    assert status.exit_code({"mode": "noop", "toolkit": tk, "targets": ["sm_120f"]}) == 0
    assert status.exit_code({"mode": "patched", "toolkit": tk, "targets": []}) == 1
    for mode in ("guard", "failed", "disabled", "not installed", "reverted", "idle"):
        assert status.exit_code({"mode": mode, "toolkit": None, "targets": []}) == 1


def test_help_documents_the_exit_codes(capsys):
    with pytest.raises(SystemExit):
        main(["status", "--help"])
    text = " ".join(capsys.readouterr().out.split()).replace("- ", "-")  # argparse wraps at hyphens
    for code, meaning in status.EXIT_CODES.items():
        assert f"{code}: {' '.join(meaning.split())}" in text


def test_a_record_from_other_inputs_is_not_used(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHINFER_SM120_CACHE_DIR", str(tmp_path / "c"))
    monkeypatch.setenv("FLASHINFER_CUDA_ARCH_LIST", "12.0")
    rec = dict(mode="patched", error=None, toolkit=None, targets=["sm_120f"], arch_list_error=None, settings=[],
               flashinfer="0.7.4")
    laststatus.save(rec, laststatus.inputs())
    assert status.recorded()[0] == dict(rec)
    monkeypatch.setenv("FLASHINFER_CUDA_ARCH_LIST", "12.1")
    got, why = status.recorded()
    assert got is None and "FLASHINFER_CUDA_ARCH_LIST changed from '12.0' to '12.1'" in why
    other = dict(rec, targets=["sm_121a"])
    laststatus.save(other, laststatus.inputs())  # a second target set: both records are kept
    assert status.recorded()[0] == dict(other)
    monkeypatch.setenv("FLASHINFER_CUDA_ARCH_LIST", "12.0")
    assert status.recorded()[0] == dict(rec)
    monkeypatch.delenv("FLASHINFER_CUDA_ARCH_LIST")
    got, why = status.recorded()
    assert got is None and "FLASHINFER_CUDA_ARCH_LIST changed from '12.1' to unset" in why  # the newest
    monkeypatch.setenv("FLASHINFER_CUDA_ARCH_LIST", "12.0")
    monkeypatch.setenv("SOME_OTHER_SETTING", "1")  # any variable: hashed, never written out
    got, why = status.recorded()
    assert got is None and "an environment variable not named above changed" in why
    assert "SOME_OTHER_SETTING" not in (tmp_path / "c" / laststatus.FILE).read_text()


def test_a_record_does_not_hold_once_cuda_homes_nvcc_is_replaced_or_removed(tmp_path, monkeypatch):
    """Once ``$CUDA_HOME/bin/nvcc`` (a link to pip's nvcc) is replaced by a 12.8 binary, then removed,
    ``status`` no longer says "patched: nvcc 13.5.37", exit 0, from the record: the binary answers (P1)."""
    real = tmp_path / "pip-nvcc"
    real.write_text("#!/bin/sh\n")
    (tmp_path / "tk" / "bin").mkdir(parents=True)
    nvcc = tmp_path / "tk" / "bin" / "nvcc"
    nvcc.symlink_to(real)
    monkeypatch.setenv("FLASHINFER_SM120_CACHE_DIR", str(tmp_path / "c"))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "tk"))
    rec = dict(mode="patched", error=None, toolkit=None, targets=["sm_120f"], arch_list_error=None, settings=[],
               flashinfer="0.7.4")
    laststatus.save(rec, laststatus.inputs())
    assert status.recorded()[0] == dict(rec)
    nvcc.unlink()
    (tmp_path / "old-nvcc").write_text("#!/bin/sh\n")
    nvcc.symlink_to(tmp_path / "old-nvcc")
    got, why = status.recorded()
    assert got is None and f"the nvcc found through CUDA_HOME ('{nvcc}') was replaced" in why, got
    nvcc.unlink()
    got, why = status.recorded()
    assert got is None and "the nvcc found through CUDA_HOME" in why, got


@given(st.text(max_size=300))
def test_arch_option_takes_a_value_or_refuses_it_with_a_bounded_message(value):
    """``--arch`` of status and doctor: build's grammar; anything else exits 2 with one bounded line
    (and, with ``--json``, status's one failure document on stdout)."""
    import io
    from contextlib import redirect_stderr, redirect_stdout

    from flashinfer_sm120.cli.common import apply_arch
    from flashinfer_sm120.errors import UsageError

    saved = __import__("os").environ.get("FLASHINFER_CUDA_ARCH_LIST")
    try:
        try:
            apply_arch(value)
            return
        except UsageError as exc:
            assert str(exc) and exc.fix
        buf, out = io.StringIO(), io.StringIO()
        with redirect_stderr(buf), redirect_stdout(out):
            rc = main(["status", "--arch", value, "--json"]) if value and not value.startswith("-") else 2
        assert rc == 2
        if out.getvalue():
            assert json.loads(out.getvalue())["mode"] == "failed"
        if buf.getvalue():
            assert buf.getvalue().startswith("flashinfer-sm120: error: ") and len(buf.getvalue()) < 8000
    finally:
        import os

        if saved is None:
            os.environ.pop("FLASHINFER_CUDA_ARCH_LIST", None)
        else:
            os.environ["FLASHINFER_CUDA_ARCH_LIST"] = saved


def test_python_and_python3_and_python_m_share_the_record(clean_env, tmp_path):
    """The console script runs ``bin/python3`` with its own directory first on sys.path, ``python -m``
    runs ``bin/python`` with the working directory first: the same set-up, so the same inputs."""
    import os
    from pathlib import Path

    bindir = Path(sys.executable).parent
    code = "import json; from flashinfer_sm120.core.patch.laststatus import inputs; print(json.dumps(inputs()))"
    script = tmp_path / "show_inputs.py"
    script.write_text(code + "\n")
    seen = []
    for exe in ("python", "python3"):
        if not (bindir / exe).exists():
            continue
        for argv in (["-c", code], [str(script)]):
            proc = subprocess.run([str(bindir / exe), *argv], env=clean_env, cwd=tmp_path, capture_output=True,
                                  text=True, timeout=300)
            assert proc.returncode == 0, proc.stderr[-2000:]
            seen.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    assert len(seen) >= 2 and all(s == seen[0] for s in seen), [s["python"] for s in seen]
    assert os.path.realpath(sys.executable) == seen[0]["python"][0]


@pytest.mark.parametrize("case", ["planted gcc on PATH", "workspace link of another uid", "space in the home",
                                  "FLASHINFER_CUBIN_DIR", "FLASHINFER_DSL_FMHA_LOCAL_DIR",
                                  "FLASHINFER_WORKSPACE_BASE's cubins"])
def test_status_says_refused_when_every_build_would_be(clean_env, tmp_path, case):
    """``status --fresh`` says refused, not ``patched`` with exit 0, when ``build`` and every JIT build
    would refuse (a planted gcc on PATH, a workspace base that is another uid's link, a HOME with a space, a
    directory FlashInfer loads ``.so`` files or headers from that others may write, named with its variable) (P8)."""
    from helpers.probing import need_root, reachable_dir

    env = dict(clean_env)
    with reachable_dir() as shared:
        if case == "planted gcc on PATH":
            opened = tmp_path / "open"
            opened.mkdir()
            script(opened / "gcc", "#!/bin/sh\nexec /usr/bin/gcc \"$@\"\n")
            opened.chmod(0o777)
            env["PATH"] = f"{opened}:{env['PATH']}"
            named = f"{opened}/gcc"
        elif case == "workspace link of another uid":
            sticky = shared / "tmp"
            sticky.mkdir()
            sticky.chmod(0o1777)
            mine = tmp_path / "ws"
            mine.mkdir()
            link = sticky / "fi-ws"
            link.symlink_to(mine)
            need_root()
            os.lchown(link, 4321, 4321)  # the link, not its target
            env["FLASHINFER_WORKSPACE_BASE"] = named = str(link)
        elif case == "space in the home":
            home = tmp_path / "my home"
            home.mkdir()
            env["HOME"] = named = str(home)
            env.pop("FLASHINFER_WORKSPACE_BASE", None)
        else:  # P2: FlashInfer loads the .so files checksums.txt lists there, and compiles with -I to it
            var = case.partition("'")[0]
            code = tmp_path / "ws" / ".cache" / "flashinfer" / "cubins" if "cubins" in case else tmp_path / "code"
            code.mkdir(parents=True)
            code.chmod(0o777)
            env[var] = named = str(tmp_path / "ws" if "cubins" in case else code)
        proc, out, loaded = _status(env, "--arch", "12.0", "--fresh", "--json")
    doc = json.loads(out)
    assert proc.returncode == 1 and doc["mode"] == "refused" and not doc["ok"], doc
    assert doc["error"].startswith("FlashInfer was not imported: ") and named in doc["error"], doc["error"]
    if case.startswith("FLASHINFER_"):  # the variable, its value, and the fix names the directory's own variable
        fix = doc["error"].rpartition("Fix: ")[2]
        assert f"{var}={named!r}" in doc["error"] and ("FLASHINFER_CUBIN_DIR" if "cubins" in case else var) in fix
    assert loaded == "[]"  # decided before FlashInfer's import, which creates its cache


@pytest.mark.parametrize("tamper", [{"toolkit": 5}, {"targets": "sm_120f"}, {"mode": ["x"]}, {"mode": "odd"},
                                    {"targets": [7]}, {"error": {"a": 1}}])
def test_a_recorded_status_of_another_shape_is_no_record(tmp_path, monkeypatch, tamper):
    """The record is S2 input: a status body of another shape (a toolkit that is a number, targets that
    are a string) made status fail with a traceback and no JSON, or print 'targets s, m, _, ...'."""
    from flashinfer_sm120.safety.fs import statedir

    monkeypatch.setenv("FLASHINFER_SM120_CACHE_DIR", str(tmp_path / "c"))
    statedir.forget_cache_root()
    good = {"mode": "patched", "error": None, "toolkit": None, "targets": ["sm_120f"], "arch_list_error": None,
            "settings": [], "flashinfer": "0.7.4"}
    where = laststatus.path()
    os.makedirs(os.path.dirname(where), mode=0o700, exist_ok=True)
    for status_, usable in ((good, True), (dict(good, **tamper), False)):
        with open(where, "w") as f:
            json.dump({"schema": laststatus.SCHEMA, "records": [{"inputs": laststatus.inputs(), "status": status_}]}, f)
        os.chmod(where, 0o600)
        got, why = status.recorded()
        assert (got == status_) is usable, got
        assert usable or why, got
    statedir.forget_cache_root()


def test_arch_with_ptx_says_ptx_is_not_built(capsys, monkeypatch):
    """``status --arch 12.0a+PTX`` printed ``targets sm_120a`` only: FlashInfer passes each target as
    ``-gencode=arch=compute_X,code=sm_X``, so no PTX is built, and status, doctor and build say so (P8)."""
    from flashinfer_sm120.cli.common import apply_arch

    monkeypatch.delenv("FLASHINFER_CUDA_ARCH_LIST", raising=False)  # restored after the test
    apply_arch("12.0a+PTX")
    err = capsys.readouterr().err
    assert "'12.0a+PTX' read as 12.0a" in err and "+PTX dropped" in err and "no PTX" in err, err
