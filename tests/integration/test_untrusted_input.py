"""Issue 11: the untrusted-input boundary, one test (or a few) per numbered item.

Each failed on 0.2.0 (3e4d76a) and passes since: the boundary is closed by
construction (allowlists, one validated-format layer in ``formats``), not by
listing the bad cases.  The Hypothesis properties are in
tests/unit/safety/test_input_properties.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from helpers.untrusted import RELEASE_LINE, tmp_is_trusted, toolkit_with_nvcc, untrusted_nvcc
from helpers.child import cli
from helpers.host import needs_flashinfer
from helpers.toolkits import make_toolkit, script
from helpers.probing import OTHER_UID, PY, need_root


# ------------------------------------------------------------------ item 3: what a wrapper names

def _hidden_runs(tmp: Path, evil: Path) -> dict[str, str]:
    """Wrappers that run ``evil`` (an untrusted program) without naming it by absolute path."""
    return {
        "bare name": '#!/bin/sh\nnvcc-real "$@"\n',
        "exec env prog": '#!/bin/sh\nexec env nvcc-real "$@"\n',
        "absolute env prog": '#!/bin/sh\nexec /usr/bin/env nvcc-real "$@"\n',
        "PATH= then bare name": f'#!/bin/sh\nPATH={evil.parent}:$PATH\nexec nvcc "$@"\n',
        "PATH= before an absolute nvcc": f'#!/bin/sh\nPATH={evil.parent}:$PATH; export PATH\n'
                                         f'exec /usr/local/cuda-13.0/bin/nvcc "$@"\n',
        "cd then relative": f'#!/bin/sh\ncd {evil.parent} && exec ./nvcc "$@"\n',
        "variable": f'#!/bin/sh\nNVCC={evil}\nexec $NVCC "$@"\n',
        "lower-case variable": f'#!/bin/sh\nnvcc={evil}\nexec "$nvcc" "$@"\n',
        "eval": f'#!/bin/sh\neval "exec {evil} \\"\\$@\\""\n',
        "source": f'#!/bin/sh\n. {evil}\n',
        "function": f'#!/bin/sh\nf() {{ {evil} "$@"; }}\nf "$@"\n',
        "subshell": f'#!/bin/sh\n( {evil} "$@" )\n',
        "command substitution": '#!/bin/sh\nexec "$(dirname "$0")/nvcc-real" "$@"\n',
        "backquotes": '#!/bin/sh\nexec `which nvcc-real` "$@"\n',
        "env shebang": "#!/usr/bin/env nvcc\n",
        "env -S shebang": f"#!/usr/bin/env -S sh {evil}\n",
        "mid-word # (shlex would hide it)": f'#!/bin/sh\necho a#b; {evil} "$@"\n',
        "comment then newline (shlex would join)": f'#!/bin/sh\necho hi # c\n{evil} "$@"\n',
        "python interpreter": f'#!/usr/bin/python3\nimport os; os.execv("{evil}", ["nvcc"])\n',
        "launcher with a bare name": '#!/bin/sh\nexec /usr/bin/nice nvcc-real "$@"\n',
        "shell -c": f'#!/bin/sh\nexec /bin/sh -c "{evil} $*"\n',
        "here-document": f"#!/bin/sh\n/bin/sh <<EOF\n{evil}\nEOF\n",
        "for assigns PATH": f'#!/bin/sh\nfor PATH in {evil.parent}; do exec nvcc "$@"; done\n',
    }


#: The cases that reach ``evil`` only through a PATH entry another user can write (without it on PATH
#: they run nothing untrusted: the name is not found, or found in a trusted directory).
_BY_PATH = {"bare name", "exec env prog", "absolute env prog", "launcher with a bare name"}


@pytest.mark.parametrize("case", sorted(_hidden_runs(Path("/e/nvcc"), Path("/e/nvcc"))))
def test_a_wrapper_runs_only_trusted_programs_it_names(tmp_path, case, monkeypatch):
    """Issue 11, item 3: with the untrusted directory on PATH every case is refused; without it,
    every case but those reaching it by PATH is refused all the same (by the path it names, or
    because it computes a path, assigns a variable or runs a shell or interpreter)."""
    if not tmp_is_trusted(tmp_path):
        pytest.skip("the test's tmp dir does not pass the trust rule itself")
    from flashinfer_sm120.safety.trust import trace

    evil, _ = untrusted_nvcc(tmp_path)
    (evil.parent / "nvcc-real").symlink_to(evil)
    w = script(tmp_path / "bin" / "nvcc", _hidden_runs(tmp_path, evil)[case])
    for on_path in (True, False):
        monkeypatch.setenv("PATH", f"{evil.parent}:{os.environ['PATH']}" if on_path else "/usr/bin:/bin")
        t = trace(str(w))
        if not on_path and case in _BY_PATH:
            continue
        assert t.problem is not None, f"{case}: trusted although it can run {evil}"
        assert len(t.problem) < 2000, t.problem
        # the wrapper is named with the fix, or the untrusted place it reaches is
        assert (str(w) in t.problem and "CUDA_HOME=" in t.problem) or str(evil.parent) in t.problem, t.problem


def test_inspect_as_root_never_runs_another_uids_program_found_on_path(tmp_path, cache_dir, monkeypatch):
    """The reported case: a root-owned wrapper in a trusted directory running ``nvcc-real`` by
    name, with a directory of another uid on PATH: refused, and nothing of that uid runs.
    Issue 11, item 3."""
    need_root()
    if not tmp_is_trusted(tmp_path):
        pytest.skip("the test's tmp dir does not pass the trust rule itself")
    from flashinfer_sm120.core.toolkit.probe import inspect

    theirs = tmp_path / "theirs"
    theirs.mkdir()
    marker = tmp_path / "RAN"
    script(theirs / "nvcc-real", f'#!/bin/sh\n/usr/bin/touch {marker}\necho "{RELEASE_LINE}"\n')
    for p in (theirs, theirs / "nvcc-real"):
        os.chown(p, OTHER_UID, OTHER_UID)
    monkeypatch.setenv("PATH", f"{theirs}:{os.environ['PATH']}")
    root = toolkit_with_nvcc(tmp_path / "cuda", '#!/bin/sh\nnvcc-real "$@"\n')
    tk = inspect(str(root), ("CUDA_HOME",))
    assert tk.nvcc_version is None and tk.problem.startswith("not run:"), tk
    assert "'nvcc-real'" in tk.problem and "found on PATH" in tk.problem and "CUDA_HOME=" in tk.problem
    assert not marker.exists()


def test_an_interpreter_that_is_a_script_is_followed_to_its_own_interpreter(tmp_path):
    """A trusted script whose #! names a second (trusted) script whose own #! names an
    untrusted file: the untrusted interpreter would run; it must be refused, naming it.
    Issue 11, item 3."""
    if not tmp_is_trusted(tmp_path):
        pytest.skip("the test's tmp dir does not pass the trust rule itself")
    from flashinfer_sm120.safety.trust import trace

    ww = tmp_path / "ww"
    ww.mkdir()
    shutil.copy("/bin/sh", ww / "sh")
    os.chmod(ww, 0o777)
    middle = script(tmp_path / "mid" / "shell", f"#!{ww}/sh\nexec /bin/sh \"$@\"\n")
    w = script(tmp_path / "bin" / "nvcc", f'#!{middle}\necho "{RELEASE_LINE}"\n')
    t = trace(str(w))
    assert t.problem and str(ww) in t.problem, t
    os.chmod(ww, 0o755)  # the whole chain trusted: still refused, the interpreter must be a shell binary
    t = trace(str(w))
    assert t.problem and "itself a script" in t.problem, t


def test_wrappers_really_shipped_are_accepted(tmp_path):
    """Issue 11, item 3."""
    from flashinfer_sm120.safety.trust import trace

    if os.path.exists("/usr/local/bin/nvcc") and os.path.exists("/usr/local/cuda-13.0/bin/nvcc"):
        t = trace("/usr/local/bin/nvcc")  # '#!/bin/sh' + 'exec /usr/local/cuda-13.0/bin/nvcc "$@"'
        assert t.problem is None and t.target == os.path.realpath("/usr/local/cuda-13.0/bin/nvcc"), t
    if not tmp_is_trusted(tmp_path):
        pytest.skip("the test's tmp dir does not pass the trust rule itself")
    # Debian's nvidia-cuda-toolkit /usr/bin/nvcc, byte for byte but for the prefix
    real = script(tmp_path / "usr/lib/nvidia-cuda-toolkit/bin" / "nvcc", f'#!/bin/sh\necho "{RELEASE_LINE}"\n')
    deb = script(tmp_path / "usr/bin" / "nvcc", f'#!/bin/sh\n\nexec {real} "$@"\n')
    t = trace(str(deb))
    assert t.problem is None and t.target == str(real), t
    # comments, set -e, tests, a launcher, options naming trusted paths, redirections
    shapes = [
        f'#!/bin/sh\n# wrapper (installed by the admin\'s script)\nset -eu\nexec {real} "$@"  # trailing comment\n',
        f'#!/bin/bash -e\nif [ -x {real} ]; then exec {real} "$@"; fi\necho "no nvcc" >&2\nexit 1\n',
        f'#!/bin/sh\nexec /usr/bin/nice {real} -ccbin /usr/bin/gcc -I/usr/include "$@" 2>&1\n',
        f'#!/bin/sh\n[ "$1" = --version ] && exec {real} --version\nexec {real} "$@" 2>>{tmp_path}/nvcc.log\n',
    ]
    for i, text in enumerate(shapes):
        t = trace(str(script(tmp_path / f"w{i}" / "nvcc", text)))
        assert t.problem is None and t.target == str(real), (text, t)
    # shapes that compute a word or assign a variable: refused, naming the line, the word and the fix
    refused = {f'#!/bin/sh\ncase "$1" in --version) exec {real} --version ;; esac\n': "line 2 holds ')'",
               f'#!/bin/sh\nflags="-O2"\nexec {real} $flags "$@"\n': "line 3 holds '$f'",
               f'#!/bin/sh\nflags="-O2"\nexec {real} "$@"\n': "line 2 holds 'flags=-O2'",
               f'#!/bin/sh\nfor a in "$@"; do exec {real}; done\n': "line 2 holds 'for'"}
    for i, (text, said) in enumerate(refused.items()):
        t = trace(str(script(tmp_path / f"r{i}" / "nvcc", text)))
        assert t.problem and said in t.problem and "CUDA_HOME=" in t.problem, t


# ------------------------------------------------------------------ item 4: bounded messages

_ARCH_CHILD = r"""
import os, resource, sys
import torch
# 1 GB in all with a CPU torch; a CUDA torch maps more than that by itself: 1 GB beyond what it maps
vm = int(next(ln for ln in open("/proc/self/status") if ln.startswith("VmSize:")).split()[1]) << 10
limit = 1 << 30 if torch.version.cuda is None else vm + (1 << 30)
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
if sys.argv[1] == "in-process":
    os.environ["FLASHINFER_CUDA_ARCH_LIST"] = "x " * (1 << 19)   # 1 MiB of junk: more than execve carries
