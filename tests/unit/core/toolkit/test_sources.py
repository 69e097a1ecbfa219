"""Find steps: the Debian layout, a PATH nvcc outside bin/, the user site,
cuda-pathfinder as a source (issue 5 item 14 and the redesign)."""

from __future__ import annotations

import json
import os
import site

import pytest

from helpers.toolkits import make_toolkit, script
from flashinfer_sm120.core.toolkit.sources import FIND_STEPS, discover
from flashinfer_sm120.core.toolkit import sources
from helpers.probing import PY, in_namespace, unshare_ok


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHINFER_SM120_CACHE_DIR", str(tmp_path / "cache"))


def test_search_order_is_one_tuple_of_steps():
    assert tuple(label for label, _ in FIND_STEPS)[:5] == ("FLASHINFER_NVCC", "CUDA_HOME", "CUDA_PATH", "pip", "PATH")
    assert all(callable(step) for _, step in FIND_STEPS)


def test_path_nvcc_outside_bin_gets_path_advice(tmp_path):
    tools = tmp_path / "tools"
    tools.mkdir()
    make_toolkit(tmp_path / "cuda-12.8")
    (tools / "nvcc").symlink_to(tmp_path / "cuda-12.8" / "bin" / "nvcc")
    # a link into a bin/ is followed to its toolkit ...
    (tk,) = [t for t in discover({"PATH": str(tools)}) if "PATH" in t.sources]
    assert tk.root == str(tmp_path / "cuda-12.8") and tk.problem is None
    # ... a real nvcc that sits in no bin/ directory gives PATH advice, not CUDA_HOME advice
    (tools / "nvcc").unlink()
    script(tools / "nvcc", "#!/bin/sh\necho 'Cuda compilation tools, release 12.8, V12.8.93'\n")
    (tk,) = [t for t in discover({"PATH": str(tools)}) if "PATH" in t.sources]
    assert str(tools / "nvcc") in tk.problem and "not in a toolkit's bin/ directory" in tk.problem
    assert "on PATH" in tk.problem and "point CUDA_HOME" not in tk.problem


def test_user_site_only_when_enabled(tmp_path, monkeypatch):
    user_site = tmp_path / "user-site"
    make_toolkit(user_site / "nvidia" / "cu13", "13.0.88", lib64=False)
    monkeypatch.setattr(site, "getusersitepackages", lambda: str(user_site))
    monkeypatch.setattr(site, "getsitepackages", lambda: [])
    monkeypatch.setattr(sources.sys, "path", [p for p in sources.sys.path if "site-packages" not in p])
    monkeypatch.setattr(sources, "pathfinder_binary", lambda name: None)
    monkeypatch.setattr(site, "ENABLE_USER_SITE", True)
    assert str(user_site / "nvidia" / "cu13") in [f.root for f in sources.from_pip({})]
    monkeypatch.setattr(site, "ENABLE_USER_SITE", False)  # python -s / PYTHONNOUSERSITE
    assert sources.from_pip({}) == []


def test_pip_step_uses_cuda_pathfinder_first(tmp_path, monkeypatch):
    sd = tmp_path / "sp"
    make_toolkit(sd / "nvidia" / "cu13", "13.0.88", lib64=False)
    make_toolkit(sd / "nvidia" / "cu14", "14.0.1", lib64=False)
    picked = str(sd / "nvidia" / "cu13" / "bin" / "nvcc")
    monkeypatch.setattr(sources, "site_dirs", lambda: [str(sd)])
    monkeypatch.setattr(sources, "pathfinder_binary", lambda name: picked)
    roots = [f.root for f in sources.from_pip({})]
    assert roots == [str(sd / "nvidia" / "cu13"), str(sd / "nvidia" / "cu14")]


DEBIAN = r"""
T=$(mktemp -d)
mount -t tmpfs none "$T"
for d in /usr/bin /usr/lib /usr/include; do
  n=$(echo "$d" | tr / _)
  mkdir -p "$T/$n/up" "$T/$n/work"
  mount -t overlay overlay -o "lowerdir=$d,upperdir=$T/$n/up,workdir=$T/$n/work" "$d"
done
mkdir -p /usr/lib/nvidia-cuda-toolkit/bin
cat > /usr/lib/nvidia-cuda-toolkit/bin/nvcc <<'EOF2'
#!/bin/sh
echo "Cuda compilation tools, release 12.4, V12.4.131"
EOF2
cat > /usr/bin/nvcc <<'EOF2'
#!/bin/sh
exec /usr/lib/nvidia-cuda-toolkit/bin/nvcc "$@"
EOF2
chmod 755 /usr/bin/nvcc /usr/lib/nvidia-cuda-toolkit/bin/nvcc
echo '#define CUDART_VERSION 12040' > /usr/include/cuda_runtime_api.h
"$PY" - <<'EOF2'
import json
from flashinfer_sm120.core.toolkit.sources import discover
from flashinfer_sm120.core.toolkit.policy import choose
from flashinfer_sm120.errors import ToolkitError
tks = [t for t in discover({"PATH": "/usr/bin"}) if "PATH" in t.sources]
tk = tks[0]
try:
    choose([tk], None, [(12, 0)], None)
    err = None
except ToolkitError as e:
    err = str(e)
print("@@" + json.dumps({"root": tk.root, "inc": tk.include_dirs, "ver": str(tk.nvcc_version),
                         "problem": tk.problem, "given": tk.given_as, "err": err}))
EOF2
"""


