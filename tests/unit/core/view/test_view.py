"""The CUDA_HOME view: layout, strict adoption (issue 5 items 4, 11), the libcuda.so
stub without a C compiler (item 9), disk full / not writable, kill -9 leftovers (item 14)."""

import dataclasses
import errno
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

from helpers import TESTS, abandoned
from helpers.guards import hang_guard
from helpers.toolkits import make_toolkit
from flashinfer_sm120.core.view.meta import META_NAME, check_view
from flashinfer_sm120.core.view.build import linkable_home
from flashinfer_sm120.errors import ViewError
from flashinfer_sm120.core.view import build as view_build
from flashinfer_sm120.core.toolkit.probe import inspect
from helpers.views import can_unshare, dynamic_section, pip_like, tmp_dirs


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHINFER_SM120_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _views(cache):
    return sorted(n for n in os.listdir(cache / "cuda-home") if n.startswith("cuda-"))


# --------------------------------------------------------------------------- layout


def test_view_makes_pip_prefix_linkable(tmp_path, cache):
    root = pip_like(tmp_path)
    home = linkable_home(inspect(str(root)))
    assert home.is_view and home.path.startswith(str(cache)) and os.path.isabs(home.path)
    v = home.path
    assert os.path.realpath(os.path.join(v, "bin", "nvcc")) == str(root / "bin" / "nvcc")
    assert os.readlink(os.path.join(v, "lib64", "libcudart.so")) == "libcudart.so.13"
    assert os.path.realpath(os.path.join(v, "lib64", "libcudart.so")) == str(root / "lib" / "libcudart.so.13")
    stub = os.path.join(v, "lib64", "stubs", "libcuda.so")
    with open(stub, "rb") as fh:
        assert fh.read(4) == b"\x7fELF"
    if shutil.which("readelf"):
        assert "Library soname: [libcuda.so.1]" in dynamic_section(stub)
    assert os.path.isfile(os.path.join(v, "include", "curand.h"))
    assert set(home.added) == {"lib64/libcudart.so", "lib64/stubs/libcuda.so"}


def test_view_is_reused_and_a_damaged_one_is_replaced_under_a_new_name(tmp_path, cache):
    tk = inspect(str(pip_like(tmp_path)))
    first = linkable_home(tk)
    stub = os.path.join(first.path, "lib64", "stubs", "libcuda.so")
    mtime = os.stat(stub).st_mtime_ns
    assert linkable_home(tk).path == first.path
    assert os.stat(stub).st_mtime_ns == mtime  # not rebuilt
    os.unlink(stub)  # damage it: a process may still be using it, so it is left alone
    again = linkable_home(tk)
    assert again.path == first.path + ".1" and os.path.isfile(os.path.join(again.path, "lib64/stubs/libcuda.so"))
    assert os.path.isdir(first.path) and not os.path.lexists(stub)
    assert linkable_home(tk).path == again.path
    assert not tmp_dirs(cache / "cuda-home")


def test_headers_installed_after_the_view_was_built_appear_in_it(tmp_path, cache):
    """``pip install 'cuda-toolkit[cublas]'`` (the fix ``build norm`` prints) adds cublasLt.h to the
    toolkit; the same view (same cuda_home, so no ninja rebuild) must then carry it."""
    root = pip_like(tmp_path)
    tk = inspect(str(root))
    first = linkable_home(tk)
    assert not os.path.lexists(os.path.join(first.path, "include", "cublasLt.h"))
    (root / "include" / "cublasLt.h").write_text("/* cuBLASLt */\n")
    again = linkable_home(inspect(str(root)))
    assert again.path == first.path
    assert os.path.realpath(os.path.join(again.path, "include", "cublasLt.h")) == str(root / "include" / "cublasLt.h")
    assert linkable_home(inspect(str(root))).path == first.path  # still adoptable


def test_view_built_under_a_group_writable_umask_is_adopted(tmp_path, cache):
    """umask 002 (user private groups) must not make our own view fail its own check."""
    tk = inspect(str(pip_like(tmp_path)))
    old = os.umask(0o002)
    try:
        first = linkable_home(tk)
        assert check_view(first.path, tk, first.curand_include)[1] is None
        assert linkable_home(tk).path == first.path
    finally:
        os.umask(old)


