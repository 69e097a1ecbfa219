"""Where flashinfer-sm120 keeps its state (:func:`flashinfer_sm120.safety.fs.statedir.cache_root`): check, then
create.  Nothing is created before the checks that would refuse it have passed, and nothing inside a
tree another uid owns (threat-model: P4).
Real uids: root with another user's ``HOME`` (``sudo -E``) and ``setpriv --reuid`` children."""

import errno
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from helpers.child import cli
from helpers.probing import NOBODY, created, home_env, needs_root, user_home


@needs_root
def test_root_with_a_users_home_creates_nothing_there(shared_tmp, monkeypatch):
    """Root with a user's HOME (sudo -E) creates nothing there: no root-owned 0700 ~/.cache that would give
    the user's pip EACCES (P4)."""
    from flashinfer_sm120.safety.fs import statedir

    home = user_home(shared_tmp)
    for k, v in home_env(home, shared_tmp / "tmp").items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("FLASHINFER_SM120_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", None)
    statedir.forget_cache_root()
    try:
        root = statedir.cache_root()
    finally:
        statedir.forget_cache_root()
    assert not (home / ".cache").exists(), created(home)
    assert root == str(shared_tmp / "tmp" / "flashinfer-sm120-0")  # the next candidate
    notes = " ".join(statedir.cache_root_notes())
    assert f"owned by uid {NOBODY}" in notes and "sudo -H" in notes
    # setting only the one variable left FlashInfer's other caches (b12x's) in that home: one fix covers them all
    assert "set HOME to a directory of your own" in notes, notes


@pytest.mark.slow  # over 4 s in the quick run (--durations, 2026-12-02)
@needs_root
@pytest.mark.parametrize("args", [["status"], ["doctor"]])
def test_a_command_as_root_with_a_users_home_creates_nothing_there(shared_tmp, args):
    """A command as root with HOME of another uid creates nothing there (P4)."""
    home = user_home(shared_tmp)
    env = home_env(home, shared_tmp / "tmp", FLASHINFER_WORKSPACE_BASE=str(shared_tmp / "ws"))
    proc = cli(args, env, timeout=300)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    assert created(home) == [], proc.stderr[-2000:]


@needs_root
def test_status_as_root_with_a_users_home_does_not_let_flashinfer_create_its_cache_there(shared_tmp):
    """FlashInfer makes ~/.cache/flashinfer at import: status asks first, and refuses with the fix."""
    home = user_home(shared_tmp)
    env = home_env(home, shared_tmp / "tmp")
    env.pop("FLASHINFER_WORKSPACE_BASE", None)
    proc = cli(["status", "--json"], env, timeout=300)
    assert proc.returncode == 1 and created(home) == [], proc.stderr[-2000:]
    import json

    st = json.loads(proc.stdout)
    assert st["mode"] == "refused" and str(home) in st["error"] and "FLASHINFER_WORKSPACE_BASE" in st["error"]
    assert "sudo -H" in st["error"] and f"uid {NOBODY}" in st["error"]


@needs_root
def test_the_workspace_check_names_the_foreign_tree_and_creates_nothing(shared_tmp, monkeypatch):
    from flashinfer_sm120.core.facts.refusals import import_refused

    home = user_home(shared_tmp)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("FLASHINFER_WORKSPACE_BASE", raising=False)
    refusal = import_refused()
    assert refusal is not None and refusal.code == "workspace-foreign-tree", refusal
    assert str(home / ".cache" / "flashinfer") in refusal.text and f"owned by uid {NOBODY}" in refusal.text
    monkeypatch.setenv("FLASHINFER_WORKSPACE_BASE", str(shared_tmp / "ws"))
    assert import_refused() is None
    assert created(home) == []


@needs_root
@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux)")
def test_a_user_creates_the_root_in_their_own_home_private(shared_tmp):
    """The other side of the rule: a user's own missing ~/.cache/flashinfer-sm120 is made, 0700."""
    home = user_home(shared_tmp)
    env = home_env(home, shared_tmp / "tmp", PYTHONPATH=str(Path(__file__).resolve().parents[4] / "src"))
    code = "from flashinfer_sm120.safety.fs import statedir; print(statedir.cache_root())"
    proc = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                           sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    root = home / ".cache" / "flashinfer-sm120"
    assert proc.stdout.strip() == str(root)
    for d in (home / ".cache", root):
        st = d.stat()
        assert st.st_uid == NOBODY and stat.S_IMODE(st.st_mode) == 0o700



