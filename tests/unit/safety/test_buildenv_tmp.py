"""The build temporary directory: one private directory per process, handed to compilers through
TMPDIR, TMP and TEMP, and the process environment restored after (threat model P5)."""

import os
import stat

from flashinfer_sm120.safety.fs import atomic


def test_build_env_names_one_private_directory_of_ours_in_tmpdir():
    env = atomic.build_env({"TMPDIR": "/elsewhere", "PATH": "/usr/bin"})
    path = env["TMPDIR"]
    assert env["TMP"] == env["TEMP"] == path and env["PATH"] == "/usr/bin"
    st = os.lstat(path)
    assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.geteuid()
    assert os.path.basename(path).startswith(atomic.BUILD_TMP_PREFIX)
    assert atomic.build_env({})["TMPDIR"] == path  # one per process


def test_a_forked_child_gets_its_own_directory():
    mine = atomic.build_tmp()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.write(w, atomic.build_tmp().encode())
        os._exit(0)
    os.close(w)
    theirs = os.read(r, 4096).decode()
    os.waitpid(pid, 0)
    assert theirs and theirs != mine and os.path.isdir(mine)


def test_exported_nests_and_restores_what_it_set():
    environ = {"TMPDIR": "/mine", "TEMP": "/t"}
    with atomic.exported_build_tmp(environ) as path:
        assert [environ[v] for v in atomic.TEMP_VARIABLES] == [path] * 3
        with atomic.exported_build_tmp(environ):
            pass
        assert environ["TMPDIR"] == path  # the outer block still builds
        environ["TEMP"] = "/changed-meanwhile"
    assert environ == {"TMPDIR": "/mine", "TEMP": "/changed-meanwhile"}  # TMP was unset: unset again