def test_toolkit_path_ninja_cannot_carry_gets_a_view(tmp_path, cache):
    """FlashInfer writes ``cuda_home = <path>`` unquoted into build.ninja: a complete toolkit
    under a path with a space is handed over through a view with a safe path."""
    root = make_toolkit(tmp_path / "my cuda" / "cuda-12.9", "12.9.41", curand=True)
    home = linkable_home(inspect(str(root)))
    assert home.is_view and home.path.startswith(str(cache)) and " " not in home.path
    assert home.added == ()
    assert os.path.realpath(os.path.join(home.path, "bin", "nvcc")) == str(root / "bin" / "nvcc")
    assert os.path.realpath(os.path.join(home.path, "lib64", "stubs", "libcuda.so")) == \
        str(root / "lib64" / "stubs" / "libcuda.so")
    assert linkable_home(inspect(str(root))).path == home.path


def test_complete_toolkit_needs_no_view(tmp_path, cache):
    root = make_toolkit(tmp_path / "cuda-12.9", "12.9.41", curand=True)
    home = linkable_home(inspect(str(root)))
    assert not home.is_view and home.path == str(root) and not (cache / "cuda-home").exists()


def test_curand_taken_from_pip_when_toolkit_lacks_it(tmp_path, cache, monkeypatch):
    root = make_toolkit(tmp_path / "cuda-13.0", "13.0.88")  # no curand.h
    site_dir = tmp_path / "site"
    inc = site_dir / "nvidia" / "cu13" / "include"
    inc.mkdir(parents=True)
    (inc / "curand.h").write_text("/* pip curand */\n")
    (inc / "curand_kernel.h").write_text("/* pip curand */\n")
    monkeypatch.setattr(view_build, "site_dirs", lambda: [str(site_dir)])
    home = linkable_home(inspect(str(root)))
    assert home.is_view and home.curand_include == str(inc) and "include/curand.h" in home.added
    assert os.path.realpath(os.path.join(home.path, "include", "curand_kernel.h")) == str(inc / "curand_kernel.h")
    assert linkable_home(inspect(str(root))).path == home.path  # its links pass the check


@pytest.mark.parametrize("pip", [True, False])
def test_toolkit_without_libcudart_names_the_right_fix(tmp_path, cache, pip):
    root = pip_like(tmp_path) if pip else make_toolkit(tmp_path / "cuda-12.8", "12.8.93", lib64=False)
    if pip:
        os.unlink(root / "lib" / "libcudart.so.13")
        (root / "lib" / "libcurand.so.10").write_text("")  # lib dir found, runtime missing
    tk = inspect(str(root))
    if pip:
        tk = dataclasses.replace(tk, sources=("pip",))
    with pytest.raises(ViewError) as exc:
        linkable_home(tk)
    msg = str(exc.value)
    assert f"toolkit {root} has no libcudart.so*" in msg
    assert ("cuda-toolkit[nvcc,cccl,curand]==13.0.*" in msg) == pip and ("reinstall CUDA 12.8" in msg) != pip
    assert not tmp_dirs(cache / "cuda-home")


# --------------------------------------------------------------------------- item 4: adoption


def _other_toolkit(tmp_path):
    return make_toolkit(tmp_path / "evil", "13.0.88", nvcc_script="#!/bin/sh\necho EVIL\n")


def _tamper_cases(tmp_path):
    evil_bin = str(_other_toolkit(tmp_path) / "bin")

    def repoint_bin(v):
        os.unlink(os.path.join(v, "bin"))
        os.symlink(evil_bin, os.path.join(v, "bin"))

    def relative_escape(v):
        os.unlink(os.path.join(v, "bin"))
        os.symlink(os.path.relpath(evil_bin, v), os.path.join(v, "bin"))

    def real_bin_dir(v):
        os.unlink(os.path.join(v, "bin"))
        shutil.copytree(evil_bin, os.path.join(v, "bin"))

    def include_link(v):
        os.unlink(os.path.join(v, "include", "cuda_runtime_api.h"))
        os.symlink(os.path.join(evil_bin, "nvcc"), os.path.join(v, "include", "cuda_runtime_api.h"))

    def new_stub(v):
        with open(os.path.join(v, "lib64", "stubs", "libcuda.so"), "ab") as fh:
            fh.write(b"\0")

    def group_writable(v):
        os.chmod(v, 0o775)

    def meta_other_toolkit(v):
        meta = json.load(open(os.path.join(v, META_NAME)))
        meta["toolkit"] = os.path.dirname(evil_bin)
        with open(os.path.join(v, META_NAME), "w") as fh:
            json.dump(meta, fh)

    cases = [repoint_bin, relative_escape, real_bin_dir, include_link, new_stub, group_writable,
             meta_other_toolkit]
    if os.geteuid() == 0:
        def other_uid_dir(v):
            os.chown(v, 12345, 12345)

        def other_uid_link(v):
            os.lchown(os.path.join(v, "bin"), 12345, 12345)

        def other_uid_meta(v):
            os.chown(os.path.join(v, META_NAME), 12345, 12345)

        cases += [other_uid_dir, other_uid_link, other_uid_meta]
    return cases


