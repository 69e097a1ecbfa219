"""Kinds of input nobody had listed: unterminated JSON strings, FIFOs where files belong, headers of
blank lines, programs that print without end, ``enable`` and ``disable`` at once.  Each is read
bounded or refused at once (P6) and leaves nothing half made (P5).  Fast: no compile.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from hypothesis import given, strategies as st

from flashinfer_sm120.errors import FormatError
from flashinfer_sm120.safety.formats.reads import loads_json
from helpers.child import cli
from helpers.guards import hang_guard, until
from helpers.probing import waits_for_lock
from helpers.toolkits import script


# --------------------------------------------------------------------------- JSON: the depth pre-check

#: An unterminated JSON string of escaped quotes: the old depth pre-check rescanned it from
#: every quote (quadratic: 240 KB in a CUDA_HOME's version.json hung ``import flashinfer`` for
#: minutes).
def _escaped_quotes(n: int) -> str:
    return '"' + '\\"' * n


@pytest.mark.parametrize("text", [_escaped_quotes(1 << 20), '"\\' * (1 << 20), '"' * (1 << 21) + "\\"])
def test_json_depth_check_is_linear_on_unterminated_strings(text):
    with hang_guard(60):  # the old scan: hours for these 2 MiB
        with pytest.raises(FormatError) as exc:
            loads_json(text, "probe.json")
    assert "probe.json" in str(exc.value) and len(str(exc.value)) < 400


@pytest.mark.parametrize("digits", [65, 5000, 100_000])
def test_a_json_number_of_too_many_digits_is_refused_naming_the_count_and_the_fix(digits):
    """P8: our refusal with the caller's fix, not Python's hint to raise an interpreter limit."""
    with pytest.raises(FormatError) as exc:
        loads_json('{"created": ' + "9" * digits + "}", "meta.json", fix="record it again")
    text = str(exc.value)
    assert f"{digits} digits" in text and "record it again" in text and "set_int_max_str_digits" not in text
    assert loads_json('{"n": -' + "9" * 64 + "}", "meta.json")["n"] == -int("9" * 64)


def _reference_depth(text: str) -> int:
    """Nesting depth by a plain character walk (strings skipped; an unterminated one runs to the end)."""
    depth = deepest = 0
    in_str = esc = False
    for c in text:
        if in_str:
            if esc:
                esc = False
            elif c == "\\":
                esc = True
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = True
        elif c in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif c in "]}":
            depth -= 1
    return deepest


@given(st.text(alphabet=st.sampled_from(list('[]{}"\\ax,:')), max_size=300))
def test_json_depth_matches_a_character_walk(text):
    from flashinfer_sm120.safety.formats.reads import json_depth

    assert json_depth(text) == _reference_depth(text)


# --------------------------------------------------------------------------- toolkit files: FIFOs, blank-line floods

def test_a_fifo_named_libcudart_never_blocks_the_view_stub(tmp_path):
    """A toolkit whose ``libcudart.so.13`` is a FIFO hung ``import flashinfer`` (the view's stub
    read its ELF header with a blocking open)."""
    from flashinfer_sm120.core.view.stub import elf_ident

    fifo = tmp_path / "libcudart.so.13"
    os.mkfifo(fifo)
    with hang_guard(20):
        got = elf_ident([str(fifo), os.path.realpath(sys.executable)])
    assert got is not None and got[0] in "<>"  # the FIFO skipped, the next ELF read


def test_a_header_of_blank_lines_is_scanned_in_one_pass(tmp_path):
    """``^\\s*#\\s*define`` over a header of newlines retried every line start to the end
    (quadratic: a 16 MiB ``cuda.h`` hung ``import flashinfer``; 64 KiB ``cuda_runtime_api.h``
    cost 5 s per include dir at every import)."""
    from flashinfer_sm120.core.toolkit.probe import _header_version
    from flashinfer_sm120.core.view.stub import driver_symbols

    cuda_h = tmp_path / "cuda.h"
    cuda_h.write_text("CUresult CUDAAPI cuCtxCreate(int);\n" + "\n" * (4 << 20) + "#define cuInit cuInit_v2 x\n")
    dirs = []
    for i in range(6):
        d = tmp_path / f"inc{i}"
        d.mkdir()
        (d / "cuda_runtime_api.h").write_text("\n" * ((64 << 10) - 1))
        dirs.append(str(d))
    (tmp_path / "inc5" / "cuda_runtime_api.h").write_text("#define CUDART_VERSION 13000\n")
    with hang_guard(30):
        assert driver_symbols(str(cuda_h)) == ["cuCtxCreate"]
        assert str(_header_version(tuple(dirs))) == "13.0"


# --------------------------------------------------------------------------- hostile binaries we run

_CHILD = r"""
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (1536 << 20, 1536 << 20))
kind, prog = sys.argv[1], sys.argv[2]
if kind == "stats":
    import os
    from flashinfer_sm120.core.jitenv import launcher
    os.environ["FLASHINFER_NVCC_LAUNCHER"] = prog
    out = launcher.stats(timeout=4)
