"""A wrapper cannot hide an untrusted nvcc and is never run to find it (P2); state files of any
shape or date are read bounded, as data (P6); a dangling, empty or read-only cache or site directory
is refused or passed over, never widened (P4).  Fast: no FlashInfer import, no compile."""

from __future__ import annotations

import json
import os
import sys

import pytest

from helpers.toolkits import script
from helpers.untrusted import RELEASE_LINE, tmp_is_trusted, toolkit_with_nvcc, untrusted_nvcc


# --------------------------------------------------------------- trust: wrappers that hide what they run

def _system_files(n: int) -> list[str]:
    """``n`` existing root-owned files (named by a script before the one that matters)."""
    d = "/usr/bin"
    return [os.path.join(d, f) for f in sorted(os.listdir(d))
            if os.path.isfile(os.path.join(d, f)) and not os.path.islink(os.path.join(d, f))][:n]


def _hiding_wrappers(evil: str) -> dict[str, str]:
    return {
        # the exec line sits past the 8 KiB that used to be read
        "long script": "#!/bin/sh\n" + "# padding\n" * 1000 + f'exec {evil} "$@"\n',
        # Linux hands the rest of the #! line to the interpreter: sh runs that file
        "#! argument": f"#!/bin/sh {evil}\n",
        # coreutils env -S splits the line: sh runs that file
        "env -S": f"#!/usr/bin/env -S sh {evil}\n",
        "env --split-string": f"#!/usr/bin/env --split-string=sh {evil}\n",
        # a relative script for the interpreter depends on the working directory
        "relative #! argument": "#!/bin/sh nvcc-real\n",
        # the untrusted file is run as an argument, not in command position
        "argument of sh": f'#!/bin/sh\nsh {evil}.sh "$@"\n',
        "argument after 40 other paths": "#!/bin/sh\n" + "".join(f": {p}\n" for p in _system_files(40))
        + f'exec sh {evil}.sh "$@"\n',
    }


@pytest.mark.parametrize("case", list(_hiding_wrappers("X")))
def test_a_wrapper_cannot_hide_an_untrusted_nvcc(tmp_path, case):
    if not tmp_is_trusted(tmp_path):
        pytest.skip("the test's tmp dir does not pass the trust rule itself")
    from flashinfer_sm120.safety.trust import trace

    evil, _ = untrusted_nvcc(tmp_path)
    w = script(tmp_path / "bin" / "nvcc", _hiding_wrappers(str(evil))[case])
    t = trace(str(w))
    assert t.problem is not None, f"{case}: trusted although it runs {evil}"
    assert ("evil" in t.problem or "cannot be checked" in t.problem or "too large" in t.problem), t.problem


def test_inspect_never_runs_the_hidden_nvcc(tmp_path, cache_dir):
    """End to end: the toolkit is refused and the untrusted binary never runs."""
    if not tmp_is_trusted(tmp_path):
        pytest.skip("the test's tmp dir does not pass the trust rule itself")
    from flashinfer_sm120.core.toolkit.probe import inspect

    evil, marker = untrusted_nvcc(tmp_path)
    for i, text in enumerate(_hiding_wrappers(str(evil)).values()):
        tk = inspect(str(toolkit_with_nvcc(tmp_path / f"tk{i}", text)))
        assert tk.problem and tk.nvcc_version is None, tk
        assert not marker.exists(), f"{text[:40]!r}: the untrusted nvcc was run"


def test_ordinary_wrappers_are_still_followed(tmp_path):
    """The stricter #! rule keeps the wrappers distributions really ship."""
    if not tmp_is_trusted(tmp_path):
        pytest.skip("the test's tmp dir does not pass the trust rule itself")
    from flashinfer_sm120.safety.trust import trace

    real = script(tmp_path / "real" / "bin" / "nvcc", f'#!/bin/sh\necho "{RELEASE_LINE}"\n')
    # ("#!/usr/bin/env sh" finds the shell on PATH when it runs: refused since issue 11, see test_boundary)
    for i, head in enumerate(["#!/bin/sh", "#!/bin/sh -e", "#! /bin/sh", "#!/bin/bash -eu",
                              f"#!/bin/sh {real}"]):
        w = script(tmp_path / f"w{i}" / "bin" / "nvcc", f'{head}\nexec {real} "$@"\n')
        t = trace(str(w))
        assert t.problem is None and t.target == str(real.resolve()), (head, t)


# --------------------------------------------------------------- state files