def test_altered_or_foreign_view_is_never_adopted(tmp_path, cache, caplog):
    tk = inspect(str(pip_like(tmp_path)))
    good = linkable_home(tk)
    for n, tamper in enumerate(_tamper_cases(tmp_path), start=1):
        tamper(linkable_home(tk).path)  # the view current processes would adopt
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="flashinfer_sm120"):
            home = linkable_home(tk)
        assert home.path == f"{good.path}.{n}", tamper.__name__
        assert os.path.realpath(os.path.join(home.path, "bin", "nvcc")) == tk.nvcc, tamper.__name__
        assert "not adopting CUDA_HOME view" in caplog.text, tamper.__name__


def test_check_view_names_the_reason(tmp_path, cache):
    tk = inspect(str(pip_like(tmp_path)))
    home = linkable_home(tk)
    assert check_view(home.path, tk, home.curand_include)[0] == home
    os.unlink(os.path.join(home.path, "bin"))
    os.symlink("/usr/bin", os.path.join(home.path, "bin"))
    adopted, why = check_view(home.path, tk, home.curand_include)
    assert adopted is None and "bin points to /usr/bin, outside the toolkit" in why


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                    reason="needs root and setpriv(1) to run as a second uid")
def test_second_uid_never_adopts_a_view_planted_by_another(tmp_path):
    """uid A (root here) plants a view whose bin points at another nvcc in uid B's cache
    dir; B must build its own view, never run A's nvcc."""
    base = tempfile.mkdtemp(prefix="sm120-uid-")
    try:
        os.chmod(base, 0o755)
        from pathlib import Path

        root = pip_like(Path(base))
        evil = make_toolkit(Path(base) / "evil", "13.0.88", nvcc_script="#!/bin/sh\necho EVIL\n")
        acache, bcache = Path(base) / "acache", Path(base) / "bcache"
        os.environ["FLASHINFER_SM120_CACHE_DIR"] = str(acache)
        try:  # A builds a view with our code, then repoints bin like the attacker in the issue
            built = linkable_home(inspect(str(root))).path
        finally:
            del os.environ["FLASHINFER_SM120_CACHE_DIR"]
        os.unlink(os.path.join(built, "bin"))
        os.symlink(str(evil / "bin"), os.path.join(built, "bin"))
        (bcache / "cuda-home").mkdir(parents=True, mode=0o700)  # B's own cache dir...
        for d in (bcache, bcache / "cuda-home"):
            os.chmod(d, 0o700)
            os.chown(d, 12345, 12345)
        planted = str(bcache / "cuda-home" / os.path.basename(built))
        os.rename(built, planted)  # ...where A's view lies under the name B will look for
        env = dict(os.environ, FLASHINFER_SM120_CACHE_DIR=str(bcache), HOME=base,
                   PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
        code = textwrap.dedent(f"""
            import json, os
            from flashinfer_sm120.core.toolkit.probe import inspect
            from flashinfer_sm120.core.view.build import linkable_home
            h = linkable_home(inspect({str(root)!r}))
            print("@@" + json.dumps([h.path, os.path.realpath(os.path.join(h.path, "bin", "nvcc"))]))
        """)
        out = subprocess.run(["setpriv", "--reuid=12345", "--regid=12345", "--clear-groups",
                              sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
        line = [x for x in out.stdout.splitlines() if x.startswith("@@")]
        assert line, out.stderr
        path, nvcc = json.loads(line[-1][2:])
        assert path != planted and nvcc == str(root / "bin" / "nvcc")
        assert os.stat(path).st_uid == 12345
    finally:
        shutil.rmtree(base, ignore_errors=True)


# --------------------------------------------------------------------------- item 11: wrong-typed metadata


@pytest.mark.parametrize("content", [
    "[1]", '"a string"', "123", "null", "{", "\xff\xfe",
    {"added": 5}, {"added": ["lib64/evil"]}, {"layout": "2"}, {"owner_uid": True},
    {"nvcc_fingerprint": [1, 2]}, {"nvcc_fingerprint": "x"}, {"toolkit": None}, {"extra": 1},
])
def test_wrong_typed_metadata_is_not_adopted_and_named(tmp_path, cache, caplog, content):
    tk = inspect(str(pip_like(tmp_path)))
    first = linkable_home(tk)
    meta_path = os.path.join(first.path, META_NAME)
    if isinstance(content, dict):
        meta = json.load(open(meta_path))
        meta.update(content)
        content = json.dumps(meta)
    with open(meta_path, "w", encoding="latin-1") as fh:
        fh.write(content)
    with caplog.at_level(logging.INFO, logger="flashinfer_sm120"):
        home = linkable_home(tk)
    assert home.path == first.path + ".1"
    assert set(home.added) == {"lib64/libcudart.so", "lib64/stubs/libcuda.so"}
    assert meta_path in caplog.text


def test_metadata_that_is_a_fifo_symlink_or_huge_is_not_adopted(tmp_path, cache):
    tk = inspect(str(pip_like(tmp_path)))
    paths = [linkable_home(tk).path]
    for make in (lambda p: os.mkfifo(p), lambda p: os.symlink("/etc/hostname", p),
                 lambda p: open(p, "w").write(" " * (1 << 20))):
        meta_path = os.path.join(paths[-1], META_NAME)
        keep = open(meta_path).read()
        os.unlink(meta_path)
        make(meta_path)
        with hang_guard(60):  # a FIFO opened for reading waits for a writer forever
            paths.append(linkable_home(tk).path)
        assert paths[-1] != paths[-2] and json.load(open(os.path.join(paths[-1], META_NAME))) != keep


# --------------------------------------------------------------------------- disk full / not writable


def test_disk_full_names_the_directory_and_the_variable(tmp_path, cache, monkeypatch):
    tk = inspect(str(pip_like(tmp_path)))
    real_symlink = os.symlink
    calls = []

    def full(src, dst, *a, **k):
        calls.append(dst)
        if len(calls) > 3:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), dst)
        return real_symlink(src, dst, *a, **k)

    monkeypatch.setattr(os, "symlink", full)
    with pytest.raises(ViewError) as exc:
        linkable_home(tk)
    msg = str(exc.value)
    parent = str(cache / "cuda-home")
    assert f"in {parent}:" in msg and "full" in msg and "FLASHINFER_SM120_CACHE_DIR" in msg
    assert not tmp_dirs(parent) and not _views(cache)
    monkeypatch.setattr(os, "symlink", real_symlink)
    assert linkable_home(tk).is_view  # space freed: it works


def test_unusable_cache_dir_falls_back_with_a_named_warning(tmp_path, monkeypatch):
    """An unusable FLASHINFER_SM120_CACHE_DIR is refused by the per-uid cache root
    (flashinfer_sm120.safety.fs.statedir) with a warning naming it; the view goes to the next candidate."""
    from flashinfer_sm120.safety.fs import statedir

    statedir.forget_cache_root()
    bad = tmp_path / "file"  # root ignores permissions: a file, not a directory
    bad.write_text("")
    monkeypatch.setenv("FLASHINFER_SM120_CACHE_DIR", str(bad))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    try:
        home = linkable_home(inspect(str(pip_like(tmp_path))))
        assert home.path.startswith(str(tmp_path / "xdg"))
        assert any("FLASHINFER_SM120_CACHE_DIR" in n and str(bad) in n for n in statedir.cache_root_notes())
    finally:
        statedir.forget_cache_root()


def test_unusable_view_directory_names_the_fix(tmp_path, cache):
    cache.mkdir(mode=0o700)
    (cache / "cuda-home").write_text("")  # a file where the view directory should be
    with pytest.raises(ViewError) as exc:
        linkable_home(inspect(str(pip_like(tmp_path))))
    assert str(cache / "cuda-home") in str(exc.value) and "FLASHINFER_SM120_CACHE_DIR" in str(exc.value)


def test_real_enospc_and_read_only_in_a_private_mount_namespace(tmp_path):
    why = can_unshare()
    if why:
        pytest.skip(why)
    root = pip_like(tmp_path)
    full, ro = tmp_path / "full", tmp_path / "ro"
    full.mkdir()
    ro.mkdir()
    code = textwrap.dedent(f"""
        import json, os
        from flashinfer_sm120.core.toolkit.probe import inspect
        from flashinfer_sm120.core.view.build import linkable_home
        from flashinfer_sm120.errors import ViewError
        out = {{}}
        for name, d in (("full", {str(full)!r}), ("ro", {str(ro)!r})):
            os.environ["FLASHINFER_SM120_CACHE_DIR"] = d
            try:
                out[name] = "built " + linkable_home(inspect({str(root)!r})).path
            except ViewError as exc:
                out[name] = str(exc)
            out[name + "_left"] = [n for n in os.listdir(os.path.join(d, "cuda-home"))
                                   if n.startswith(".tmp-")] if os.path.isdir(os.path.join(d, "cuda-home")) else []
        print("@@" + json.dumps(out))
    """)
    script = (f"mount -t tmpfs -o nr_inodes=12,mode=0700 none {full} && "
              f"mount -t tmpfs -o mode=0700 none {ro} && mkdir -m 700 {ro}/cuda-home && "
              f"mount -o remount,ro {ro} && exec {sys.executable} -c \"$0\"")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script, code],
                          capture_output=True, text=True, env=env, timeout=120)
    line = [x for x in proc.stdout.splitlines() if x.startswith("@@")]
    assert line, proc.stderr
    out = json.loads(line[-1][2:])
    assert f"in {full}/cuda-home:" in out["full"] and "full" in out["full"], out
    assert "FLASHINFER_SM120_CACHE_DIR" in out["full"] and out["full_left"] == []
    assert f"{ro}/cuda-home" in out["ro"] and "FLASHINFER_SM120_CACHE_DIR" in out["ro"], out


