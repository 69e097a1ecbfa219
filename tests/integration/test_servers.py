"""What vLLM and SGLang need at start-up, against stand-ins written from their released code
(tests/standins: vLLM 0.34.0, SGLang 0.5.23; the real packages: tests/integration/real_servers.sh).

Issue 12: 1 (vLLM's has_flashinfer needs ninja on PATH), 3 (SGLang moves FlashInfer's cache:
build, build --from and doctor follow), 4 (what SGLang checks, from its code), 5 (doctor
without a toolkit), and the guard's serving fallbacks.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import re
import shutil
import sys

import pytest

from helpers.child import run_py
from helpers.host import needs_flashinfer
from helpers.toolkits import make_toolkit
from helpers import ROOT, SRC
from helpers.child import cli
from helpers.servers import STANDINS, install_standins, wheel_ninja
from server_probe import uncovered

from flashinfer_sm120.core.facts import serverprobe, servers
from flashinfer_sm120.warmup import session



# ----------------------------------------------------------------------------- item 1


@pytest.mark.slow  # seconds: whole builds, servers or worker fleets in child processes
@needs_flashinfer
def test_vllm_has_flashinfer_with_the_venv_bin_off_path(server_env, real_nvcc13):
    """vLLM 0.33's has_flashinfer() is True after `import vllm` with the autoload, though neither
    nvcc nor ninja is on the service's PATH; the same value our servers table computes."""
    env, site_dir = server_env
    code = f"""
        import helpers.fakegpu, json, os, shutil, site
        site.addsitedir({str(site_dir)!r})
        import vllm
        from vllm.utils.flashinfer import has_flashinfer
        from flashinfer_sm120.core.facts import serverprobe
        ninja = shutil.which("ninja")
        print("@@" + json.dumps(dict(has=has_flashinfer(), ours=serverprobe.vllm_has_flashinfer(dict(os.environ)),
                                     ninja=ninja and os.path.realpath(ninja), nvcc=shutil.which("nvcc"))))
    """
    off, _ = run_py(code, dict(env, FLASHINFER_SM120_DISABLE="1"))
    assert off["has"] is False and off["ours"][0] is False and "no ninja on PATH" in off["ours"][1]
    on, proc = run_py(code, env)
    assert on["has"] is True, (on, proc.stderr[-3000:])
    assert on["ours"][0] is True
    assert on["ninja"] == os.path.realpath(wheel_ninja())  # the wheel next to FlashInfer


# ----------------------------------------------------------------------------- item 3


SERVER_JIT_DIR = """
    import helpers.fakegpu, json, os, site
    site.addsitedir({site!r})
    import sglang
    import flashinfer.jit.env as e
    print("@@" + json.dumps(dict(jit=str(e.FLASHINFER_JIT_DIR), base=os.environ.get("FLASHINFER_WORKSPACE_BASE"))))
"""


def _build(args, env):
    proc = cli(["build", "--arch", "12.0", "--ninja-only", "--json", *args], env, timeout=600, python=sys.executable)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout), proc


@pytest.mark.slow  # seconds: whole builds, servers or worker fleets in child processes
@needs_flashinfer
def test_build_lands_in_sglangs_jit_dir_when_sglang_is_installed(server_env, tmp_path, real_nvcc13):
    env, site_dir = server_env
    env["PYTHONPATH"] = env["PYTHONPATH"].replace(os.pathsep + str(STANDINS), "")
    install_standins(tmp_path / "sg", "sglang")  # SGLang alone is installed
    env["PYTHONPATH"] += os.pathsep + str(tmp_path / "sg")
    server, proc = run_py(SERVER_JIT_DIR.format(site=str(site_dir)), env)
    assert server["base"] == str(tmp_path / "home" / ".cache" / "sglang"), proc.stderr[-2000:]
    built, proc = _build(["activation"], env)
    assert built["jit_dir"] == server["jit"], proc.stderr[-2000:]  # the server finds what build wrote
    assert built["server"]["server"] == "sglang" and "installed" in built["server"]["why"]
    assert built["server"]["how"].startswith("read from ")  # the installed SGLang's own rule
    assert built["modules"][0]["ninja"].startswith(server["jit"])
    # --for vllm: FlashInfer's own directory, as vLLM leaves it
    built, _ = _build(["--for", "vllm", "activation"], env)
    assert built["jit_dir"].startswith(str(tmp_path / "home" / ".cache" / "flashinfer"))


