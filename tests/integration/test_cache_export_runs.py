"""`cache export` of what is built in a JIT workspace, by module name or --all, without a manifest; imported
into an empty workspace it leaves FlashInfer's own ninja nothing to do.  An export obeys --max-bytes and
the free-space check in both forms.  Compiles with a fake compiler (ninja files are real).

Never into a directory another user controls: an existing empty directory was accepted as the export's
destination whoever owned it, and its files were written with ``shutil.copy2``/``write_bytes``, which follow
a link (its owner could plant ``flashinfer-sm120-cache`` or ``meta.json`` as a link meanwhile and have the
export write into, or over, one of your files).  Never through or over what lies beside the output."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from helpers.child import cli, run_py
from helpers.host import needs_flashinfer
from helpers.untrusted import make_unsafe
from helpers.warm import LOAD_AGAIN, fake_compiler_env

pytestmark = needs_flashinfer
slow = pytest.mark.slow  # seconds: a whole build in child processes


@pytest.fixture
def built(clean_env, tmp_path, real_nvcc13):
    """`build --arch 12.0 activation` (the README's way: by name, no manifest) with a fake compiler."""
    env, log = fake_compiler_env(clean_env, tmp_path)
    proc = cli(["build", "--arch", "12.0", "activation", "-j", "2", "--json"], env, fakegpu=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (module,) = json.loads(proc.stdout)["modules"]
    assert module["status"] == "built"
    return env, log, module["name"], tmp_path


@slow
def test_export_by_name_imports_on_an_empty_workspace_without_compiling(built):
    env, log, name, tmp = built
    out = tmp / "act.tar.gz"
    proc = cli(["cache", "export", str(out), "activation", "--arch", "12.0", "--json"], env, fakegpu=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    assert doc["ok"] and doc["error"] is None
    assert doc["modules"] == [{"module": "activation-silu", "name": name, "status": "exported"}], doc

    every = tmp / "all"
    proc = cli(["cache", "export", str(every), "--all", "--arch", "12.0", "--json"], env, fakegpu=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [m["name"] for m in json.loads(proc.stdout)["modules"] if m["status"] == "exported"] == [name]

    ws = Path(env["FLASHINFER_WORKSPACE_BASE"])
    ws.rename(tmp / "ws-built")  # another box: the same paths, nothing built
    for src in (out, every):
        proc = cli(["cache", "import", str(src), "--json"], env, fakegpu=True)
        assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
        doc = json.loads(proc.stdout)
        assert doc["ok"] and [m["status"] for m in doc["modules"]] == ["installed"], doc
        before = log.read_text()
        res, _ = run_py(LOAD_AGAIN, dict(env, FAKE_GPU_CAPS="12.0", FAKE_TORCH_CUDA="13.0"))
        assert res["err"] is None or "Ninja build failed" not in res["err"], res
        assert log.read_text() == before  # FlashInfer's own ninja run compiled nothing
        shutil.rmtree(ws)


@slow
def test_the_readmes_export_works_as_written_on_the_machine_that_built(clean_env, tmp_path, real_nvcc13):
    """The README's `cache export OUT sampling decode`, run where the main job (`build --arch 12.0 sampling
    decode`) just built them, without a GPU, exited 2 with "no target architectures"; it exports the one
    target set built here (several: listed, with --arch asked for), and says build's names and nvcc's
    target spelling (`decode-bf16-hd128`, `sm_120f`), as `build` does, in export and import (P8)."""
    env, log = fake_compiler_env(clean_env, tmp_path)
    proc = cli(["build", "--arch", "12.0", "sampling", "decode", "-j", "2"], env, fakegpu=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = tmp_path / "fi-cache.tar.gz"
    proc = cli(["cache", "export", str(out), "sampling", "decode"], env, fakegpu=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "exporting what is built here for sm_120f" in proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("exported 3 modules for sm_120f "), proc.stdout
    assert sorted(lines[1:]) == ["  decode-bf16-hd128", "  prefill-bf16-hd128", "  sampling"], proc.stdout

    ws = Path(env["FLASHINFER_WORKSPACE_BASE"])
    ws.rename(tmp_path / "ws-built")  # another box: the same paths, nothing built
    proc = cli(["cache", "import", str(out)], env, fakegpu=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert "using the archive's targets sm_120f" in proc.stderr
    assert sorted(proc.stdout.splitlines()) == ["installed decode-bf16-hd128", "installed prefill-bf16-hd128",
                                                "installed sampling"], proc.stdout

    proc = cli(["build", "--arch", "12.1", "sampling", "-j", "2"], env, fakegpu=True)  # a second target set
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = cli(["cache", "export", str(tmp_path / "again"), "sampling", "--json"], env, fakegpu=True)
    doc = json.loads(proc.stdout)
    assert proc.returncode == 2 and doc["error"]["kind"] == "usage", doc
    assert re.search(r"sm_120f \(3 modules\); sm_121[af] \(1 module\)", doc["error"]["message"]), doc
    assert "--arch" in doc["error"]["fix"] and not (tmp_path / "again").exists()


@slow
@pytest.mark.parametrize("form", ["dir", "x.tar.gz"])
def test_export_obeys_max_bytes_in_both_forms(built, form):
    """`cache export` obeys --max-bytes in both forms, a directory as an archive: a module padded with 120 MiB
    of sparse files against a 64M cap is a limit error and nothing is written (P6, P7)."""
    env, _log, name, tmp = built
    so = next(Path(env["FLASHINFER_WORKSPACE_BASE"]).rglob(f"{name}/{name}.so"))
    with open(so.parent / "padding.bin", "wb") as fh:  # exported with the module's files
        fh.truncate(120 << 20)
    out = tmp / form
    proc = cli(["cache", "export", str(out), "activation", "--arch", "12.0", "--max-bytes", "64M", "--json"], env, fakegpu=True)
    doc = json.loads(proc.stdout)
    assert proc.returncode == 1 and doc["error"]["kind"] == "limit", doc
    assert str(64 << 20) in doc["error"]["message"]
    assert not out.exists()


@slow
def test_a_module_library_replaced_by_a_link_is_named_in_the_workspace_not_dropped(built):
    """A built module's .so replaced by a link was left out of the export (exit 0, an export without its
    library); the refusal names the workspace path and the fix here (P5, P8)."""
    env, _log, name, tmp = built
    so = next(Path(env["FLASHINFER_WORKSPACE_BASE"]).rglob(f"{name}/{name}.so"))
    shutil.copy(so, tmp / "elsewhere.so")
    so.unlink()
    os.symlink(tmp / "elsewhere.so", so)
    out = tmp / "e.tar.gz"
    proc = cli(["cache", "export", str(out), "activation", "--arch", "12.0", "--json"], env, fakegpu=True)
    doc = json.loads(proc.stdout)
    assert proc.returncode == 1 and doc["error"]["kind"] == "path" and str(so) in doc["error"]["message"], doc
    assert "build" in doc["error"]["fix"] and not out.exists(), doc


@pytest.mark.parametrize("how", ["world-writable", "another user's"])
def test_an_export_directory_another_user_controls_is_refused(warmed, how):
    env, manifest, _log, tmp = warmed
    out = tmp / "export"
    out.mkdir()
    make_unsafe(out, how)
    proc = cli(["cache", "export", "--from", str(manifest), str(out)], env, fakegpu=True)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "export directory" in proc.stderr and str(out) in proc.stderr
    assert os.listdir(out) == []


def test_an_export_to_a_new_directory_of_your_own_is_written(warmed):
    env, manifest, _log, tmp = warmed
    out = tmp / "mine"
    proc = cli(["cache", "export", "--from", str(manifest), str(out)], env, fakegpu=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    top = out / "flashinfer-sm120-cache"
    assert (top / "meta.json").is_file() and list((top / "jit").iterdir())
    proc = cli(["cache", "import", str(out), "--json"], env, fakegpu=True)  # reads back: everything up to date
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]


def test_export_never_writes_through_or_over_what_lies_beside_its_output(warmed):
    """The archive was written to ``OUT.partial`` with a plain ``open()``: a file of that name was
    truncated and lost, a symlink of that name was followed (the archive written into its target),
    and ``OUT`` appearing meanwhile was replaced."""
    env, manifest, _log, tmp = warmed
    victim = tmp / "victim"
    victim.write_text("precious\n")
    out_link, out_file = tmp / "a.tar.gz", tmp / "b.tar.gz"
    os.symlink(victim, str(out_link) + ".partial")
    (tmp / "b.tar.gz.partial").write_text("mine\n")
    for out in (out_link, out_file):
        proc = cli(["cache", "export", "--from", str(manifest), str(out)], env, fakegpu=True)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert out.is_file() and not out.is_symlink() and out.stat().st_size > 100
    assert victim.read_text() == "precious\n"
    assert os.path.islink(str(out_link) + ".partial")
    assert (tmp / "b.tar.gz.partial").read_text() == "mine\n"