def test_debian_layout_is_recognised_and_rejected_for_its_version(tmp_path):
    if os.geteuid() != 0 or not unshare_ok():
        pytest.skip("needs root and 'unshare -m' (private mount namespaces) to fake /usr/bin/nvcc")
    env = dict(os.environ, PY=PY, FLASHINFER_SM120_CACHE_DIR=str(tmp_path / "cache"))
    proc = in_namespace(DEBIAN, env)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("@@")]
    if not lines and "overlay" in proc.stderr:
        pytest.skip(f"overlay mounts unavailable in a namespace here: {proc.stderr[-300:]}")
    assert lines, proc.stderr[-3000:]
    out = json.loads(lines[-1][2:])
    assert out["root"] == "/usr" and out["inc"] == ["/usr/include"], out
    assert out["ver"] == "12.4" and out["problem"] is None, out
    assert "nvcc 12.4 cannot build" in out["err"] and "no include" not in out["err"]


def test_dist_info_must_own_this_nvcc(tmp_path):
    from flashinfer_sm120.core.toolkit.probe import inspect

    site_dir = tmp_path / "site-packages"
    root = make_toolkit(site_dir / "nvidia" / "cu13", "13.0.88", lib64=False)
    dist = site_dir / "nvidia_cuda_nvcc-13.5.37.dist-info"
    dist.mkdir()
    (dist / "RECORD").write_text('"nvidia/cu14/bin/nvcc",sha256=x,1\n')  # another prefix's nvcc
    tk = inspect(str(root))
    assert tk.version_from == "nvcc --version" and tk.nvcc_full == "13.0.88" and tk.disagreement is None
    (dist / "RECORD").write_text('"nvidia/cu13/bin/nvcc",sha256=x,1\n')  # quoted CSV, as RECORD allows
    tk = inspect(str(root))  # owned, but its nvcc says 13.0.88: the binary's word, the file a finding
    assert tk.version_from == "nvcc --version" and tk.nvcc_full == "13.0.88"
    assert tk.disagreement.file == str(dist) and tk.disagreement.file_version == "13.5.37"


def test_cuda_pathfinder_never_reaches_its_subprocess_fallback(tmp_path, monkeypatch):
    """Only asked when its wheel step will answer: its last resort loads libcudart in a
    child process through LD_LIBRARY_PATH, which must not happen inside the import."""
    import cuda.pathfinder

    def boom(name):
        raise AssertionError("cuda-pathfinder asked although its wheel step cannot answer")

    monkeypatch.setattr(cuda.pathfinder, "find_nvidia_binary_utility", boom)
    sd = tmp_path / "only-on-sys-path" / "site-packages"
    make_toolkit(sd / "nvidia" / "cu13", "13.0.88", lib64=False)
    monkeypatch.setattr(site, "getsitepackages", lambda: [])
    monkeypatch.setattr(site, "ENABLE_USER_SITE", False)
    monkeypatch.setattr(sources, "site_dirs", lambda: [str(sd)])
    assert [f.root for f in sources.from_pip({})] == [str(sd / "nvidia" / "cu13")]


def test_inconsistent_system_toolkit_is_not_told_to_pip_install_a_12x_set(tmp_path):
    from flashinfer_sm120.core.toolkit.probe import inspect

    sys_tk = inspect(str(make_toolkit(tmp_path / "cuda-12.8", "12.8.93", header="12.9")))
    assert "nvcc 12.8 with CUDA headers 12.9" in sys_tk.problem
    assert "pip install" not in sys_tk.problem and "reinstall CUDA 12.8" in sys_tk.problem
    pip_tk = inspect(str(make_toolkit(tmp_path / "site-packages" / "nvidia" / "cu13", "13.0.88", header="13.5")))
    assert "pip install 'cuda-toolkit[nvcc,cccl,curand]==13.0.*'" in pip_tk.problem