@pytest.mark.slow  # seconds: whole builds, servers or worker fleets in child processes
@needs_flashinfer
def test_a_manifest_recorded_under_sglang_replays_into_sglangs_dir(server_env, tmp_path, real_nvcc13):
    env, site_dir = server_env
    manifest = tmp_path / "m.jsonl"
    rec = f"""
        import helpers.fakegpu, json, os, site
        site.addsitedir({str(site_dir)!r})
        import sglang, flashinfer_sm120
        from flashinfer.jit.core import MissingJITCacheError
        from flashinfer.activation import get_act_and_mul_module
        try:
            get_act_and_mul_module("silu")
        except MissingJITCacheError:
            pass
        print("@@" + json.dumps({{}}))
    """
    run_py(rec, dict(env, FLASHINFER_DISABLE_JIT="1", FLASHINFER_SM120_RECORD=str(manifest)))
    entry = json.loads(manifest.read_text().splitlines()[0])
    assert entry["server"] == "sglang" and entry["workspace_base"] == str(tmp_path / "home" / ".cache" / "sglang")
    # the builder: another HOME, no SGLang installed at all
    builder = dict(env, HOME=str(tmp_path / "builder"), PYTHONPATH=env["PYTHONPATH"].replace(
        os.pathsep + str(STANDINS), ""))
    (tmp_path / "builder").mkdir()
    built, proc = _build(["--from", str(manifest)], builder)
    assert built["jit_dir"].startswith(str(tmp_path / "builder" / ".cache" / "sglang" / ".cache" / "flashinfer")), \
        proc.stderr[-2000:]
    assert built["server"]["why"] == "the manifest was recorded under it"


def test_the_cache_rule_is_read_from_the_installed_sglang(tmp_path, monkeypatch):
    """The installed SGLang's own third_party_cache_defaults() decides, not our copy of it."""
    site = install_standins(tmp_path / "site", "sglang")
    environ_py = site / "sglang" / "srt" / "environ.py"
    environ_py.write_text(environ_py.read_text().replace('"FLASHINFER_WORKSPACE_BASE": base,',
                                                         '"FLASHINFER_WORKSPACE_BASE": base + "/moved",'))
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    env = {"HOME": str(tmp_path / "h"), "PATH": "/usr/bin:/bin"}
    base, how = serverprobe.workspace_base("sglang", env)
    assert base == str(tmp_path / "h" / ".cache" / "sglang" / "moved") and how.startswith(f"read from {environ_py}")
    assert serverprobe.workspace_base("sglang", dict(env, SGLANG_CACHE_DIR="~/sg"))[0] == str(tmp_path / "h" / "sg" / "moved")
    assert serverprobe.workspace_base("sglang", dict(env, FLASHINFER_WORKSPACE_BASE="/srv/fi")) == (
        "/srv/fi", "FLASHINFER_WORKSPACE_BASE is set, which sglang's setdefault keeps")
    assert serverprobe.workspace_base("vllm", env)[0] is None


def test_without_sglang_installed_the_rule_comes_from_the_table(tmp_path, monkeypatch):
    monkeypatch.setattr(serverprobe, "package_dir", lambda key: None)
    base, how = serverprobe.workspace_base("sglang", {"HOME": str(tmp_path), "SGLANG_CACHE_DIR": "~/x"})
    assert base == str(tmp_path / "x") and "sglang is not installed" in how and "third_party" not in how.split("(")[-1]