def test_deeply_nested_state_file_is_ignored_not_raised(cache_dir):
    """A corrupt memo ('[[[[...') must be ignored and rewritten, not raise RecursionError."""
    from flashinfer_sm120.safety.fs import atomic
    from flashinfer_sm120.core.toolkit import memo
    from flashinfer_sm120.safety.ownership import fingerprint

    path = memo.VERSIONS.path()
    with open(path, "w") as fh:
        fh.write("[" * 100_000 + "]" * 100_000)
    data, why = atomic.read_json(path)
    assert data is None and "nested" in why
    assert memo.VERSIONS.lookup("/bin/sh", fingerprint("/bin/sh")) is None
    memo.VERSIONS.store("/bin/sh", fingerprint("/bin/sh"), {"full": "13.0.88", "problem": None})
    assert memo.VERSIONS.lookup("/bin/sh", fingerprint("/bin/sh")) ["full"] == "13.0.88"


@pytest.mark.parametrize("at", ["NaN", "Infinity", "1" + "0" * 400])
def test_a_failure_dated_nan_or_huge_expires(cache_dir, at):
    """A failure entry with a non-finite time must not be remembered forever (nor raise)."""
    from flashinfer_sm120.core.toolkit import memo
    from flashinfer_sm120.safety import ownership

    path = memo.VERSIONS.path()
    entry = {"stat": ownership.fingerprint("/bin/sh"), "full": None, "problem": "hung", "at": 0}
    text = json.dumps({"schema": memo.Memo.SCHEMA, "entries": {"/bin/sh": entry}}).replace('"at": 0', f'"at": {at}')
    with open(path, "w") as fh:
        fh.write(text)
    assert memo.VERSIONS.lookup("/bin/sh", ownership.fingerprint("/bin/sh")) is None


def test_a_dangling_cache_dir_symlink_is_refused(tmp_path, monkeypatch):
    """FLASHINFER_SM120_CACHE_DIR -> a missing directory: refused (whoever creates the target
    later would own our state), and the next candidate is used."""
    from flashinfer_sm120.safety.fs import statedir

    link = tmp_path / "link"
    link.symlink_to(tmp_path / "missing")
    monkeypatch.setenv("FLASHINFER_SM120_CACHE_DIR", str(link))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    statedir.forget_cache_root()
    try:
        root = statedir.cache_root()
        notes = statedir.cache_root_notes()
    finally:
        statedir.forget_cache_root()
    assert root == os.path.realpath(tmp_path / "xdg" / "flashinfer-sm120")
    assert os.path.isdir(root)
    assert any("does not exist" in n for n in notes)


# --------------------------------------------------------------- enable / disable

@pytest.mark.parametrize("cmd", ["enable", "disable"])
@pytest.mark.parametrize("value", ["", "  "])
def test_an_empty_site_dir_is_refused_not_widened(tmp_path, monkeypatch, capsys, cmd, value):
    """``--site-dir "$DIR"`` with DIR unset used to write into (or remove from) the whole
    environment's site-packages instead of refusing."""
    from flashinfer_sm120 import cli
    from flashinfer_sm120.core.autoload_hook import PTH_NAME
    from flashinfer_sm120.cli import enable

    env_site = tmp_path / "env-site"
    env_site.mkdir()
    if cmd == "disable":
        (env_site / PTH_NAME).write_text("import sys\n")
    # never the real environment's site-packages, even when the fix is missing
    monkeypatch.setattr(enable, "_purelib", lambda: str(env_site))
    monkeypatch.setattr(enable.site, "getsitepackages", lambda: [str(env_site)])
    monkeypatch.setattr(enable.site, "getusersitepackages", lambda: str(env_site))
    rc = cli.main([cmd, "--site-dir", value])
    err = capsys.readouterr().err
    assert rc == 2 and f"--site-dir {value!r}" in err and "Fix: give one of those, or leave --site-dir out" in err
    assert (env_site / PTH_NAME).exists() == (cmd == "disable")


def test_a_read_only_cache_candidate_falls_through(tmp_path):
    """An existing cache dir on a read-only mount (a container image's ~/.cache) used to be
    chosen, so no view could be built and FlashInfer was not patched at all; the next
    candidate must be used instead."""
    from helpers.probing import in_namespace, unshare_ok

    if os.geteuid() != 0 or not unshare_ok():
        pytest.skip("needs root and 'unshare -m' for a read-only mount")
    ro, home = tmp_path / "ro", tmp_path / "home"
    (ro / "flashinfer-sm120").mkdir(parents=True, mode=0o700)
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "FLASHINFER_SM120_CACHE_DIR"}
    env.update(XDG_CACHE_HOME=str(ro), HOME=str(home))
    code = "from flashinfer_sm120.safety.fs import statedir; print(statedir.cache_root())"
    proc = in_namespace(f"mount --bind {ro} {ro}; mount -o remount,bind,ro {ro}\n"
                        f"{sys.executable} -c '{code}'", env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == os.path.realpath(home / ".cache" / "flashinfer-sm120"), proc.stdout
    assert "not writable" in proc.stderr
