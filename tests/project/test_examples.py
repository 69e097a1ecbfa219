"""The deployment recipes in examples/, run as far as this machine allows.

* Dockerfile: no docker engine here, so its build stage (examples/build-stage.sh)
  runs as a script in a fresh venv; torch and the CUDA wheels come from this
  test venv (a path ``.pth`` stands for the image's torch layer) and the warm-up
  compile is skipped (``WARM_MODULES=""``; the same ``flashinfer-sm120 build``
  compile is covered by tests/e2e/test_build.py).
* systemd unit: ``systemd-analyze verify`` where available, then its
  ExecStartPre and a stand-in for ExecStart run with its Environment= (paths
  moved under a temp dir), a bare PATH and an unwritable HOME.
* Ray: Ray is not installed in CI (79 MB wheel, and a local cluster did not
  start within its timeout on the 2-core CI machine), so the snippet's hook and
  report functions run in a plain child process, as Ray would call them.
"""

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sysconfig

import pytest

from helpers.child import run_py
from helpers.host import needs_flashinfer
from helpers import ROOT
from helpers.deploy import PTH_NAME, env_without, make_venv, purelib
from helpers.servers import install_standins, system_bin_without, wheel_ninja

EXAMPLES = ROOT / "examples"
pytestmark = needs_flashinfer


def unit_file() -> dict:
    """``examples/flashinfer-sm120.service`` as ``{key: [values]}`` (section names dropped)."""
    out: dict = {}
    for line in (EXAMPLES / "flashinfer-sm120.service").read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            k, v = line.split("=", 1)
            out.setdefault(k.strip(), []).append(v.strip())
    return out


