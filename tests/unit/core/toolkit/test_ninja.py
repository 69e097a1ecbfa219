"""One ninja for the whole process (issue 12 items 1 and 2).

Item 1: vLLM 0.33's has_flashinfer() needs ``shutil.which("ninja")`` and FlashInfer's
run_ninja runs ``ninja`` from PATH, but the ninja wheel lives in the venv's bin, off
PATH under systemd: the export puts the chosen ninja first (through a link-only
directory, so the venv's python is not put first too), and ``build`` runs that one.
Item 2: ninja 1.11 (Debian, .ninja_log v5) and 1.13 (the wheel, v7) rebuild each
other's work: the choice is one ninja, and doctor warns about the other with the fix.
The decision logic runs on fake ninjas; the last test uses the real two where present.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from flashinfer_sm120.diagnose.verify.diagnosis import diagnose
from flashinfer_sm120.diagnose.verify.report import log_format_of_dir, ninja_section
from packaging.version import Version

from helpers.toolkits import make_toolkit
from helpers.servers import fake_ninja, wheel_ninja

from flashinfer_sm120.core.jitenv import environ
from flashinfer_sm120.core.toolkit import ninja


@pytest.fixture
def fakes(tmp_path, monkeypatch):
    """A fake wheel ninja 1.13.2 in a venv-like bin (next to python3), a fake Debian 1.11.1
    first on PATH; FIND_STEPS: the fake wheel, then PATH."""
    venv_bin = tmp_path / "venv" / "bin"
    wheel = fake_ninja(venv_bin / "ninja", "1.13.2.git.kitware.jobserver-pipe-1")
    fake_ninja(venv_bin / "python3", "3.11.7")
    debian = fake_ninja(tmp_path / "usr" / "bin" / "ninja", "1.11.1")
    monkeypatch.setattr(ninja, "FIND_STEPS", (("ninja wheel", lambda p: [(str(wheel), "the ninja wheel 1.13.2")]),
                                              ("PATH", ninja._on_path)))
    monkeypatch.setenv("PATH", f"{debian.parent}:/usr/bin:/bin")
    monkeypatch.setenv("FLASHINFER_SM120_CACHE_DIR", str(tmp_path / "sm120"))
    return {"wheel": str(wheel), "debian": str(debian), "venv_bin": str(venv_bin)}


@pytest.mark.parametrize("version,fmt", [("1.5.0", 5), ("1.10.2", 5), ("1.11.1", 5), ("1.12.0", 6), ("1.12.1", 6),
                                         ("1.13.0", 7), ("1.13.2", 7), ("1.14.0", None), ("1.4.0", None)])
def test_log_format_per_release_from_ninja_build_log_cc(version, fmt):
    assert ninja.Ninja("ninja", "ninja", (), Version(version)).log_format == fmt


def test_the_wheel_next_to_flashinfer_is_chosen_over_the_first_on_path(fakes):
    found = ninja.candidates()
    assert [n.path for n in found][:2] == [fakes["wheel"], fakes["debian"]]
    chosen = ninja.choose(found=found)
    assert chosen.path == fakes["wheel"] and chosen.version == Version("1.13.2") and chosen.log_format == 7
    assert ninja.on_path() == fakes["debian"]  # what FlashInfer would run without the export
    assert not ninja.same_log(chosen, found[1])


def test_doctor_warns_about_a_second_ninja_with_another_log_format_and_says_the_fix(fakes):
    section = ninja_section({"after": {}})
    assert section["chosen"]["path"] == fakes["wheel"]
    assert fakes["debian"] in [c["path"] for c in section["conflicts"]]
    assert section["which_ninja"] == fakes["debian"]
    autoload: dict = {}

    def warning():
        (one,) = [f for f in diagnose({"ninja": section, "autoload": autoload}).findings
                  if f.text.startswith(fakes["debian"])]
        return one

    assert warning().text.startswith(f"{fakes['debian']} (ninja 1.11.1, .ninja_log v5) is reachable too")
    assert "'flashinfer-sm120 enable'" in warning().fix and "apt-get remove ninja-build" in warning().fix
    autoload["pth"] = ["/venv/site/flashinfer_sm120_autoload.pth"]
    assert "the autoload puts it first on PATH" in warning().text and "enable" not in warning().fix


def test_doctor_counts_modules_a_ninja_of_another_log_format_built(fakes, tmp_path):
    jit = tmp_path / "jit"
    for name, header in (("norm", "# ninja log v5\n"), ("sampling", "# ninja log v7\n"), ("rope", "garbage\n")):
        (jit / name).mkdir(parents=True)
        (jit / name / ".ninja_log").write_text(header + "0\t1\t0\tx.o\tabc\n")
    section = ninja_section({"after": {"jit_dir": str(jit)}})
    assert section["cache_log_formats"] == {"5": 1, "7": 1}
    (found,) = [f for f in diagnose({"ninja": section}).findings if f.code == "ninja-log-format"]
    assert found.text.startswith(f"1 module in {jit} were built by a ninja with .ninja_log v5") and "build" in found.fix


def test_an_untrusted_ninja_is_never_run_and_the_next_is_chosen(fakes, tmp_path):
    marker = tmp_path / "ran"
    shared = tmp_path / "shared"
    bad = fake_ninja(shared / "ninja", "1.13.2")
    bad.write_text(f"#!/bin/sh\ntouch {marker}\necho 1.13.2\n")
    os.chmod(shared, 0o777)
    try:
        found = ninja.candidates(f"{shared}:{os.path.dirname(fakes['debian'])}")
    finally:
        os.chmod(shared, 0o755)
    refused = next(n for n in found if n.path == str(bad))
    assert refused.problem and "writable" in refused.problem and not marker.exists()
    assert ninja.choose(found=found).path != str(bad)


def test_no_ninja_names_the_fix(monkeypatch):
    monkeypatch.setattr(ninja, "FIND_STEPS", ())
    with pytest.raises(ninja.NinjaError, match="Fix: pip install ninja"):
        ninja.choose()


def test_export_puts_the_chosen_ninja_first_without_putting_the_venv_python_first(fakes, tmp_path):
    home = make_toolkit(tmp_path / "cuda-13.0", "13.0.88")
    before = os.environ["PATH"]
    undo = environ.export(str(home), str(home / "bin" / "nvcc"), [(12, "0f")])
    try:
        which = shutil.which("ninja")
        assert os.path.realpath(which) == fakes["wheel"]  # FlashInfer's run_ninja and vLLM see the wheel's
        link_dir = os.path.dirname(which)
        assert os.listdir(link_dir) == ["ninja"] and link_dir.startswith(str(tmp_path / "sm120"))
        assert oct(os.stat(os.path.dirname(link_dir)).st_mode & 0o777) == "0o700"
        assert shutil.which("python3") != os.path.join(fakes["venv_bin"], "python3")
        assert os.environ["PATH"].startswith(f"{home}/bin:{link_dir}:")  # nvcc's entry stays first
        info = environ.exported()
        assert "a link to" in info["ninja"] and "also holds a Python interpreter" in info["ninja"]
        assert info["which_ninja"] == which
        # the same export again (another worker): the same directory, nothing rebuilt
        assert ninja.link_dir(ninja.choose()) == link_dir
    finally:
        undo()
    assert os.environ["PATH"] == before


def test_export_uses_the_ninjas_own_directory_when_it_shadows_nothing(fakes, tmp_path, monkeypatch):
    solo = fake_ninja(tmp_path / "tools" / "ninja", "1.13.2")
    monkeypatch.setattr(ninja, "FIND_STEPS", (("ninja wheel", lambda p: [(str(solo), "the ninja wheel 1.13.2")]),))
    home = make_toolkit(tmp_path / "cuda-13.0", "13.0.88")
    undo = environ.export(str(home), str(home / "bin" / "nvcc"), [(12, "0f")])
    try:
        assert shutil.which("ninja") == str(solo) and not (tmp_path / "sm120" / "ninja").exists()
    finally:
        undo()


def test_a_planted_link_directory_is_not_adopted(fakes, tmp_path):
    chosen = ninja.choose()
    d = ninja.link_dir(chosen)
    os.unlink(os.path.join(d, "ninja"))
    os.symlink("/bin/false", os.path.join(d, "ninja"))  # someone repointed it
    with pytest.raises(ninja.NinjaError, match="is not a link to"):
        ninja.link_dir(chosen)


def test_what_a_killed_link_maker_left_is_swept(fakes):
    """A process killed between making the link directory and renaming it into place left its
    ``.tmp-*`` in the cache for good; the next maker sweeps it (the one rule of the atomic sweep)."""
    from helpers import abandoned

    chosen = ninja.choose()
    parent = os.path.dirname(ninja.link_dir(chosen))
    left = os.path.join(parent, ".tmp-killed")
    os.mkdir(left)
    abandoned(left)
    shutil.rmtree(ninja.link_dir(chosen))  # the next export has one to make
    ninja.link_dir(chosen)
    assert not os.path.exists(left) and not [n for n in os.listdir(parent) if n.startswith(".tmp-")]


def test_build_runs_exactly_the_chosen_ninja(fakes):
    from flashinfer_sm120.warmup import moddir

    assert shutil.which("ninja") == fakes["debian"]
    assert moddir.ninja_binary() == fakes["wheel"]


def test_real_debian_and_wheel_ninjas_rebuild_each_others_work(tmp_path, capsys, monkeypatch):
    """Item 2 with the real binaries: Debian's ninja 1.11 (apt-get install ninja-build) and the
    ninja wheel's 1.13.  Where both exist, a build by the wheel's is work to do for Debian's."""
    debian, wheel = shutil.which("ninja", path="/usr/bin"), wheel_ninja()
    if not debian or not wheel:
        with capsys.disabled():
            print(f"\nSKIP reason: needs Debian's /usr/bin/ninja and the ninja wheel (found {debian}, {wheel}); "
                  f"apt-get install -y ninja-build")
        pytest.skip(f"needs Debian's /usr/bin/ninja and the ninja wheel (found {debian}, {wheel})")
    found = ninja.candidates(f"/usr/bin:{os.path.dirname(wheel)}")
    real = {n.path: n for n in found}
    if ninja.same_log(real[wheel], real[debian]):
        pytest.skip(f"{debian} and {wheel} write the same .ninja_log format")
    (tmp_path / "in.txt").write_text("x\n")
    (tmp_path / "build.ninja").write_text("rule cp\n  command = cp $in $out\nbuild out.txt: cp in.txt\n")

    def dry(binary):
        return subprocess.run([binary, "-n", "-C", str(tmp_path)], capture_output=True, text=True, timeout=60).stdout

    assert ninja.choose(found=found).path == wheel  # the wheel next to FlashInfer, though /usr/bin is first
    subprocess.run([wheel, "-C", str(tmp_path)], check=True, capture_output=True, timeout=60)
    assert log_format_of_dir(str(tmp_path)) == real[wheel].log_format
    assert "no work to do" in dry(wheel)
    assert "no work to do" not in dry(debian)  # Debian's ninja would run cp again: the cache is lost
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # a service's PATH: Debian's ninja first
    section = ninja_section({"after": {}})
    assert section["chosen"]["path"] == wheel and debian in {c["path"] for c in section["conflicts"]}