def test_build_for_is_needed_when_both_servers_would_use_different_dirs(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(install_standins(tmp_path / "site", "vllm", "sglang")))
    importlib.invalidate_caches()
    monkeypatch.setenv("HOME", str(tmp_path / "h"))
    monkeypatch.delenv("FLASHINFER_WORKSPACE_BASE", raising=False)
    monkeypatch.delenv("SGLANG_CACHE_DIR", raising=False)
    monkeypatch.delitem(sys.modules, "flashinfer.jit.env", raising=False)
    assert {i.release.key for i in servers.installed()} == {"vllm", "sglang"}
    with pytest.raises(session.BuildError, match="pass --for vllm or --for sglang"):
        session.apply_server_cache()
    assert session.apply_server_cache(strict=False)["changed"] is False  # doctor: leaves it, says so
    assert session.apply_server_cache("vllm")["changed"] is False and "FLASHINFER_WORKSPACE_BASE" not in os.environ
    out = session.apply_server_cache("sglang")
    assert out["changed"] and os.environ["FLASHINFER_WORKSPACE_BASE"] == str(tmp_path / "h" / ".cache" / "sglang")
    # set by the user: both servers keep it, nothing to decide
    monkeypatch.setenv("FLASHINFER_WORKSPACE_BASE", "/srv/fi")
    assert session.apply_server_cache()["base"] == "/srv/fi"
    monkeypatch.delenv("FLASHINFER_WORKSPACE_BASE")
    monkeypatch.setenv("SGLANG_CACHE_DIR", "")  # SGLang would set it to '' (a relative path)
    with pytest.raises(session.BuildError, match="relative path"):
        session.apply_server_cache("sglang")


# ----------------------------------------------------------------------------- item 4


@needs_flashinfer
def test_sglangs_own_jit_finds_the_exported_nvcc(server_env, real_nvcc13):
    """SGLang 0.5.23 checks no nvcc for FlashInfer; its own JIT (cuda_home, _jit_cuda_version)
    takes CUDA_HOME, which the early export after `import sglang` sets."""
    env, site_dir = server_env
    out, proc = run_py(f"""
        import helpers.fakegpu, json, os, site
        site.addsitedir({str(site_dir)!r})
        import sglang
        from sglang.kernels.jit.utils.compile.toolchain import cuda_home
        from sglang.kernels.jit.utils.arch import _jit_cuda_version
        from sglang.srt.utils.common import is_flashinfer_available
        res = __import__("flashinfer_sm120").resolve()
        print("@@" + json.dumps(dict(home=cuda_home(), ver=_jit_cuda_version(), chosen=res.home.path,
                                     nvcc=str(res.choice.toolkit.nvcc_version), fi=is_flashinfer_available(),
                                     cuda=__import__("torch").cuda.is_available() and __import__("torch").version.cuda is not None)))
    """, env)
    assert out["home"] == out["chosen"], proc.stderr[-2000:]
    assert ".".join(map(str, out["ver"])) == ".".join(out["nvcc"].split(".")[:2])  # the nvcc's, not torch's
    assert out["fi"] is out["cuda"]  # SGLang's is_cuda(): a CUDA torch seeing a GPU (False with a CPU torch)


def test_docs_say_what_the_servers_check_from_their_code():
    doc = (ROOT / "docs" / "servers.md").read_text()
    for needle in ("vllm/utils/flashinfer.py", "has_flashinfer()", "is_flashinfer_available()",
                   "sglang/srt/environ.py", "third_party_cache_defaults()", "cuda_home()", "_jit_cuda_version()",
                   "SGLANG_CACHE_DIR", "no work to do"):
        assert needle in doc, needle
    for row in servers.SERVERS:
        for fb in row.fallbacks:
            assert fb.text in doc, fb.text
    wrong = re.compile(r"SGLang's too|SGLang's ``?has_flashinfer|SGLang; see smg")
    texts = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *SRC.rglob("*.py")]
    assert [str(p) for p in texts if wrong.search(p.read_text())] == []


# ----------------------------------------------------------------------------- fallbacks


@needs_flashinfer
def test_the_guard_adds_the_installed_servers_own_ways_around_after_the_fix(clean_env, tmp_path):
    env = dict(clean_env, FAKE_GPU_CAPS="12.1", FAKE_TORCH_CUDA="11.8",
               CUDA_HOME=str(make_toolkit(tmp_path / "cuda-12.8")))
    env["PYTHONPATH"] += os.pathsep + str(STANDINS)
    out, proc = run_py("""
        import helpers.fakegpu, json, flashinfer_sm120
        from flashinfer.jit.sampling import gen_sampling_module
        try:
            gen_sampling_module().build_and_load()
            msg = "ran"
        except Exception as e:
            msg = str(e)
        print("@@" + json.dumps(dict(mode=flashinfer_sm120.status()["mode"], msg=msg)))
    """, env)
    assert out["mode"] == "guard", proc.stderr[-2000:]
    msg = out["msg"]
    fix = msg.index("Fix:")
    for text in ("VLLM_USE_FLASHINFER_SAMPLER=0", "--attention-backend TRITON_ATTN", "--sampling-backend pytorch",
                 "--attention-backend triton"):
        assert msg.index(text) > fix, (text, msg)
    assert "vLLM 0.34.0: " in msg and "SGLang 0.5.23: " in msg


