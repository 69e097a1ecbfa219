"""cache export / cache import: a warmed JIT cache moves to another machine and FlashInfer's
own build finds nothing to do there; mismatches and unsafe archives are refused; an existing
different entry is never clobbered silently.  Compiles with a fake nvcc (ninja files are real)."""

import io
import json
import os
import shutil
import tarfile
from pathlib import Path

import pytest

from helpers.child import cli, run_py
from helpers.host import needs_flashinfer
from helpers.warm import LOAD_AGAIN

pytestmark = needs_flashinfer


@pytest.mark.slow  # seconds: whole builds, servers or worker fleets in child processes
def test_export_then_import_on_a_fresh_machine_is_up_to_date(warmed):
    env, manifest, log, tmp = warmed
    out = tmp / "cache.tar.gz"
    proc = cli(["cache", "export", "--from", str(manifest), str(out)], env, fakegpu=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "exported 2 modules" in proc.stdout
    again = cli(["cache", "export", "--from", str(manifest), str(out)], env, fakegpu=True)
    assert again.returncode == 2 and "already exists" in again.stderr  # never overwritten

    shutil.rmtree(env["FLASHINFER_WORKSPACE_BASE"])  # a fresh machine with the same layout
    target = env
    proc = cli(["cache", "import", str(out), "--json"], target, fakegpu=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert {m["status"] for m in json.loads(proc.stdout)["modules"]} == {"installed"}
    assert "using the archive's targets 12.0f" in proc.stderr
    before = log.read_text()
    res, _ = run_py(LOAD_AGAIN, dict(target, FAKE_GPU_CAPS="12.0", FAKE_TORCH_CUDA="13.0"))
    assert "Ninja build failed" not in (res["err"] or "")
    assert log.read_text() == before  # FlashInfer's own ninja run compiled nothing

    proc = cli(["cache", "import", str(out)], target, fakegpu=True)
    assert proc.returncode == 0 and proc.stdout.count("already present") == 2, proc.stdout + proc.stderr

    so = next(Path(env["FLASHINFER_WORKSPACE_BASE"]).rglob("*silu*.so"))
    so.write_text("a different build\n")
    proc = cli(["cache", "import", str(out)], target, fakegpu=True)
    assert proc.returncode == 1 and "kept existing" in proc.stdout and "--force" in proc.stdout
    assert so.read_text() == "a different build\n"
    proc = cli(["cache", "import", str(out), "--force"], target, fakegpu=True)
    assert proc.returncode == 0 and "replaced" in proc.stdout and so.read_text() != "a different build\n"

    # another toolkit view (another cache dir) or other targets: refused, naming the mismatch and fix
    proc = cli(["cache", "import", str(out)], dict(target, FLASHINFER_SM120_CACHE_DIR=str(tmp / "other")), fakegpu=True)
    assert proc.returncode == 2 and "cuda_home" in proc.stderr and "FLASHINFER_SM120_CACHE_DIR" in proc.stderr
    proc = cli(["cache", "import", str(out)], dict(target, FLASHINFER_WORKSPACE_BASE=str(tmp / "ws2")), fakegpu=True)
    assert proc.returncode == 2 and "jit_dir" in proc.stderr and "FLASHINFER_WORKSPACE_BASE" in proc.stderr
    proc = cli(["cache", "import", str(out), "--arch", "12.1"], target, fakegpu=True)
    assert proc.returncode == 2 and "targets" in proc.stderr and "12.0f" in proc.stderr


def _tar(path, members):
    with tarfile.open(path, "w") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)


def test_unsafe_archives_are_refused(clean_env, tmp_path, real_nvcc13):
    meta = json.dumps({"format": 1, "fingerprint": {"targets": ["12.0f"]}, "modules": []}).encode()

    def member(name, data=b"x", kind=tarfile.REGTYPE, link=""):
        info = tarfile.TarInfo(name)
        info.type, info.linkname = kind, link
        info.size = len(data) if kind == tarfile.REGTYPE else 0
        return info, (data if kind == tarfile.REGTYPE else None)

    cases = {
        "dotdot": [member("flashinfer-sm120-cache/meta.json", meta),
                   member("flashinfer-sm120-cache/../../escaped")],
        "absolute": [member("flashinfer-sm120-cache/meta.json", meta), member("/tmp/escaped-abs")],
        "symlink": [member("flashinfer-sm120-cache/meta.json", meta),
                    member("flashinfer-sm120-cache/jit/x/link", kind=tarfile.SYMTYPE, link="/etc/passwd")],
    }
    env = dict(clean_env, FAKE_GPU_CAPS="")
    for name, members in cases.items():
        path = tmp_path / f"{name}.tar"
        _tar(path, members)
        proc = cli(["cache", "import", str(path)], env, fakegpu=True)
        assert proc.returncode == 2, (name, proc.stdout, proc.stderr)
        assert "refusing the whole archive" in proc.stderr, (name, proc.stderr)
    assert not (tmp_path / "escaped").exists() and not os.path.exists("/tmp/escaped-abs")