elif kind == "probe":  # its --version and its compile
    from flashinfer_sm120.core.jitenv import launcher
    out = launcher.probe(prog, "/bin/false", sys.argv[3], "80", None, timeout=4).ok
elif kind == "running":  # a module's ninja, streamed line by line while it builds
    import os, queue, time
    from pathlib import Path
    from filelock import FileLock
    from flashinfer_sm120.warmup import moddir, pool
    moddir.ninja_binary = lambda: prog
    events = queue.Queue()
    r = pool._Running(pool.Job("m", Path(sys.argv[3]), Path(sys.argv[3]) / "build.ninja"), 1, 1, FileLock(os.devnull), events)
    longest, t0 = 0, time.monotonic()
    while time.monotonic() - t0 < 4:
        try:
            _, line = events.get(timeout=0.2)
        except queue.Empty:
            continue
        longest = max(longest, len(line or ""))
        if events.qsize() > 1000:
            break
    r.proc.kill()
    out = longest
else:
    from pathlib import Path
    from flashinfer_sm120.warmup import moddir, pool
    moddir.ninja_binary = lambda: prog
    try:
        out = moddir.dry_run(pool.Job("m", Path(sys.argv[3]), Path(sys.argv[3]) / "build.ninja"))
    except RuntimeError as exc:
        out = "refused: " + str(exc)[:200]