# --------------------------------------------------------------------------- item 14: kill -9 mid-build


def test_kill_9_during_a_build_leaves_nothing_behind(tmp_path, cache):
    root = pip_like(tmp_path)
    flag = tmp_path / "building"
    code = textwrap.dedent(f"""
        import os, time
        from flashinfer_sm120.core.view.meta import META_NAME, check_view
        from flashinfer_sm120.core.view.build import linkable_home
        from flashinfer_sm120.core.toolkit.probe import inspect
        from flashinfer_sm120.core.view import build
        real = build._assemble
        def slow(tmp, *a):
            meta = real(tmp, *a)
            open({str(flag)!r}, "w").close()
            time.sleep(600)
        build._assemble = slow
        linkable_home(inspect({str(root)!r}))
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    parent = cache / "cuda-home"
    for _ in range(2):  # two dead builders: the second removes what the first left
        child = subprocess.Popen([sys.executable, "-c", code], env=env)
        deadline = time.monotonic() + 60
        while not flag.exists() and time.monotonic() < deadline and child.poll() is None:
            time.sleep(0.05)
        assert flag.exists(), "the child never reached the build"
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        flag.unlink()
        abandoned(*(parent / n for n in tmp_dirs(parent)))  # past the grace a live builder has
    assert len(tmp_dirs(parent)) == 1 and not _views(cache)
    home = linkable_home(inspect(str(root)))  # the next builder cleans up
    assert home.is_view and not tmp_dirs(parent)


def test_leftovers_are_cleaned_by_a_process_that_only_adopts(tmp_path, cache):
    """Only what no live builder holds goes (threat-model: P3, P5): no guess from a pid."""
    from flashinfer_sm120.safety.fs import atomic

    tk = inspect(str(pip_like(tmp_path)))
    home = linkable_home(tk)
    parent = cache / "cuda-home"
    dead = parent / ".tmp-dead"  # its builder was killed long ago
    dead.mkdir()
    live = atomic.make_private(".tmp-", str(parent))  # a live builder's, however old: kept
    fresh = parent / ".tmp-fresh"  # not held yet, but younger than the grace: kept
    fresh.mkdir()
    abandoned(dead, live.path)
    try:
        assert linkable_home(tk).path == home.path
        assert tmp_dirs(parent) == sorted([fresh.name, os.path.basename(live.path)])
    finally:
        live.close()


def test_an_existing_view_is_used_where_nothing_can_be_written(tmp_path, cache, monkeypatch):
    """A read-only image's cache serves the views built into it: adopting one opens nothing for writing and
    takes no lock (P3 holds there: nothing on a read-only file system can be removed)."""
    tk = inspect(str(pip_like(tmp_path)))
    home = linkable_home(tk)
    real_open = os.open

    def read_only(p, flags, *mode, **kw):
        if flags & (os.O_RDWR | os.O_WRONLY | os.O_CREAT):
            raise OSError(errno.EROFS, "Read-only file system", p)
        return real_open(p, flags, *mode, **kw)

    monkeypatch.setattr(os, "open", read_only)
    assert linkable_home(tk).path == home.path
