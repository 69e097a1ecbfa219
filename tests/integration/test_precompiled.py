"""FlashInfer's precompiled kernels (jit-cache providers, flashinfer-cubin): what doctor says, what build
leaves to them, and FlashInfer's own minimal provider selection under the seed (P1, P7).

The provider is a stand-in installed as a dist-info with entry_points.txt in a temp site directory
(tests/helpers/precompiled.py); the shim package is tests/standins/precompiled/flashinfer_jit_cache,
off the stand-ins' import path (FlashInfer imports it wherever it is importable)."""

import importlib
import json
import os
import sys
import zipfile

import pytest

from helpers.child import cli, run_py
from helpers.host import needs_flashinfer
from helpers.precompiled import install_provider
from helpers.toolkits import make_toolkit
from flashinfer_sm120.core.facts import precompiled


@pytest.mark.parametrize("binary,target,runs", [
    ("sm120f", "sm120f", True), ("sm120f", "sm120a", True), ("sm120f", "sm121a", True),
    ("sm120a", "sm121a", False), ("sm121a", "sm120f", False), ("sm100a", "sm120f", False), ("sm90a", "sm90a", True)])
def test_runs_on_is_flashinfers_rule(binary, target, runs):
    """FlashInfer 0.7.4 jit/_cuda_architecture.py: 'a' needs the same major.minor, 'f' and plain the same
    major and a minor not above the target's."""
    assert precompiled.runs_on(binary, target) is runs


def test_tag_is_flashinfers_spelling():
    assert [precompiled.tag(t) for t in ("12.0f", "sm_121a", "9.0a")] == ["sm120f", "sm121a", "sm90a"]


def _read(site, monkeypatch):
    """precompiled.read() with ``site`` first on sys.path and no provider module of an earlier test loaded."""
    if str(site) not in sys.path:
        monkeypatch.syspath_prepend(str(site))
    for name in [n for n in sys.modules if n.startswith(("provider_sm", "flashinfer_jit_cache"))]:
        monkeypatch.delitem(sys.modules, name)
    importlib.invalidate_caches()
    return precompiled.read()


def test_a_matching_provider_ships_its_modules_for_the_targets(tmp_path, monkeypatch):
    site = install_provider(tmp_path / "site", ["sampling_mod", "decode_mod"])
    pc = _read(site, monkeypatch)
    assert [p.distribution for p in pc.providers] == ["flashinfer-jit-cache-sm120f"]
    if pc.flashinfer != "0.7.4":
        pytest.skip(f"the stand-in provider is 0.7.4; flashinfer-python {pc.flashinfer} here")
    assert pc.jit_cache == "0.7.4" and pc.mismatch("flashinfer-jit-cache", pc.jit_cache) is None
    assert pc.shipped_by("sampling_mod", ["sm120f"]).distribution == "flashinfer-jit-cache-sm120f"
    assert pc.shipped_by("sampling_mod", ["sm120a"]) is not None  # SGLang's own 12.0a runs 120f code
    assert pc.shipped_by("sampling_mod", ["sm100a"]) is None
    assert pc.shipped_by("activation_mod", ["sm120f"]) is None


def test_a_provider_of_another_release_is_ignored_as_flashinfer_ignores_it(tmp_path, monkeypatch):
    site = install_provider(tmp_path / "site", ["sampling_mod"], version="0.7.3", shim="0.7.3")
    pc = _read(site, monkeypatch)
    if pc.flashinfer != "0.7.4":
        pytest.skip(f"flashinfer-python {pc.flashinfer} here")
    assert pc.mismatch("flashinfer-jit-cache", "0.7.3") == "flashinfer-jit-cache 0.7.3 does not match flashinfer-python 0.7.4"
    assert pc.mismatch("flashinfer-jit-cache", "0.7.4+cu130") is None  # the CUDA local part is allowed
    assert pc.mismatch("flashinfer-cubin", "0.6.13") == "flashinfer-cubin 0.6.13 does not match flashinfer-python 0.7.4"
    assert pc.usable() == [] and pc.shipped_by("sampling_mod", ["sm120f"]) is None
    monkeypatch.setenv("FLASHINFER_DISABLE_VERSION_CHECK", "1")
    assert precompiled.read().shipped_by("sampling_mod", ["sm120f"]) is not None


def test_doctor_section_says_what_is_installed_matched_shipped_and_jit_built(tmp_path, monkeypatch):
    site = install_provider(tmp_path / "site", ["sampling_mod"])
    _read(site, monkeypatch)
    jit = tmp_path / "cached_ops"
    for m in ("sampling_mod", "decode_mod"):
        (jit / m).mkdir(parents=True)
    section = precompiled.doctor_section({"resolution": {"choice": {"targets": ["sm_120f"]}},
                                          "after": {"jit_dir": str(jit)}})
    if section["flashinfer"] != "0.7.4":
        pytest.skip(f"flashinfer-python {section['flashinfer']} here")
    packages = {p["name"]: p for p in section["packages"]}
    assert packages["flashinfer-jit-cache"]["version"] == "0.7.4" and packages["flashinfer-jit-cache"]["mismatch"] is None
    provider = packages["flashinfer-jit-cache-sm120f"]
    assert provider["mismatch"] is None and provider["declares"] == ["sm120f"]
    assert (provider["modules"], provider["for_targets"]) == (1, 1)
    assert section["shipped"] == {"sampling_mod": "flashinfer-jit-cache-sm120f"} and section["jit_build"] == ["decode_mod"]
    install_provider(site, ["sampling_mod"], version="0.7.3", shim="0.7.3")
    _read(site, monkeypatch)
    section = precompiled.doctor_section({"resolution": {"choice": {"targets": ["12.0f"]}}, "after": {"jit_dir": str(jit)}})
    packages = {p["name"]: p for p in section["packages"]}
    assert "flashinfer-jit-cache 0.7.3 does not match" in packages["flashinfer-jit-cache"]["mismatch"]
    assert section["shipped"] == {} and section["jit_build"] == ["decode_mod", "sampling_mod"]