def test_a_fallback_the_installed_source_lacks_is_said(tmp_path, monkeypatch):
    site = install_standins(tmp_path / "site", "sglang")
    (site / "sglang" / "srt" / "server_args.py").write_text("# renamed in this release\n")
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    sg = [i for i in servers.installed() if i.release.key == "sglang"]
    text = serverprobe.fallback_text(sg)
    assert "--sampling-backend pytorch (not found in its source: check --help)" in text
    assert "--attention-backend triton" in text and "triton (not found" not in text


# ----------------------------------------------------------------------------- doctor


@pytest.mark.slow  # seconds: whole builds, servers or worker fleets in child processes
@needs_flashinfer
def test_doctor_names_the_ninja_each_servers_check_and_jit_dir(server_env, tmp_path, real_nvcc13):
    env, site_dir = server_env
    env["PYTHONPATH"] += os.pathsep + str(site_dir)  # doctor reads the .pth from its own site dirs
    proc = cli(["doctor", "--verbose", "--timeout", "60"], dict(env, FLASHINFER_CUDA_ARCH_LIST="12.0"), timeout=600, python=sys.executable)
    text = proc.stdout
    whole = json.loads(text.split("as doctor --json prints it:\n", 1)[1])  # the whole report
    assert whole["ninja"]["chosen"]["path"] == wheel_ninja(), proc.stderr[-3000:]
    vllm, sglang = ({s["label"]: s for s in whole["servers"]["servers"]}[k] for k in ("vLLM 0.34.0", "SGLang 0.5.23"))
    assert vllm["check"].startswith("has_flashinfer()") and sglang["check"].startswith("is_flashinfer_available()")
    assert vllm["without"][0] is False and "no ninja" in vllm["without"][1] and vllm["with"][0] is True
    home = re.escape(str(tmp_path / "home"))
    assert re.fullmatch(rf"{home}/\.cache/sglang/\.cache/flashinfer/\S+/cached_ops", sglang["jit_dir"])
    assert re.fullmatch(rf"{home}/\.cache/flashinfer/\S+/cached_ops", vllm["jit_dir"])
    assert "'flashinfer-sm120 build --for vllm|sglang' picks one" in " ".join(text.split())  # both installed, different dirs


def _report(**over) -> dict:
    """A doctor report with no usable toolkit (FlashInfer alone: torch's CUDA, no nvcc)."""
    r = {"flashinfer_sm120": "x", "flashinfer": "0.7.4", "torch_cuda": "13.0", "python": "/venv/bin/python",
         "release": {"supported": True, "era": "sm120a-12.8", "arch_rules": "...", "min_nvcc": "12.8",
                     "min_nvcc_why": "..."},
         "gpu_source": "nvml", "gpus": [], "FLASHINFER_CUDA_ARCH_LIST": None, "settings": [],
         "candidates": [{"root": "/opt/cuda-evil", "nvcc_full": None, "version_from": None, "header_version": None,
                         "sources": ["CUDA_HOME"], "problem": "/opt/cuda-evil is writable by other users",
                         "state": "rejected", "why": "/opt/cuda-evil is writable by other users"}],
         "guard": True, "resolution_error": "no CUDA toolkit can build sm_120f ... Fix: pip install x",
         "before": {"cuda_home": "/usr/local/cuda", "cuda_version": "13.0", "target_cuda_archs": []},
         "after": {"status": {"mode": "guard", "steps": {}, "error": "e"}, "jit_dir": "/j", "exported": {}},
         "autoload": {}}
    r.update(over)
    return r