import helpers.fakegpu, flashinfer_sm120
try:
    import flashinfer
    import flashinfer.jit.core  # noqa: F401  (the patch point)
    err = None
except OSError as exc:  # E2BIG from FlashInfer's own ptxas probe: Linux starts no program with such an env
    err = exc.errno
except ValueError:  # no nvcc can start to be checked (E2BIG), so FlashInfer is left alone and parses the junk itself
    err = "ValueError"
print("@@", flashinfer_sm120.status()["mode"], err, flush=True)
"""


@needs_flashinfer
@pytest.mark.parametrize("how", ["environment", "in-process"])
def test_import_with_a_huge_arch_list_under_1gb_returns_with_a_short_message(clean_env, how):
    """120 KB of junk (the most one environment string can carry into a new process) and 1 MiB
    set in-process: the import returns, under a 1 GB address-space limit, with one short message.
    (With 1 MiB in os.environ, Linux refuses to start any program (E2BIG, MAX_ARG_STRLEN is
    128 KiB), so FlashInfer's own ptxas probe at import fails; that is the kernel's limit.)
    Issue 11, item 4."""
    env = dict(clean_env, FAKE_GPU_CAPS="12.0")
    if how == "environment":
        env["FLASHINFER_CUDA_ARCH_LIST"] = "x " * (60 << 10)
    proc = subprocess.run([sys.executable, "-c", _ARCH_CHILD, how], env=env, capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(proc.stderr) < 64 << 10, f"{len(proc.stderr)} bytes on stderr"
    mode, err = proc.stdout.split(b"@@")[-1].split()
    # 7: E2BIG, see above; in-process nothing can be run, so the toolkit is refused (P1) and FlashInfer's own
    # parse of the list raises, as it does without flashinfer-sm120
    assert (mode, err) == (b"patched", b"None") or err == b"7" or (how, mode, err) == (
        "in-process", b"failed", b"ValueError"), proc.stdout
    size = 1 << 20 if how == "in-process" else 120 << 10
    assert f"FLASHINFER_CUDA_ARCH_LIST is {size} characters long".encode() in proc.stderr


def test_a_bad_arch_list_entry_does_not_repeat_the_whole_value():
    """Issue 11, item 4."""
    from flashinfer_sm120.core.patch.state import arch_specs

    for value in ["x " * 2000, "x " * 60000 + "12.0", ("99.9 " * 800) + "12.0"]:
        specs, message = arch_specs(value)
        assert message and len(message) < 2000, len(message or "")
        assert "and " in message or "characters long" in message
    specs, message = arch_specs("12.0 bogus 12.1")
    assert [(s.major, s.minor) for s in specs] == [(12, 0), (12, 1)] and "'bogus'" in message


@pytest.mark.slow  # over 4 s in the quick run (--durations, 2026-12-02)
@needs_flashinfer
def test_doctor_with_a_4kb_arch_list_prints_a_bounded_report(clean_env):
    """Issue 11, item 4."""
    env = dict(clean_env, FAKE_GPU_CAPS="", FLASHINFER_CUDA_ARCH_LIST="x " * 2048)
    proc = cli(["doctor", "--timeout", "30"], env, fakegpu=True)
    assert len(proc.stdout) + len(proc.stderr) < 64 << 10, (len(proc.stdout), len(proc.stderr))
    assert "Traceback" not in proc.stderr


# ------------------------------------------------------------------ item 5: only the binary's failures are remembered

_PROBE_CHILD = r"""
import json, os, resource, sys
import filelock  # noqa: F401  (imported before the limit: an import opens files)
from flashinfer_sm120.core.toolkit import probe, memo
from flashinfer_sm120.safety import proc as _proc
limit = sys.argv[2]
if limit == "nproc":
    resource.setrlimit(resource.RLIMIT_NPROC, (1, 1))