@needs_flashinfer
def test_build_leaves_a_shipped_module_to_its_provider_and_says_so(clean_env, real_nvcc13, tmp_path):
    """build generates the module's spec, finds it shipped for the targets by a matching provider, and
    does not compile it (status "shipped"); without the provider the same command builds it."""
    env = dict(clean_env)
    first = cli(["build", "--json", "--arch", "12.0", "--ninja-only", "activation"], env, timeout=300)
    name = json.loads(first.stdout)["modules"][0]["name"]
    site = install_provider(tmp_path / "site", [name])
    if json.loads(first.stdout)["flashinfer"] != "0.7.4":
        pytest.skip("the stand-in provider is 0.7.4")
    env["PYTHONPATH"] = os.pathsep.join([str(site), env["PYTHONPATH"]])
    proc = cli(["build", "--json", "--arch", "12.0", "activation"], env, timeout=300)
    doc = json.loads(proc.stdout)
    assert doc["ok"], proc.stderr
    assert doc["modules"] == [{"module": doc["modules"][0]["module"], "name": name, "status": "shipped",
                               "provider": "flashinfer-jit-cache-sm120f 0.7.4"}]
    assert (f"not built: flashinfer-jit-cache-sm120f 0.7.4 ships {name} for sm120f (FlashInfer loads it instead "
            "of a JIT build)") in proc.stderr
    assert not os.path.exists(os.path.join(doc["jit_dir"], name, f"{name}.so"))


#: FlashInfer 0.7.4 flashinfer/__main__.py install-jit-cache-wheel --mode minimal, dry run, with the
#: provider inventory read from a stand-in shim wheel (no download): the pip command it would run.
MINIMAL = """
import json, pathlib, helpers.fakegpu, flashinfer_sm120
try:
    import flashinfer.__main__ as m
    m._get_available_jit_cache_provider_tags = lambda req, expected, url, nightly: m._read_jit_cache_provider_tags(
        pathlib.Path(WHEEL), expected)
    import click, io, contextlib
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        m._install_jit_cache_wheel("13.0", None, "file:///nowhere", False, True, mode="minimal")
    out = {"out": buf.getvalue()}
except Exception as e:
    out = {"error": type(e).__name__ + ": " + str(e)}
print("@@" + json.dumps(out))
"""


def _shim_wheel(path, version="0.7.4+cu130", tags=("sm80", "sm90a", "sm120f", "sm121a")):
    """The shim wheel's METADATA as 0.7.4's _read_jit_cache_provider_tags reads it: one pinned
    flashinfer-jit-cache-<sm> requirement per published provider."""
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"flashinfer_jit_cache-{version}.dist-info/METADATA",
                   f"Metadata-Version: 2.1\nName: flashinfer-jit-cache\nVersion: {version}\n"
                   + "".join(f"Requires-Dist: flashinfer-jit-cache-{t}=={version}\n" for t in tags))
    return path


@needs_flashinfer
@pytest.mark.parametrize("caps,provider", [("12.0", "sm120f"), ("12.1", "sm121a")])
def test_flashinfers_minimal_selection_under_the_seed_asks_for_the_right_provider(
        clean_env, real_nvcc13, tmp_path, caps, provider):
    """Old nvcc 12.8 first on PATH and as CUDA_HOME: with flashinfer-sm120 loaded, FlashInfer's own
    `install-jit-cache-wheel --mode minimal` picks sm120f on SM120 and sm121a on SM121 (without it, SM121
    on 12.8 has no targets and the selection fails)."""
    fake = make_toolkit(tmp_path / "cuda-12.8")
    env = dict(clean_env, PATH=f"{fake}/bin:{clean_env['PATH']}", CUDA_HOME=str(fake), FAKE_GPU_CAPS=caps,
               FAKE_TORCH_CUDA="13.0")
    code = MINIMAL.replace("WHEEL", repr(str(_shim_wheel(tmp_path / "flashinfer_jit_cache-0.7.4+cu130-py3-none-any.whl"))))
    out, proc = run_py(code, env)
    if "error" in out and "does not match" in out["error"]:
        pytest.skip(f"the stand-in inventory is 0.7.4: {out['error']}")
    assert "error" not in out, (out, proc.stderr[-2000:])
    assert f"flashinfer-jit-cache-{provider}==0.7.4+cu130" in out["out"]
    assert "flashinfer-jit-cache-sm120a" not in out["out"]
    if caps == "12.1":
        out, _ = run_py(code, dict(env, FLASHINFER_SM120_DISABLE="1"))
        assert "No CUDA architecture could be detected" in out.get("error", ""), out