def test_doctor_without_a_toolkit_says_the_cuda_version_is_torchs_and_refused_entries_give_the_reason(
        capsys, monkeypatch, tmp_path):
    from flashinfer_sm120.cli import doctor

    monkeypatch.setattr(servers, "installed", lambda: [])
    report = _report()
    report["before"]["cuda_home"] = str(tmp_path / "no-cuda")
    out = "\n".join(doctor.render(report, verbose=True))
    assert (f"FlashInfer alone: would fail because it finds no nvcc (its CUDA_HOME is {tmp_path / 'no-cuda'}; its "
            "CUDA version would come from torch: 13.0)") in " ".join(out.split())
    assert '"root": "/opt/cuda-evil"' in out and '"why": "/opt/cuda-evil is writable by other users' in out
    # with an nvcc there, its CUDA is said as before
    nvcc_home = make_toolkit(tmp_path / "cuda-13.0", "13.0.88")
    report["before"]["cuda_home"] = str(nvcc_home)
    out = " ".join("\n".join(doctor.render(report, verbose=True)).split())
    assert "FlashInfer alone: would fail because it targets nothing" in out and '"cuda_version": "13.0"' in out


def test_the_fallbacks_are_every_flashinfer_default_of_the_stand_ins(tmp_path, monkeypatch):
    """Each fallback is defined in the stand-ins' source (written from vLLM 0.34.0 and SGLang 0.5.23),
    and every vllm/envs.py variable that defaults to on has one, or is named as tuning only."""
    site = install_standins(tmp_path / "site", "vllm", "sglang")
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    found = serverprobe.fallbacks()
    assert {(i.release.key, fb.text) for i, fb, _ in found} == {
        (r.key, fb.text) for r in servers.SERVERS for fb in r.fallbacks}
    assert [(i.release.key, fb.text) for i, fb, ok in found if ok is not True] == []
    for k in [k for k in os.environ if "FLASHINFER" in k]:
        monkeypatch.delenv(k)
    spec = importlib.util.spec_from_file_location("_standin_vllm_envs", site / "vllm" / "envs.py")
    envs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(envs)
    on = sorted(k for k, get in envs.environment_variables.items() if "FLASHINFER" in k and get() is True)
    assert on == ["VLLM_ALLREDUCE_USE_FLASHINFER", "VLLM_BLOCKSCALE_FP8_GEMM_FLASHINFER",
                  "VLLM_FLASHINFER_CUTEDSL_MOE_LOCALIZE_MEMSET_OVERLAP", "VLLM_USE_FLASHINFER_SAMPLER"]
    vllm = servers.newest("vllm")
    assert uncovered(vllm, on) == []
    # 0.34.0's MEMSET_OVERLAP is covered as tuning only, not by a "=0" fallback (turning it off serves
    # with FlashInfer all the same); a new on-by-default variable is neither
    assert "VLLM_FLASHINFER_CUTEDSL_MOE_LOCALIZE_MEMSET_OVERLAP=0" not in [fb.text for fb in vllm.fallbacks]
    assert uncovered(vllm, on + ["VLLM_USE_FLASHINFER_SOMETHING_NEW"]) == ["VLLM_USE_FLASHINFER_SOMETHING_NEW"]
    sg = servers.newest("sglang").fallbacks
    assert all(fb.default and "sglang/srt/" in fb.default for fb in sg)  # each names the file that decides it


def test_the_vllm_row_covers_0_33_and_0_34_and_assumes_newer(tmp_path, monkeypatch):
    """vLLM 0.33.0 and 0.34.0 have the same has_flashinfer() (vllm/utils/flashinfer.py): one row, read
    from 0.34.0; 0.35 is checked as 0.34.0 and says so (P7)."""
    site = install_standins(tmp_path / "site", "vllm")
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    assert [i.label() for i in servers.installed()] == ["vLLM 0.34.0"]
    for version, label in (("0.33.0", "vLLM 0.33.0"), ("0.35.0", "vLLM 0.35.0; checks as read from 0.34.0")):
        for old in site.glob("vllm-*.dist-info"):
            shutil.rmtree(old)
        (site / f"vllm-{version}.dist-info").mkdir()
        (site / f"vllm-{version}.dist-info" / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
        importlib.invalidate_caches()
        assert [i.label() for i in servers.installed()] == [label]
