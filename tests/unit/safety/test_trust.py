"""Trust: every link hop, wrapper, interpreter and exec target, and the
directories holding them (issue 5 item 3 and the wrapper cases)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import textwrap
from pathlib import Path

import pytest

from helpers.toolkits import make_toolkit, script
from flashinfer_sm120.core.toolkit.probe import inspect
from flashinfer_sm120.safety.trust import trace
from helpers.guards import hang_guard
from helpers.probing import OTHER_UID, PY, as_uid, need_root


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHINFER_SM120_CACHE_DIR", str(tmp_path / "cache"))


def test_wrapper_loops_terminate_and_are_refused(tmp_path):
    me = script(tmp_path / "self" / "bin" / "nvcc", "")
    me.write_text(f'#!/bin/sh\nexec {me} "$@"\n')
    a = tmp_path / "a" / "bin" / "nvcc"
    b = tmp_path / "b" / "bin" / "nvcc"
    script(a, f'#!/bin/sh\nexec {b} "$@"\n')
    script(b, f'#!/bin/sh\nexec {a} "$@"\n')
    for path in (me, a):
        with hang_guard(60):  # a loop followed forever
            tr = trace(str(path))
        assert tr.problem and str(path) in tr.problem and "CUDA_HOME" in tr.problem  # the value and the fix
        tk = inspect(str(path.parent.parent))
        assert tk.problem.startswith("not run:") and str(path) in tk.problem


def test_wrapper_with_computed_target_is_not_run(tmp_path):
    marker = tmp_path / "ran"
    real = make_toolkit(tmp_path / "real", "13.0.88")
    root = tmp_path / "wrapped"
    make_toolkit(root, "13.0.88")
    script(root / "bin" / "nvcc-real", f"#!/bin/sh\n/usr/bin/touch {marker}\nexec {real}/bin/nvcc \"$@\"\n")
    script(root / "bin" / "nvcc", '#!/bin/sh\nexec "$(dirname "$0")/nvcc-real" "$@"\n')
    tk = inspect(str(root))
    assert tk.problem.startswith("not run:") and "computes the path" in tk.problem and "$(" in tk.problem
    assert "set CUDA_HOME" in tk.problem
    assert not marker.exists()


def test_wrapper_target_followed_and_checked(tmp_path):
    shared = tmp_path / "shared"
    real = make_toolkit(shared / "cuda-13.0", "13.0.88")
    wrapped = tmp_path / "wrapped"
    make_toolkit(wrapped, "13.0.88")
    (wrapped / "bin" / "nvcc").write_text(f'#!/bin/sh\nexec {real}/bin/nvcc "$@"\n')
    tr = trace(str(wrapped / "bin" / "nvcc"))
    assert tr.problem is None and tr.target == str(real / "bin" / "nvcc")
    os.chmod(shared, 0o777)  # the wrapper's TARGET now sits in a world-writable directory
    try:
        tr = trace(str(wrapped / "bin" / "nvcc"))
    finally:
        os.chmod(shared, 0o755)
    assert tr.problem and str(shared) in tr.problem and "writable by other users" in tr.problem


def test_symlink_hop_through_world_writable_dir_is_refused(tmp_path):
    real = make_toolkit(tmp_path / "cuda-13.0", "13.0.88")
    ww = tmp_path / "ww"
    (ww / "bin").mkdir(parents=True)
    (ww / "bin" / "nvcc").symlink_to(real / "bin" / "nvcc")
    os.chmod(ww / "bin", 0o777)
    tr = trace(str(ww / "bin" / "nvcc"))
    assert tr.problem and str(ww / "bin") in tr.problem
    assert trace(str(real / "bin" / "nvcc")).problem is None


def test_untrusted_interpreter_is_refused(tmp_path):
    ww = tmp_path / "ww"
    ww.mkdir()
    shutil.copy("/bin/sh", ww / "sh")
    os.chmod(ww, 0o777)
    root = make_toolkit(tmp_path / "cuda", nvcc_script=f"#!{ww}/sh\necho 'release 12.8, V12.8.93'\n")
    assert str(ww) in trace(str(root / "bin" / "nvcc")).problem


def test_sticky_dir_trusts_only_root_owned_entries(tmp_path):
    need_root()
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)
    mine = make_toolkit(sticky / "cuda", "12.8.93")
    assert trace(str(mine / "bin" / "nvcc")).problem is None  # root-owned entry in a root sticky dir
    os.chown(sticky / "cuda", OTHER_UID, OTHER_UID)
    tr = trace(str(mine / "bin" / "nvcc"))
    assert tr.problem and f"owned by uid {OTHER_UID}" in tr.problem and "use a path outside" in tr.problem


@pytest.fixture
def shared_area():
    """A root-owned 0755 directory under /tmp, readable by other uids."""
    d = Path(tempfile.mkdtemp(prefix="sm120-trust-"))
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


CHILD = r"""
import json, sys
from flashinfer_sm120.core.toolkit.probe import inspect
tk = inspect(sys.argv[1], ("CUDA_HOME",))
print("@@" + json.dumps({"problem": tk.problem, "version": str(tk.nvcc_version)}))
"""


@pytest.mark.parametrize("how", ["wrapper", "symlink"])
def test_cuda_home_of_another_uid_borrowing_a_trusted_nvcc_is_refused(shared_area, how):
    """Victim uid V; CUDA_HOME owned by uid A; its bin/nvcc is a wrapper that
    execs a trusted (root-owned) nvcc, or a symlink to one.  Must not be run."""
    need_root()
    victim, attacker = OTHER_UID, OTHER_UID + 1
    log = shared_area / "log"
    log.mkdir()
    os.chmod(log, 0o777)
    trusted = make_toolkit(shared_area / "trusted", "13.0.88", nvcc_script=textwrap.dedent(f"""\
        #!/bin/sh
        /usr/bin/id -u >> {log}/ran
        echo "Cuda compilation tools, release 13.0, V13.0.88"
        """))
    evil = make_toolkit(shared_area / "evil", "13.0.88")
    nvcc = evil / "bin" / "nvcc"
    nvcc.unlink()
    if how == "wrapper":
        script(nvcc, f'#!/bin/sh\nexec {trusted}/bin/nvcc "$@"\n')
    else:
        nvcc.symlink_to(trusted / "bin" / "nvcc")
    for p in [evil, *evil.rglob("*")]:
        os.lchown(p, attacker, attacker)
    home = shared_area / "home"
    home.mkdir()
    os.chown(home, victim, victim)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
           "FLASHINFER_SM120_CACHE_DIR": str(home / "cache")}
    proc = as_uid(victim, [PY, "-c", CHILD, str(evil)], env)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("@@")]
    assert lines, proc.stderr[-3000:]
    out = json.loads(lines[-1][2:])
    assert not (log / "ran").exists(), f"the nvcc was run: {(log / 'ran').read_text()}"
    assert out["problem"] and out["problem"].startswith("not run:"), out
    assert f"uid {attacker}" in out["problem"] and str(evil) in out["problem"]
    # the same trusted nvcc, reached directly, is fine for the victim
    proc = as_uid(victim, [PY, "-c", CHILD, str(trusted)], env)
    out = json.loads([l for l in proc.stdout.splitlines() if l.startswith("@@")][-1][2:])
    assert out["problem"] is None and out["version"] == "13.0"


def test_script_naming_itself_without_running_it_is_not_a_loop(tmp_path):
    root = tmp_path / "cuda"
    nvcc = root / "bin" / "nvcc"
    make_toolkit(root, "12.8.93")
    nvcc.write_text(f"#!/bin/sh\n# installed as {nvcc}\necho 'Cuda compilation tools, release 12.8, V12.8.93'\n")
    tr = trace(str(nvcc))
    assert tr.problem is None and tr.target == str(nvcc)


def test_any_absolute_command_a_wrapper_runs_is_checked(tmp_path):
    ww = tmp_path / "ww"
    helper = script(ww / "helper", "#!/bin/sh\ntrue\n")
    root = make_toolkit(tmp_path / "cuda", "12.8.93")
    nvcc = root / "bin" / "nvcc"
    nvcc.write_text(f"#!/bin/sh\n{helper} --prepare\necho 'Cuda compilation tools, release 12.8, V12.8.93'\n")
    assert trace(str(nvcc)).problem is None
    os.chmod(ww, 0o777)  # the helper is checked: its directory open to others refuses the wrapper
    tr = trace(str(nvcc))
    assert tr.problem and str(ww) in tr.problem


def test_many_references_are_checked_once_each(tmp_path, monkeypatch):
    from collections import Counter

    from flashinfer_sm120.safety.formats import reads as reads_module

    real = make_toolkit(tmp_path / "real", "13.0.88")
    level = [real / "bin" / "nvcc"]
    for i in range(6):  # 10 wrappers per level, each naming all 10 of the level below: 10**6 paths
        body = "#!/bin/sh\n" + "".join(f'[ -x {p} ] && exec {p} "$@"\n' for p in level)
        level = [script(tmp_path / f"w{i}-{j}" / "bin" / "nvcc", body) for j in range(10)]
    reads, read_bytes = Counter(), reads_module.read_bytes

    def counting(path, *a, **k):
        if not k.get("prefix"):  # a whole read; the '#!' check reads a prefix first
            reads.update([path])
        return read_bytes(path, *a, **k)

    monkeypatch.setattr(reads_module, "read_bytes", counting)
    with hang_guard(120):
        tr = trace(str(level[0]))
    assert tr.problem is None and tr.target == str(real / "bin" / "nvcc")
    assert len(reads) == 52 and set(reads.values()) == {1}, reads.most_common(3)  # 51 wrappers, nvcc: once each


def test_untrusted_include_dir_is_not_adopted(tmp_path):
    root = make_toolkit(tmp_path / "cuda", "12.8.93", version_json=True)
    os.chmod(root / "include", 0o777)
    try:
        tk = inspect(str(root))
    finally:
        os.chmod(root / "include", 0o755)
    assert tk.problem.startswith("not adopted:") and str(root / "include") in tk.problem


def test_group_writable_only_by_the_users_private_group_is_trusted(tmp_path, monkeypatch):
    """umask 002 on user-private-group systems (Debian/Ubuntu): a user's own venv
    is group-writable by a group holding only that user; any other group is not."""
    need_root()
    from flashinfer_sm120.safety import ownership

    root = make_toolkit(tmp_path / "venv" / "cuda", "13.0.88")
    os.chmod(root / "bin", 0o775)
    os.chown(root / "bin", 0, OTHER_UID)
    monkeypatch.setattr(ownership, "_private_gid", lambda uid: OTHER_UID)
    assert trace(str(root / "bin" / "nvcc")).problem is None
    monkeypatch.setattr(ownership, "_private_gid", lambda uid: OTHER_UID + 1)  # a shared group
    tr = trace(str(root / "bin" / "nvcc"))
    assert tr.problem and str(root / "bin") in tr.problem and "writable by other users" in tr.problem


def test_private_group_needs_a_named_single_user_group(monkeypatch):
    import grp
    import pwd
    from types import SimpleNamespace

    from flashinfer_sm120.safety import ownership

    monkeypatch.setattr(pwd, "getpwuid", lambda uid: SimpleNamespace(pw_name="ann", pw_gid=4242))
    cases = [(SimpleNamespace(gr_name="ann", gr_mem=[]), 4242),
             (SimpleNamespace(gr_name="users", gr_mem=[]), None),  # a shared primary group
             (SimpleNamespace(gr_name="ann", gr_mem=["bob"]), None)]
    for group, want in cases:
        monkeypatch.setattr(grp, "getgrgid", lambda gid, g=group: g)
        ownership._private_gid.cache_clear()
        assert ownership._private_gid(1000) == want
    assert ownership._private_gid(0) is None  # never for root
    ownership._private_gid.cache_clear()


def test_a_shared_sticky_directory_is_never_told_to_chmod(tmp_path):
    """A record file or the cache root in /tmp (shared, sticky) is refused with "a directory of your own", never
    with "run 'chmod go-w /tmp'": one fix rule for every trust message (P8)."""
    from flashinfer_sm120.safety.ownership import check_place, mine_problem, trust_reason

    sticky = tmp_path / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)
    opened = tmp_path / "open"
    opened.mkdir()
    opened.chmod(0o777)
    for problem in (str(check_place(str(sticky), "the record file's directory")), trust_reason(str(sticky)),
                    mine_problem(str(sticky), sticky.stat())):
        assert problem and "chmod" not in problem and "a directory of your own" in problem, problem
    problem = trust_reason(str(opened))
    assert problem and f"chmod go-w {opened}" in problem, problem
    problem = trust_reason("/dev/full")  # P8: never "run 'chmod go-w /dev/full'"
    assert problem and "chmod" not in problem and "special file" in problem, problem


def test_what_a_wrapper_reads_or_reaches_by_proc_or_path_is_checked(tmp_path, monkeypatch):
    """A file a wrapper reads with '<' is checked like any word (a file it writes with '>' is not
    run); a path through /proc names what the shell has open, so it is refused; every PATH entry
    must pass, and a relative one (the working directory) never does.  threat-model: P2"""
    ww = tmp_path / "ww"
    ww.mkdir()
    ww.chmod(0o777)
    real = make_toolkit(tmp_path / "real", "13.0.88") / "bin" / "nvcc"
    cases = {f"/usr/bin/cat <{ww}/input\n": str(ww), f"exec 3>{ww}/x\n/usr/bin/env /dev/fd/3\n": "/proc",
             "/usr/bin/env /dev/stdin\n": "/proc"}
    for i, (body, said) in enumerate(cases.items()):
        tr = trace(str(script(tmp_path / f"w{i}" / "nvcc", f'#!/bin/sh\n{body}exec {real} "$@"\n')))
        assert tr.problem and said in tr.problem and "CUDA_HOME=" in tr.problem, tr
    w = script(tmp_path / "ok" / "nvcc", f'#!/bin/sh\n/usr/bin/env >>{ww}/log 2>/dev/null\nexec {real} "$@"\n')
    assert trace(str(w)).problem is None
    monkeypatch.setenv("PATH", "/usr/bin::/bin")
    tr = trace(str(w))
    assert tr.problem and "PATH holds ''" in tr.problem and "the working directory" in tr.problem, tr


def test_a_response_file_a_wrapper_names_is_checked_where_it_lies(tmp_path):
    """``@/file`` (options nvcc reads from a file) is the path it names: refused in a directory others
    can write, accepted in a trusted one (P2)."""
    real = make_toolkit(tmp_path / "real", "13.0.88") / "bin" / "nvcc"
    ww = tmp_path / "ww"
    ww.mkdir()
    (ww / "rsp").write_text("-O2\n")
    ww.chmod(0o777)
    tr = trace(str(script(tmp_path / "w1" / "nvcc", f'#!/bin/sh\nexec {real} @{ww}/rsp "$@"\n')))
    assert tr.problem and str(ww) in tr.problem, tr
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o755)
    (mine / "rsp").write_text("-O2\n")
    tr = trace(str(script(tmp_path / "w2" / "nvcc", f'#!/bin/sh\nexec {real} @{mine}/rsp "$@"\n')))
    assert tr.problem is None and tr.target == str(real), tr