print("@@" + json.dumps(out))
# VmHWM, this process's own peak: ru_maxrss keeps the forking parent's peak across exec (a pytest process
# that imported torch showed 515 MiB in every child)
print("@@rss", next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:")) << 10)
"""

HOSTILE = {
    # prints without end: everything it printed was kept (GBs within the timeout)
    "garbage": "#!/bin/sh\nexec /usr/bin/yes '{\"stats\": 1}'\n",
    # one endless line
    "one line": "#!/bin/sh\nexec /usr/bin/tr '\\0' x < /dev/zero\n",
}


@pytest.mark.slow  # seconds: whole builds, servers or worker fleets in child processes
@pytest.mark.parametrize("kind", ["stats", "probe", "dry_run", "running"])
@pytest.mark.parametrize("shape", sorted(HOSTILE))
def test_a_binary_that_prints_without_end_costs_bounded_memory(tmp_path, kind, shape):
    """``sccache --show-stats`` and ``ninja -n`` were run with ``subprocess.run(capture_output=True)``:
    all output kept until the timeout (GBs); a module's ninja was read line by line with no cap on a
    line.  (The build's ``ninja --version`` jobserver probe is gone with the jobserver.)"""
    prog = tmp_path / "bin" / "sccache"  # the stats are asked of an sccache only
    prog.parent.mkdir()
    script(prog, HOSTILE[shape])
    proc = subprocess.run([sys.executable, "-c", _CHILD, kind, str(prog), str(tmp_path)], capture_output=True,
                          text=True, timeout=180, env=dict(os.environ, HOME=str(tmp_path)))
    assert proc.returncode == 0 and "@@" in proc.stdout, proc.stderr[-2000:]
    assert "MemoryError" not in proc.stderr, proc.stderr[-2000:]
    rss = int(proc.stdout.split("@@rss ")[1].split()[0])
    assert rss < 512 << 20, f"peak RSS {rss >> 20} MiB"


# --------------------------------------------------------------------------- enable / disable at once

def test_enable_and_disable_at_once_never_leave_a_pth_without_its_module(tmp_path, monkeypatch):
    """``enable`` writes the module, then the ``.pth``; a ``disable`` that ran in between removed the
    module, and the ``.pth`` written after it made every interpreter of that environment print
    "Error processing line 1 of ...pth" with a traceback at start-up."""
    import argparse

    from flashinfer_sm120.core.autoload_hook import HOOK_FILE, PTH_NAME
    from flashinfer_sm120.cli import enable

    site_dir = tmp_path / "site-packages"
    site_dir.mkdir()
    real_write = enable.write_atomic
    other = []

    def write_then_race(path, data, **kw):
        real_write(path, data, **kw)
        if path.endswith(HOOK_FILE) and not other:  # a disable starts right here
            other.append(subprocess.Popen([sys.executable, "-m", "flashinfer_sm120", "disable", "--site-dir",
                                           str(site_dir)], stdout=subprocess.PIPE, stderr=subprocess.PIPE))
            # until the disable waits for enable's lock (or, unlocked, has run): not a guessed sleep
            until(lambda: other[0].poll() is not None or waits_for_lock(other[0].pid, site_dir), seconds=120)

    monkeypatch.setattr(enable, "write_atomic", write_then_race)
    assert enable._enable(argparse.Namespace(site_dir=str(site_dir), user=False, cmd="enable", force=False)) == 0
    assert other[0].wait(timeout=60) == 0
    pth, hook = (site_dir / PTH_NAME).exists(), (site_dir / HOOK_FILE).exists()
    assert pth == hook, f".pth {pth}, module {hook}"
    start = subprocess.run([sys.executable, "-c", f"import site; site.addsitedir({str(site_dir)!r})"],
                           capture_output=True, text=True, timeout=60)
    assert start.stderr == ""


# --------------------------------------------------------------------------- CLI: sources that are not files

@pytest.mark.parametrize("src", ["fifo", "", "chardev"])
def test_a_manifest_of_a_fifo_or_an_empty_path_is_refused_at_once(tmp_path, src):
    """A FIFO given for a file waited forever for a writer (opened blocking); an empty path ended in
    ``ValueError: nothing to open``."""
    if src == "fifo":
        src = str(tmp_path / "fifo")
        os.mkfifo(src)
    elif src == "chardev":
        src = "/dev/zero"
    env = dict(os.environ, HOME=str(tmp_path), FLASHINFER_SM120_CACHE_DIR=str(tmp_path / "c"),
               FLASHINFER_WORKSPACE_BASE=str(tmp_path / "ws"))
    proc = cli(["build", "--arch", "12.0", "--from", src], env, 60, python=sys.executable)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "flashinfer-sm120: error:" in proc.stderr and len(proc.stderr) < 2000


def test_a_record_manifest_that_is_a_fifo_never_blocks_a_build(tmp_path):
    """``FLASHINFER_SM120_RECORD=<a FIFO>``: the recorder's blocking ``open()`` waited for a reader
    inside FlashInfer's ``build_and_load``, so the server's first JIT build hung."""
    from flashinfer_sm120.core.jitenv import record

    fifo = tmp_path / "m.jsonl"
    os.mkfifo(fifo)
    with hang_guard(20):
        with pytest.raises(OSError) as exc:
            record.append(str(fifo), {"module": "norm"})
    assert str(fifo) in str(exc.value) or "regular file" in str(exc.value)
    regular = tmp_path / "r.jsonl"
    record.append(str(regular), {"module": "norm"})
    assert regular.read_text() == '{"module":"norm"}\n'


def test_a_manifest_that_is_a_fifo_is_named_with_a_fix_for_the_path(tmp_path):
    """`build --from <a FIFO>` never blocks, and its fix was 'record the manifest again' (which a FIFO cannot
    take); it says the path is no regular file (its mode: ``p`` a FIFO) and to give the file itself (P6, P8)."""
    import json

    fifo = tmp_path / "m.json"
    os.mkfifo(fifo)
    argv = ["build", "--from", str(fifo), "--json"]
    env = dict(os.environ, FLASHINFER_SM120_CACHE_DIR=str(tmp_path / "c"))
    proc = subprocess.run([sys.executable, "-m", "flashinfer_sm120", *argv], capture_output=True, text=True,
                          timeout=60, env=env, stdin=subprocess.DEVNULL)
    err = json.loads(proc.stdout)["error"]
    message, fix = (err["message"], err["fix"]) if isinstance(err, dict) else (err, proc.stderr)
    assert proc.returncode in (1, 2) and str(fifo) in message and "mode prw" in message, proc
    assert "path of the file" in fix and "RECORD" not in fix, proc