elif limit == "nofile":
    n = len(os.listdir("/proc/self/fd")) - 1  # the listdir's own descriptor is closed again
    # lock file (1) + output pipe (2) + /dev/null (1) fit; subprocess's exec-error pipe does not
    resource.setrlimit(resource.RLIMIT_NOFILE, (n + 5, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
tk = probe.inspect(sys.argv[1], ("CUDA_HOME",))
print("@@" + json.dumps({"problem": tk.problem, "version": str(tk.nvcc_version)}), flush=True)
"""


def _probe(argv_prefix, root, limit, env, run=subprocess.run):
    proc = run([*argv_prefix, PY, "-c", _PROBE_CHILD, str(root), limit], env=env, capture_output=True, text=True,
               timeout=120)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("@@")]
    assert lines, proc.stderr[-3000:]
    return json.loads(lines[-1][2:])


def test_eagain_under_rlimit_nproc_is_reported_not_remembered(tmp_path):
    """Issue 11, item 5."""
    need_root()
    area = Path(tempfile.mkdtemp(prefix="sm120-nproc-"))
    try:
        os.chmod(area, 0o755)
        root = toolkit_with_nvcc(area / "cuda", f'#!/bin/sh\necho "{RELEASE_LINE}"\n')  # no version file
        home = area / "home"
        home.mkdir()
        os.chown(home, OTHER_UID, OTHER_UID)
        env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "FLASHINFER_SM120_CACHE_DIR": str(home / "cache"),
               "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
        uid = ["setpriv", f"--reuid={OTHER_UID}", f"--regid={OTHER_UID}", "--clear-groups"]
        first = _probe(uid, root, "nproc", env)
        second = _probe(uid, root, "none", env)
        assert second["problem"] is None and second["version"] == "13.0", (first, second)
        assert first["problem"] and "Resource temporarily unavailable" in first["problem"], first
        assert "not remembered" in first["problem"]
    finally:
        shutil.rmtree(area, ignore_errors=True)


def test_emfile_under_rlimit_nofile_is_reported_not_remembered(tmp_path):
    """Issue 11, item 5."""
    root = toolkit_with_nvcc(tmp_path / "cuda", f'#!/bin/sh\necho "{RELEASE_LINE}"\n')
    env = dict(os.environ, FLASHINFER_SM120_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("CUDA_HOME", None)
    first = _probe([], root, "nofile", env)
    second = _probe([], root, "none", env)
    assert second["problem"] is None and second["version"] == "13.0", (first, second)
    assert first["problem"] and "Too many open files" in first["problem"], first


def test_an_nvcc_failure_of_its_own_is_still_remembered(tmp_path, cache_dir):
    """Issue 11, item 5."""
    from flashinfer_sm120.core.toolkit import memo
    from flashinfer_sm120.safety.ownership import fingerprint
    from flashinfer_sm120.core.toolkit.probe import inspect

    root = toolkit_with_nvcc(tmp_path / "cuda", "#!/bin/sh\necho garbage\nexit 3\n")
    assert "printed no 'release" in inspect(str(root)).problem
    nvcc = str(root / "bin" / "nvcc")
    hit = memo.VERSIONS.lookup(nvcc, fingerprint(nvcc))
    assert hit is not None and hit["full"] is None and "exit 3" in hit["problem"]


# ------------------------------------------------------------------ item 6: deep JSON is refused, not a RecursionError

DEEP = "[" * 10000 + "]" * 10000


def test_deep_version_json_falls_back_to_nvcc_version(tmp_path, cache_dir):
    """Issue 11, item 6."""
    from flashinfer_sm120.core.toolkit.probe import inspect

    root = toolkit_with_nvcc(tmp_path / "cuda", f'#!/bin/sh\necho "{RELEASE_LINE}"\n')
    (root / "version.json").write_text('{"cuda_nvcc": {"version": ' + DEEP + "}}")
    tk = inspect(str(root), ("CUDA_HOME",))
    assert tk.problem is None and tk.nvcc_full == "13.0.88" and tk.version_from == "nvcc --version", tk


def test_deep_view_json_in_cuda_home_is_not_a_view(tmp_path, cache_dir):
    """Issue 11, item 6."""
    from flashinfer_sm120.core.toolkit.sources import discover

    root = make_toolkit(tmp_path / "cuda", "13.0.88")
    (root / "flashinfer_sm120_view.json").write_text('{"toolkit": ' + DEEP + "}")
    cands = discover({"CUDA_HOME": str(root), "PATH": ""})
    assert cands[0].root == str(root) and cands[0].problem is None


def test_deep_manifest_line_is_reported(tmp_path):
    """Issue 11, item 6."""
    from flashinfer_sm120.warmup import replay

    m = tmp_path / "m.jsonl"
    m.write_text(DEEP + "\n")
    with pytest.raises(replay.BuildError, match="nested 10000 deep"):
        replay.load(str(m))


# ------------------------------------------------------------------ item 7: versions parsed once, formatted from Version

def test_a_padded_version_is_parsed_and_formatted(tmp_path, cache_dir):
    """Issue 11, item 7."""
    from flashinfer_sm120.core.toolkit.probe import inspect

    root = make_toolkit(tmp_path / "cuda", "13.0.88")
    (root / "version.json").write_text(json.dumps({"cuda_nvcc": {"version": " 13.0.88\n"}}))
    tk = inspect(str(root))
    assert tk.nvcc_full == "13.0.88" and tk.version_from.endswith("version.json"), tk
    (root / "version.json").write_text(json.dumps({"cuda_nvcc": {"version": "13.0.88\nbuild x: phony"}}))
    tk = inspect(str(root))  # not a version: the next source (nvcc --version) is used
    assert tk.nvcc_full == "13.0.88" and tk.version_from == "nvcc --version", tk


def test_a_padded_version_in_the_memo_is_dropped(tmp_path, cache_dir):
    """Issue 11, item 7."""
    from flashinfer_sm120.core.toolkit import memo
    from flashinfer_sm120.safety.ownership import fingerprint

    nvcc = "/bin/sh"
    memo.VERSIONS.store(nvcc, fingerprint(nvcc), {"full": "13.0.88", "problem": None})
    path = memo.VERSIONS.path()
    data = json.loads(open(path).read())
    data["entries"][nvcc]["full"] = " 13.0.88\n"
    open(path, "w").write(json.dumps(data))
    assert memo.VERSIONS.lookup(nvcc, fingerprint(nvcc)) is None


_JIT_CHILD = r"""
import json, helpers.fakegpu, flashinfer_sm120, flashinfer
import flashinfer.jit.env as env
print("@@" + json.dumps({"jit": str(env.FLASHINFER_JIT_DIR), "mode": flashinfer_sm120.status()["mode"]}))
"""


@needs_flashinfer
def test_the_jit_directory_name_comes_from_the_formatted_version(tmp_path, clean_env):
    """Issue 11, item 7."""
    from helpers.child import run_py

    root = make_toolkit(tmp_path / "cuda", "13.0.88", curand=True)
    (root / "version.json").write_text(json.dumps({"cuda_nvcc": {"version": " 13.0.88\n"}}))
    env = dict(clean_env, CUDA_HOME=str(root), FAKE_GPU_CAPS="12.0", FAKE_TORCH_CUDA="13.0")
    out, proc = run_py(_JIT_CHILD, env)
    assert out["mode"] in ("patched", "noop"), proc.stderr[-2000:]
    assert "/nvcc13.0.88-" in out["jit"] and not any(c.isspace() for c in out["jit"]), out


# ------------------------------------------------------------------ item 8 / 13: CLI numbers

@pytest.mark.parametrize("argv,flag", [(["build", "norm", "-j", "-1"], "-j"), (["build", "norm", "-j", "0"], "-j"),
                                       (["build", "norm", "-j", "x"], "-j"),
                                       (["doctor", "--timeout", "nan"], "--timeout"),
                                       (["doctor", "--timeout", "-1"], "--timeout"),
                                       (["doctor", "--timeout", "1e999"], "--timeout"),
                                       (["doctor", "--timeout", "inf"], "--timeout")])
def test_cli_numbers_are_refused_naming_the_flag(argv, flag, capsys, monkeypatch):
    """Issue 11, items 8 and 13."""
    from flashinfer_sm120 import cli
    from flashinfer_sm120.cli import build, doctor

    monkeypatch.setattr(doctor, "run_doctor", lambda args: 0)  # never reached when the number is refused
    monkeypatch.setattr(build, "run_build", lambda args: 0)
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and f"{flag} " in err and "Traceback" not in err, err


# ------------------------------------------------------------------ items 10, 11, 13: manifests

def _entry(**kw):
    e = {"format": 1, "flashinfer": "0.7.4", "name": "norm", "targets": ["12.0f"], "toolchain": "nvcc",
         "regenerable": False, "why": "test"}
    e.update(kw)
    return e


@pytest.mark.parametrize("bad,says", [
    (_entry(targets=[12.0]), "targets"),
    (_entry(name="no\x00rm"), "not a name"),
    (_entry(name="norm\nbuild x: phony"), "not a name"),       # item 11
    (_entry(name="a b$c:d"), "not a name"),                   # item 11
    (_entry(name=123), "'name' is 123 (an integer), not a string"),   # item 13
    (_entry(targets="12.0f"), "'targets' is '12.0f' (a string), not a list"),  # item 13
    # entries of 0.2.0 (flags, sources, generated text) pass through the one refusal of that format
    (_entry(regenerable=True, spec={"sources": ["a.cu"], "extra_cuda_cflags": ["-O3; rm -rf ~"]}), "flashinfer-sm120 0.2"),
    (_entry(regenerable=True, spec={"sources": ["a b.cu"]}), "flashinfer-sm120 0.2"),
    (_entry(regenerable=True, spec={"sources": ["a.cu"]}, generated={"@GEN@/../../x": "int x;"}), "flashinfer-sm120 0.2"),
])
def test_bad_manifest_lines_are_skipped_naming_the_fault(tmp_path, bad, says):
    """Issue 11, items 10, 11 and 13."""
    from flashinfer_sm120.warmup import replay

    m = tmp_path / "m.jsonl"
    m.write_text(json.dumps(bad) + "\n" + json.dumps(_entry(name="rope")) + "\n")
    entries, problems = replay.load(str(m))
    assert [e["name"] for e in entries] == ["rope"]
    assert len(problems) == 1 and says in problems[0] and f"{m}:1" in problems[0], problems
    assert "entry format" not in problems[0] and "--arch" not in problems[0]


def test_build_from_a_bad_manifest_is_a_message(tmp_path, clean_env):
    """Issue 11, item 10."""
    m = tmp_path / "m.jsonl"
    m.write_text(json.dumps(_entry(targets=[12.0])) + "\n")
    proc = cli(["build", "--from", str(m)], clean_env, fakegpu=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "targets" in proc.stderr, proc.stderr


_LONG_LINE_CHILD = r"""
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (768 << 20, 768 << 20))
from flashinfer_sm120.warmup import replay
try:
    entries, problems = replay.load(sys.argv[1])
    print("@@", [e["name"] for e in entries], problems)
except replay.BuildError as exc:
    print("@@ BuildError", str(exc)[:300])
"""


def test_a_huge_manifest_line_is_skipped_without_being_read_whole(tmp_path):
    """Issue 11, item 10."""
    m = tmp_path / "m.jsonl"
    with open(m, "wb") as f:
        f.write((json.dumps(_entry(name="rope")) + "\n").encode())
        f.truncate(f.tell() + (1 << 30))  # a 1 GiB line of NULs (sparse: no disk used)
    for path, want in ((m, "line longer than"), ("/dev/zero", "not a regular file")):
        proc = subprocess.run([PY, "-c", _LONG_LINE_CHILD, str(path)], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0 and "@@" in proc.stdout and want in proc.stdout, proc.stdout + proc.stderr[-2000:]


def test_a_manifest_entry_that_would_write_ninja_syntax_is_refused(tmp_path):
    """Issue 11, item 11."""
    from flashinfer_sm120.warmup import replay

    m = tmp_path / "m.jsonl"
    m.write_text(json.dumps(_entry(name="norm\nbuild x: phony", regenerable=True)) + "\n")
    with pytest.raises(replay.BuildError, match="not a name"):
        replay.load(str(m))


# ------------------------------------------------------------------ item 12: directories we create

def test_umask_000_without_a_cache_dir_creates_private_levels(tmp_path):
    """Issue 11, item 12."""
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    env = {k: v for k, v in os.environ.items() if k not in ("FLASHINFER_SM120_CACHE_DIR", "XDG_CACHE_HOME")}
    env["HOME"] = str(home)
    code = "import os; os.umask(0)\nfrom flashinfer_sm120.safety.fs import statedir\nprint('@@' + statedir.cache_root())"
    proc = subprocess.run([PY, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    root = proc.stdout.strip().removeprefix("@@")
    assert root == str(home / ".cache" / "flashinfer-sm120"), proc.stdout + proc.stderr
    for d in (home / ".cache", home / ".cache" / "flashinfer-sm120"):
        assert os.stat(d).st_mode & 0o777 == 0o700, oct(os.stat(d).st_mode)