@pytest.fixture(scope="module")
def built(tmp_path_factory, real_nvcc13_module):
    """examples/build-stage.sh run once in a fresh venv, paths under a temp root."""
    root = tmp_path_factory.mktemp("image")
    venv = root / "opt" / "venv"
    make_venv(venv)
    (purelib(venv / "bin" / "python") / "00_image_torch_layer.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    cache = root / "var" / "cache"
    env = env_without("PYTHONPATH", "FLASHINFER_SM120_DISABLE", "CUDA_HOME", "CUDA_PATH", "FLASHINFER_CUDA_ARCH_LIST",
                      VENV=str(venv), TORCH_SPEC="", SM120_SPEC=str(ROOT), PIP_FLAGS="--no-deps -q",
                      WARM_MODULES="", ARCHS="12.0",
                      FLASHINFER_WORKSPACE_BASE=str(cache / "flashinfer"),
                      FLASHINFER_SM120_CACHE_DIR=str(cache / "flashinfer-sm120"))
    proc = subprocess.run(["sh", str(EXAMPLES / "build-stage.sh")], env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return {"root": root, "venv": venv, "cache": cache, "proc": proc}


@pytest.fixture(scope="module")
def real_nvcc13_module():
    from helpers.host import REAL_NVCC13

    if REAL_NVCC13 is None:
        pytest.skip("no CUDA 13 nvcc found")
    return REAL_NVCC13


@pytest.mark.slow  # a fresh venv with this package installed into it
def test_build_stage_script_in_a_fresh_venv(built):
    venv, cache = built["venv"], built["cache"]
    assert (purelib(venv / "bin" / "python") / PTH_NAME).is_file()  # enable ran in the venv
    assert os.access(venv / "bin" / "flashinfer-sm120", os.X_OK)
    report = json.loads((cache / "flashinfer-sm120" / "doctor-build-stage.json").read_text())
    assert report["python"].startswith(str(venv)), report["python"]
    res = report["resolution"]
    assert res["choice"]["targets"] == ["sm_120f"] and res["choice"]["toolkit"]["nvcc_version"].startswith("13.")
    if res["cuda_home"]["is_view"]:
        assert res["cuda_home"]["path"].startswith(str(cache / "flashinfer-sm120"))


def test_dockerfile_runs_the_tested_script_with_the_same_paths_in_both_stages():
    text = (EXAMPLES / "Dockerfile").read_text()
    stages = re.findall(r"^FROM \S+ AS (\w+)", text, re.M)
    assert stages == ["build", "runtime"]
    build, runtime = text.split("FROM ${BASE} AS runtime")
    assert "/usr/local/bin/build-stage.sh" in build and "COPY examples/build-stage.sh" in build
    unit = unit_file()
    for var in ("FLASHINFER_WORKSPACE_BASE", "FLASHINFER_SM120_CACHE_DIR"):
        (value,) = {v.split("=", 1)[1] for v in unit["Environment"] if v.startswith(var + "=")}
        assert f"{var}={value}" in build and f"{var}={value}" in runtime
        assert f"COPY --from=build --chown=llm:llm {value} {value}" in runtime
    assert "--uid 1000" in build and "--uid 1000" in runtime  # same owner: caches stay trusted


#: What ExecStart/CMD runs, as a stand-in: vLLM 0.33's has_flashinfer() (tests/standins/vllm,
#: written from vllm/utils/flashinfer.py), with the ninja and nvcc it finds.
SERVER_CHECK = ("import json, os, shutil, vllm; from vllm.utils.flashinfer import has_flashinfer; "
                "n = shutil.which('ninja'); print(json.dumps(dict(has=has_flashinfer(), ninja=n and os.path.realpath(n), "
                "nvcc=shutil.which('nvcc'))))")


def _server_venv(built, tmp_path) -> str:
    """The image venv with the vLLM stand-in installed; a system PATH without ninja or nvcc
    (a machine without Debian's ninja-build): the venv's bin is not on it."""
    site = purelib(built["venv"] / "bin" / "python")
    if not (site / "vllm").exists():
        install_standins(site, "vllm")
    return str(system_bin_without(tmp_path / "usr-bin", "ninja", "nvcc"))


def _check_server(python, env) -> dict:
    proc = subprocess.run([str(python), "-c", SERVER_CHECK], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # uses the fresh venv of the build stage
def test_systemd_unit_runs_without_a_writable_home(built, tmp_path):
    unit = unit_file()
    venv, root = built["venv"], built["root"]
    sys_path = _server_venv(built, tmp_path)
    env = {"PATH": sys_path, "HOME": str(tmp_path / "nonexistent"), "LANG": "C.UTF-8",
           "FLASHINFER_CUDA_ARCH_LIST": "12.0"}  # no GPU here
    for item in unit["Environment"]:
        k, v = item.split("=", 1)
        env[k] = v.replace("/var/cache", str(root / "var" / "cache"))
    assert {"FLASHINFER_WORKSPACE_BASE", "FLASHINFER_SM120_CACHE_DIR"} <= set(env)
    for d in unit["CacheDirectory"][0].split():  # what systemd creates for User=
        (root / "var" / "cache" / d).mkdir(parents=True, exist_ok=True)
    pre = unit["ExecStartPre"][0].replace("/opt/venv", str(venv)).split()
    proc = subprocess.run(pre, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.startswith("OK: "), proc.stdout + proc.stderr
    # the full report (autoload, exports, vLLM's view): doctor --verbose
    proc = subprocess.run([pre[0], "doctor", "--verbose"], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and '"state": "chosen"' in proc.stdout, proc.stdout + proc.stderr
    pth = purelib(venv / 'bin' / 'python') / PTH_NAME
    whole = json.loads(proc.stdout.split("as doctor --json prints it:\n", 1)[1])
    assert "Autoload: enabled" in proc.stdout and str(pth) in whole["autoload"]["pth"]  # doctor sees the .pth
    assert whole["after"]["exported"]["cuda_home"]
    assert any(s["without"][0] is False and "no ninja on PATH" in s["without"][1] and s["with"][0] is True
               and s["with"][1].startswith("nvcc ") for s in whole["servers"]["servers"]), proc.stdout
    # ExecStart (vllm serve): the venv's bin is off PATH, yet vLLM finds nvcc and the venv's ninja
    out = _check_server(venv / "bin" / "python", env)
    assert out["has"] is True and out["ninja"] == os.path.realpath(wheel_ninja()), out
    code = ("import json, os, shutil, flashinfer, flashinfer_sm120, flashinfer.jit.env as je; "
            "st = flashinfer_sm120.status(); print(json.dumps(dict(mode=st['mode'], home=os.environ.get('CUDA_HOME'), "
            "which=shutil.which('nvcc'), jit=str(je.FLASHINFER_JIT_DIR))))")
    proc = subprocess.run([str(venv / "bin" / "python"), "-c", code], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["mode"] == "patched"  # through the .pth: nothing imported flashinfer_sm120 explicitly
    assert out["which"] == os.path.join(out["home"], "bin", "nvcc")  # PATH had no nvcc at all
    assert out["jit"].startswith(env["FLASHINFER_WORKSPACE_BASE"])
    assert not (tmp_path / "nonexistent").exists()
    if shutil.which("systemd-analyze"):
        text = (EXAMPLES / "flashinfer-sm120.service").read_text().replace("/opt/venv", str(venv))
        text = text.replace(f"{venv}/bin/vllm serve ${{MODEL}} --port 8000", f"{venv}/bin/python -c pass")
        (tmp_path / "llm-server.service").write_text(text)
        proc = subprocess.run(["systemd-analyze", "verify", str(tmp_path / "llm-server.service")],
                              capture_output=True, text=True, timeout=60)
        problems = [l for l in (proc.stdout + proc.stderr).splitlines() if "llm-server.service" in l]
        assert problems == [], problems


def _runtime_stage() -> tuple[dict, list]:
    """The Dockerfile's runtime stage: its ENV (``K=V`` pairs) and CMD (exec form)."""
    runtime = (EXAMPLES / "Dockerfile").read_text().split("FROM ${BASE} AS runtime")[1]
    env, cmd = {}, None
    for m in re.finditer(r"^ENV ((?:.*\\\n)*.*)$", runtime, re.M):
        for pair in m.group(1).replace("\\\n", " ").split():
            k, v = pair.split("=", 1)
            env[k] = v
    cmd = json.loads(re.search(r"^CMD (\[.*\])$", runtime, re.M).group(1))
    return env, cmd


@pytest.mark.slow  # seconds: whole builds, servers or worker fleets in child processes
def test_docker_runtime_stage_works_with_the_venv_bin_off_path(built, tmp_path):
    env_vars, cmd = _runtime_stage()
    assert "/opt/venv/bin" not in env_vars.get("PATH", "") and cmd[0].startswith("/opt/venv/bin/")
    venv, root = built["venv"], built["root"]
    env = {"PATH": _server_venv(built, tmp_path), "HOME": str(tmp_path / "nonexistent"), "LANG": "C.UTF-8",
           "FLASHINFER_CUDA_ARCH_LIST": "12.0"}
    env.update({k: v.replace("/var/cache", str(root / "var" / "cache")) for k, v in env_vars.items()})
    proc = subprocess.run([cmd[0].replace("/opt/venv", str(venv)), *cmd[1:]], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.startswith("OK: "), proc.stdout[-3000:] + proc.stderr[-3000:]
    out = _check_server(venv / "bin" / "python", env)
    assert out["has"] is True and out["ninja"] == os.path.realpath(wheel_ninja()), out


def test_ray_worker_setup_hook_patches_and_exports(clean_env, tmp_path, real_nvcc13_module):
    spec = importlib.util.spec_from_file_location("ray_workers", EXAMPLES / "ray_workers.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # imports no Ray at module level
    renv = mod.runtime_env(str(tmp_path / "cache"))
    assert set(renv["env_vars"]) == {"FLASHINFER_SM120_CACHE_DIR", "FLASHINFER_WORKSPACE_BASE"}
    hook_mod, _, hook_fn = renv["worker_process_setup_hook"].rpartition(".")
    env = dict(clean_env, **renv["env_vars"], FAKE_GPU_CAPS="12.0", FAKE_TORCH_CUDA="13.0", PATH="/usr/bin:/bin")
    env["PYTHONPATH"] += os.pathsep + str(EXAMPLES)
    out, proc = run_py(f"""
        import helpers.fakegpu, importlib, json, sys
        getattr(importlib.import_module({hook_mod!r}), {hook_fn!r})()   # what Ray does in each worker
        import ray_workers
        before = ray_workers.worker_report()
        before["flashinfer_loaded"] = "flashinfer" in sys.modules
        import flashinfer
        after = ray_workers.worker_report()
        import flashinfer_sm120, os
        flashinfer_sm120.revert()  # undoes the worker_setup export too
        reverted = dict(exported=ray_workers.worker_report()["exported"], home=os.environ.get("CUDA_HOME"))
        print("@@" + json.dumps(dict(before=before, after=after, reverted=reverted)))
    """, env)
    before, after = out["before"], out["after"]
    assert before["flashinfer_loaded"] is False and before["mode"] == "idle"
    assert before["which_nvcc"] == os.path.join(before["CUDA_HOME"], "bin", "nvcc"), (before, proc.stderr)
    assert before["exported"]["cuda_home"] == before["CUDA_HOME"] and before["loaded_by"] == "worker_setup"
    # FlashInfer imported later finds that toolkit itself (noop) or is patched to it: the same home
    assert after["mode"] in ("patched", "noop") and after["CUDA_HOME"] == before["CUDA_HOME"], proc.stderr
    assert after["exported"]["cuda_home"] == before["CUDA_HOME"]
    assert out["reverted"] == {"exported": {}, "home": None}


# --------------------------------------------------------------------------- the image's build context


def _dockerignore_patterns() -> list[re.Pattern]:
    """The repository's .dockerignore as regular expressions, with Docker's rules (moby's
    patternmatcher): ``*`` and ``?`` stay within a path element, ``**`` spans any number of them,
    and an excluded directory excludes everything under it."""
    out = []
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        assert not line.startswith("!"), "an exception pattern: extend this matcher first"
        rx, i = "", 0
        pat = line.strip("/")
        while i < len(pat):
            if pat.startswith("**/", i):
                rx, i = rx + "(?:.*/)?", i + 3
            elif pat.startswith("**", i):
                rx, i = rx + ".*", i + 2
            elif pat[i] == "*":
                rx, i = rx + "[^/]*", i + 1
            elif pat[i] == "?":
                rx, i = rx + "[^/]", i + 1
            else:
                rx, i = rx + re.escape(pat[i]), i + 1
        out.append(re.compile(rx + r"\Z"))
    return out


def _ignored(rel: str, patterns) -> bool:
    parts = rel.split("/")
    return any(p.match("/".join(parts[:n])) for p in patterns for n in range(1, len(parts) + 1))


def test_dockerignore_keeps_the_venv_git_and_caches_out_of_the_image_context(tmp_path):
    """examples/Dockerfile copied the repository root with no .dockerignore: the 3 GB .venv the
    README creates went into the build context."""
    patterns = _dockerignore_patterns()
    for local in (".venv/lib/python3.12/site-packages/torch/__init__.py", ".git/HEAD", "venv/bin/python",
                  "src/flashinfer_sm120/__pycache__/cli.cpython-312.pyc", "tests/__pycache__/x.pyc",
                  ".cache/flashinfer/0.7.4/flashinfer_jit.log", ".pytest_cache/v/cache/nodeids",
                  ".hypothesis/examples/x", "dist/flashinfer_sm120-0.2.0-py3-none-any.whl", "build/lib/x.py",
                  "src/flashinfer_sm120.egg-info/PKG-INFO", "site/index.html"):
        assert _ignored(local, patterns), local
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    needed = [f for f in tracked if f.startswith(("src/", "examples/")) or f in ("pyproject.toml", "README.md", "LICENSE")]
    assert "examples/build-stage.sh" in needed and any(f.endswith("cli/__init__.py") for f in needed)
    assert not [f for f in needed if _ignored(f, patterns)]  # what `pip install /src/flashinfer-sm120` reads


def test_the_build_context_of_this_checkout_is_small():
    """The context Docker would send from this very checkout (its .venv, .git and caches
    included when present) holds no venv and stays small."""
    patterns = _dockerignore_patterns()
    total, sent = 0, []
    for top, dirs, files in os.walk(ROOT):
        rel_top = os.path.relpath(top, ROOT)
        rel = (lambda n: n) if rel_top == "." else (lambda n: f"{rel_top}/{n}")
        dirs[:] = [d for d in dirs if not _ignored(rel(d), patterns)]
        for f in files:
            if not _ignored(rel(f), patterns):
                sent.append(rel(f))
                total += os.lstat(os.path.join(top, f)).st_size
    assert not [f for f in sent if f.startswith((".venv/", ".git/")) or "/site-packages/" in f]
    assert total < 50 << 20, f"{total} bytes in the build context"


def test_dockerfile_runtime_stage_carries_only_the_venv_and_caches():
    """The runtime stage copies the build stage's venv, JIT cache and view, nothing of the
    checkout, and can leave the host compiler out."""
    runtime = (EXAMPLES / "Dockerfile").read_text().split("FROM ${BASE} AS runtime")[1]
    copies = re.findall(r"^COPY (.*)$", runtime, re.M)
    assert copies and all(c.startswith("--from=build ") for c in copies), copies
    sources = {c.split()[-2] for c in copies}
    assert sources == {"/opt/venv", "/var/cache/flashinfer", "/var/cache/flashinfer-sm120"}, sources
    assert 'ARG RUNTIME_PACKAGES="g++"' in runtime and "$RUNTIME_PACKAGES" in runtime