def _chosen_root() -> tuple[str, list[str]]:
    """The cache root chosen afresh from the environment, and the notes said while choosing it."""
    from flashinfer_sm120.safety.fs import statedir

    statedir.forget_cache_root(notes=True)
    try:
        return statedir.cache_root(), list(statedir.cache_root_notes())
    finally:
        statedir.forget_cache_root()

def test_a_name_too_long_falls_back_to_the_next_candidate(tmp_path, monkeypatch):
    """A cache directory whose name is too long (ENAMETOOLONG) falls back to the next candidate, with a note
    naming the variable and the fix (a shorter path), not 'set a writable directory' (P8)."""
    from flashinfer_sm120.safety.fs import statedir

    long_dir = tmp_path / ("x" * 300)
    monkeypatch.setenv("FLASHINFER_SM120_CACHE_DIR", str(long_dir))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    statedir.forget_cache_root()
    try:
        root = statedir.cache_root()
    finally:
        statedir.forget_cache_root()
    assert root == str(tmp_path / "xdg" / "flashinfer-sm120")
    note = [n for n in statedir.cache_root_notes() if "x" * 50 in n][-1]
    assert "longer than the file system allows" in note and "shorter path" in note
    assert "FLASHINFER_SM120_CACHE_DIR" in note


@pytest.mark.parametrize("err", [errno.EACCES, errno.EROFS])
def test_an_unwritable_candidate_falls_through_with_its_errno_meaning(tmp_path, monkeypatch, err):
    from flashinfer_sm120.safety.fs import places, statedir

    monkeypatch.setenv("FLASHINFER_SM120_CACHE_DIR", str(tmp_path / "a" / "b"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    real = places.make_private_dirs

    def refuse(path, **kw):
        if "xdg" not in str(path):
            raise OSError(err, os.strerror(err), str(path))
        return real(path, **kw)

    monkeypatch.setattr(places, "make_private_dirs", refuse)
    statedir.forget_cache_root()
    try:
        assert statedir.cache_root() == str(tmp_path / "xdg" / "flashinfer-sm120")
    finally:
        statedir.forget_cache_root()
    from flashinfer_sm120.safety import oserrors

    meaning = oserrors.describe(OSError(err, ""), str(tmp_path / "a" / "b")).message  # the one errno table
    assert any(meaning in n for n in statedir.cache_root_notes()), statedir.cache_root_notes()


def test_a_root_too_long_for_what_goes_below_it_falls_back(tmp_path, monkeypatch):
    """A cache root near PATH_MAX, too long for the files that go below it, is not taken: the next candidate
    is tried, rather than every file below failing with ENAMETOOLONG ('set a writable directory') (P8)."""
    from flashinfer_sm120.safety.fs import statedir

    deep = str(tmp_path)
    while len(deep) < 4096 - 300:
        deep = os.path.join(deep, "d" * 200)
    os.makedirs(deep, mode=0o700)
    monkeypatch.setenv("FLASHINFER_SM120_CACHE_DIR", deep)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    statedir.forget_cache_root()
    try:
        root = statedir.cache_root()
    finally:
        statedir.forget_cache_root()
    assert root == str(tmp_path / "xdg" / "flashinfer-sm120")
    assert any("no room" in n and "longer than the file system allows" in n for n in statedir.cache_root_notes())


# ------------------------------------------------------------------ the path-character rule

@pytest.mark.parametrize("name", ["ü-home", "домашний", "用户", "café+x"])
def test_a_home_with_non_ascii_letters_is_used(tmp_path, monkeypatch, name):
    """A HOME with non-ASCII letters is used: it must not be refused for a reason (blank, ':', '$') that does
    not apply; FlashInfer builds under such a path (the slow test below compiles one) (P8)."""
    from flashinfer_sm120.safety.fs import statedir

    home = tmp_path / name
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("FLASHINFER_SM120_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    statedir.forget_cache_root()
    try:
        assert statedir.cache_root() == str(home / ".cache" / "flashinfer-sm120")
    finally:
        statedir.forget_cache_root()
    assert statedir.jit_dir_problem(str(home / ".cache" / "flashinfer")) is None


@pytest.mark.parametrize("char", [" ", "\t", "\n", ":", "$", ";", "'", '"', "`", "\\", "*", "?", "[", "#", "{",
                                  "!", "&", "|", "<", "(", "\u00a0", "\u2028", "\udcff"])
def test_the_path_rule_refuses_what_ninja_or_the_shell_reads_and_says_the_rule(char):
    from flashinfer_sm120.safety.fs import statedir
    from flashinfer_sm120.safety.fs.statedir import PATH_RULE

    for problem in (statedir.path_problem(f"/tmp/a{char}b", "HOME"), statedir.jit_dir_problem(f"/tmp/a{char}b")):
        assert problem and repr(char) in problem and PATH_RULE in problem


def test_docs_state_the_rule_the_code_applies():
    from flashinfer_sm120.safety.fs.statedir import PATH_RULE

    safety = (Path(__file__).resolve().parents[4] / "docs" / "safety.md").read_text()
    assert PATH_RULE in " ".join(safety.split()), "docs/safety.md must quote formats.PATH_RULE word for word"


_BUILD_UNDER = r"""
import ctypes, json, os, pathlib
import flashinfer_sm120
from flashinfer.jit import core, env
src = pathlib.Path(os.environ["FLASHINFER_WORKSPACE_BASE"]) / "src" / "tiny.cu"
src.parent.mkdir(parents=True)
src.write_text('__global__ void k(float* x){ x[threadIdx.x] *= 2.f; }\nextern "C" int tiny_answer(){ return 42; }\n')
spec = core.gen_jit_spec("tiny_ü", [src])
spec.build(verbose=False)
print("@@" + json.dumps({"answer": ctypes.CDLL(str(spec.jit_library_path)).tiny_answer(),
                         "jit": str(env.FLASHINFER_JIT_DIR), "home": flashinfer_sm120.status()["mode"]}))
"""


@pytest.mark.slow
@pytest.mark.nvcc
def test_flashinfer_builds_and_loads_a_module_under_a_non_ascii_path(real_nvcc13, clean_env):
    """The fact behind the rule: FlashInfer 0.7.4 + nvcc 13 compile and link a JIT module whose
    workspace, source and CUDA_HOME view all lie under a non-ASCII path."""
    from helpers.child import run_py

    base = Path(tempfile.mkdtemp(prefix="ü-"))
    try:
        env = dict(clean_env, FLASHINFER_WORKSPACE_BASE=str(base / "wörk"), FLASHINFER_SM120_CACHE_DIR=str(base / "çache"),
                   CUDA_HOME=real_nvcc13, FLASHINFER_CUDA_ARCH_LIST="12.0f", MAX_JOBS="1")
        out, proc = run_py(_BUILD_UNDER, env)
        assert out["answer"] == 42 and "wörk" in out["jit"], proc.stderr[-3000:]
        assert "contains" not in proc.stderr, proc.stderr[-3000:]  # no warning about the path
    finally:
        shutil.rmtree(base, ignore_errors=True)


from hypothesis import given, strategies as st  # noqa: E402


@given(st.text(min_size=1, max_size=300))
def test_path_rule_property(text):
    """Any text: the checks never raise, accept exactly what the rule accepts, and a refusal names a
    refused character and states the rule, bounded."""
    from flashinfer_sm120.safety.fs import statedir
    from flashinfer_sm120.safety.fs.statedir import PATH_RULE, path_chars_problem

    path = "/" + text
    bad = path_chars_problem(path)
    for problem in (statedir.path_problem(path, "HOME"), statedir.jit_dir_problem(path)):
        assert (problem is None) == (bad is None)
        if problem:
            assert PATH_RULE in problem and len(problem) < 2000
            assert any(repr(c) in problem for c in bad)
    if bad is None:
        assert not any(c.isspace() or c in "$:;&|<>()'\"`\\*?[]#{}!" or ord(c) < 32 for c in path)


@pytest.mark.parametrize("err,meaning,fix", [
    (errno.ENOSPC, "is full", "free space there"),
    (errno.EACCES, "permission denied", "make"),
    (errno.EROFS, "read-only file system", "FLASHINFER_SM120_CACHE_DIR"),
    (errno.ENAMETOOLONG, "longer than the file system allows", "shorter path"),
])
def test_a_failed_state_write_says_what_its_errno_means(tmp_path, monkeypatch, err, meaning, fix):
    """A failed state write says what its errno means, with its fix; 'free space' only for ENOSPC (P8)."""
    from flashinfer_sm120.safety.fs import atomic
    from flashinfer_sm120.errors import StateFileError

    def fail(path, data, **kw):
        raise OSError(err, os.strerror(err), path)

    monkeypatch.setattr(atomic, "write_atomic", fail)
    with pytest.raises(StateFileError) as info:
        atomic.write_json_atomic(str(tmp_path / "memo.json"), {})
    msg = str(info.value)
    assert meaning in msg and fix in msg and str(tmp_path) in msg
    assert ("free space" in msg) == (err == errno.ENOSPC)


@needs_root
def test_a_link_another_uid_planted_as_the_root_is_not_followed(shared_tmp, monkeypatch):
    """uid B's symlink at uid A's per-uid fallback in /tmp, pointing at a directory of A's, is not
    followed: A's files there are never overwritten (P2, P5)."""
    from flashinfer_sm120.safety.fs import statedir

    sticky = shared_tmp / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)
    mine = shared_tmp / "mine"
    mine.mkdir(mode=0o700)
    (mine / "last-status.json").write_text("my notes")
    link = sticky / "flashinfer-sm120-0"
    link.symlink_to(mine)
    os.lchown(link, NOBODY, NOBODY)
    monkeypatch.setenv("FLASHINFER_SM120_CACHE_DIR", str(link))
    monkeypatch.setenv("XDG_CACHE_HOME", str(shared_tmp / "xdg"))
    root, notes = _chosen_root()
    assert root == str(shared_tmp / "xdg" / "flashinfer-sm120")
    note = [n for n in notes if str(link) in n][-1]
    assert f"owned by uid {NOBODY}" in note and "use a path outside" in note, note
    assert os.listdir(mine) == ["last-status.json"] and (mine / "last-status.json").read_text() == "my notes"
    # the same link made by you (or root) is followed, as before
    os.lchown(link, 0, 0)
    monkeypatch.setenv("XDG_CACHE_HOME", str(shared_tmp / "xdg2"))
    try:
        assert statedir.cache_root() == str(mine)
    finally:
        statedir.forget_cache_root(notes=True)


def test_a_home_that_does_not_exist_is_not_created_for_a_cache(tmp_path, monkeypatch):
    """Root with ``HOME=/nonexistent`` makes neither ``/nonexistent`` nor a cache in it, and FlashInfer's
    import is refused rather than let make its own there (P4)."""
    from flashinfer_sm120.core.facts.refusals import import_refused
    from flashinfer_sm120.safety.fs import statedir

    home = tmp_path / "nonexistent"
    monkeypatch.setenv("HOME", str(home))
    for var in ("FLASHINFER_SM120_CACHE_DIR", "XDG_CACHE_HOME", "FLASHINFER_WORKSPACE_BASE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # gettempdir() caches its first answer
    (tmp_path / "tmp").mkdir(mode=0o700)
    statedir.forget_cache_root()
    try:
        root = statedir.cache_root()
    finally:
        statedir.forget_cache_root()
    assert root == str(tmp_path / "tmp" / f"flashinfer-sm120-{os.geteuid()}") and not home.exists()
    assert any("does not exist" in n and str(home) in n for n in statedir.cache_root_notes())
    refusal = import_refused()
    assert refusal is not None and refusal.code == "workspace-no-home" and "FLASHINFER_WORKSPACE_BASE" in refusal.fix
    assert not home.exists()


def test_a_workspace_base_in_another_uids_directory_anyone_may_write_names_the_real_reason(tmp_path, monkeypatch):
    """The refusal names the real reason, not that the owner's "own tools could not write it" (false for
    0777), and never offers "run as uid <the owner> (sudo -u)", i.e. run as the one who planted it (P8)."""
    from helpers.untrusted import give_away
    from flashinfer_sm120.core.facts.refusals import import_refused

    theirs = tmp_path / "theirs"
    theirs.mkdir()
    give_away(theirs)
    theirs.chmod(0o777)
    monkeypatch.setenv("FLASHINFER_WORKSPACE_BASE", str(theirs))
    refusal = import_refused()
    assert refusal is not None and refusal.code == "workspace-not-ours", refusal
    assert "owned by uid 4321" in refusal.text and "could not write" not in refusal.text, refusal
    assert "sudo -u" not in refusal.fix, refusal


def test_an_empty_home_is_read_as_flashinfer_reads_it_and_refused(tmp_path, monkeypatch, clean_env):
    """``HOME=`` is ``/`` to FlashInfer (``Path.home()``): our commands name that JIT directory, refuse to
    import FlashInfer (P4: it would make ``/.cache/flashinfer``) and say the fix; nothing appears at ``/``."""
    from flashinfer_sm120.core.facts.refusals import import_refused
    from flashinfer_sm120.core.facts.workspace import workspace_path

    monkeypatch.setenv("HOME", "")
    monkeypatch.delenv("FLASHINFER_WORKSPACE_BASE", raising=False)
    assert workspace_path()[0] == "/.cache/flashinfer"
    refusal = import_refused()
    assert refusal is not None and refusal.code == "workspace-no-home" and "HOME" in refusal.fix
    existed = os.path.exists("/.cache")
    env = dict(clean_env, HOME="", FLASHINFER_SM120_CACHE_DIR=str(tmp_path / "c"), FLASHINFER_CUDA_ARCH_LIST="12.0")
    env.pop("FLASHINFER_WORKSPACE_BASE", None)
    proc = subprocess.run([sys.executable, "-m", "flashinfer_sm120", "status", "--fresh"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "HOME is set but empty" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert os.path.exists("/.cache") == existed


@needs_root
def test_a_link_another_user_planted_where_cute_dsl_makes_its_cache_refuses_the_import(tmp_path, monkeypatch):
    """FlashInfer's CuTe DSL runs ``mkdir -p $TMPDIR/$USER/cutlass_python_cache`` at import: in a sticky
    directory another user may plant ``$USER`` as a link to a place of their choosing, and root created the
    cache there (P4). The command refuses to import FlashInfer, naming the directory and the fix."""
    from flashinfer_sm120.core.facts.refusals import import_refused

    sticky, victim = tmp_path / "sticky", tmp_path / "victim"
    sticky.mkdir()
    victim.mkdir()
    os.chmod(sticky, 0o1777)
    os.chmod(tmp_path, 0o755)
    (sticky / "someone").symlink_to(victim)
    os.lchown(sticky / "someone", NOBODY, NOBODY)
    monkeypatch.setenv("FLASHINFER_WORKSPACE_BASE", str(tmp_path / "ws"))
    monkeypatch.setenv("TMPDIR", str(sticky))
    monkeypatch.setenv("USER", "someone")
    monkeypatch.delenv("CUTE_DSL_CACHE_DIR", raising=False)
    refusal = import_refused()
    assert refusal is not None and refusal.code == "temp-not-ours", refusal
    assert str(sticky / "someone" / "cutlass_python_cache") in refusal.text and "TMPDIR" in refusal.fix
    assert list(victim.iterdir()) == []
    monkeypatch.setenv("CUTE_DSL_CACHE_DIR", str(tmp_path / "dsl"))  # CuTe DSL then makes nothing itself
    assert import_refused() is None
    monkeypatch.delenv("CUTE_DSL_CACHE_DIR")
    monkeypatch.setenv("USER", "nobody-planted-this")
    assert import_refused() is None  # an absent name in a sticky directory is made by us, for us


@pytest.mark.parametrize("case", ["shared sticky", "another uid's", "in another uid's directory", "/proc/self"])
def test_a_refused_cache_dir_names_the_variable_its_value_and_the_fix_for_its_case(tmp_path, monkeypatch, case):
    """``FLASHINFER_SM120_CACHE_DIR`` refused is named with its value, why and a fix that fits: never ``chmod`` a
    shared sticky directory or another's, never "run as" the owner of a directory named on purpose, and
    ``/proc/self`` (another directory in each process) is refused, not a failure that names no variable (P8)."""
    import re

    from helpers.untrusted import give_away
    from flashinfer_sm120.core.facts.refusals import import_refused

    value = tmp_path / "dir"
    if case == "/proc/self":
        value = Path("/proc/self")
    elif case == "shared sticky":
        value.mkdir()
        value.chmod(0o1777)
    else:
        value.mkdir()
        give_away(value)
        value.chmod(0o755)
        value = value / "cache" if case == "in another uid's directory" else value
        monkeypatch.setenv("FLASHINFER_WORKSPACE_BASE", str(value))
        refusal = import_refused()
        assert refusal is not None and "FLASHINFER_WORKSPACE_BASE" in refusal.fix and "sudo -u" not in refusal.fix
    monkeypatch.setenv("FLASHINFER_SM120_CACHE_DIR", str(value))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    root, notes = _chosen_root()
    assert root == str(tmp_path / "xdg" / "flashinfer-sm120")
    note = " ".join(n for n in notes if str(value) in n)
    assert f"FLASHINFER_SM120_CACHE_DIR='{value}'" in note, note
    assert "chmod" not in note and "sudo -u" not in note, note
    assert re.search(r"([;:]|Fix:) (use|set FLASHINFER_SM120_CACHE_DIR to) a directory of your own", note), note
