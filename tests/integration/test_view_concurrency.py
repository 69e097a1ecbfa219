"""Many workers importing at once with an empty cache dir (issue 5 item 6).

Every process must end with the same view as ``CUDA_HOME``, patched, and no
``.tmp-*`` build directory may be left.  The children wait on a start file so
they reach the view code together; most rounds call ``flashinfer_sm120.resolve()``
(which builds the view) with torch blocked to keep the cost low, one round
imports FlashInfer for real and checks ``status()["mode"] == "patched"``.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from helpers.guards import until
from helpers.host import needs_flashinfer
from helpers.views import tmp_dirs

#: Processes per round and rounds of the cheap (resolve-only) race.
WORKERS = 8
ROUNDS = 3
#: Processes in the round that imports FlashInfer, forked after one torch import.
FLASHINFER_WORKERS = 4

_RESOLVE = textwrap.dedent("""
    import json, os, sys, time
    sys.modules["torch"] = None  # torch_cuda_version() -> None: no 2 s torch import per child
    import flashinfer_sm120
    open(sys.argv[1] + "." + sys.argv[2], "w").close()  # ready
    while not os.path.exists(sys.argv[1]):
        time.sleep(0.002)
    try:
        r = flashinfer_sm120.resolve()
        print("@@" + json.dumps({"home": r.home.path, "is_view": r.home.is_view, "mode": "resolved"}))
    except Exception as exc:
        print("@@" + json.dumps({"error": repr(exc)}))
""")

_IMPORT = textwrap.dedent("""
    import json, os, sys, time
    import torch  # once, before the workers fork (as a server's fork-started workers): the race is in patching
    for i in range(int(sys.argv[2])):
        if os.fork() == 0:
            try:
                import flashinfer_sm120
                open(sys.argv[1] + "." + str(i), "w").close()  # ready
                while not os.path.exists(sys.argv[1]):
                    time.sleep(0.002)
                import flashinfer
                from flashinfer.jit import cpp_ext
                s = flashinfer_sm120.status()
                out = {"home": os.environ.get("CUDA_HOME"), "fi_home": cpp_ext.get_cuda_path(),
                       "mode": s["mode"], "error": s["error"], "is_view": True}
            except BaseException as exc:
                out = {"error": repr(exc)}
            os.write(1, ("@@" + json.dumps(out) + "\\n").encode())  # one write: the workers share this pipe
            os._exit(0)
    while True:
        try:
            os.wait()
        except ChildProcessError:
            break
""")


def _race(code: str, n: int, env: dict, workdir, forks: bool = False) -> list[dict]:
    """``n`` processes of ``code`` (or, with ``forks``, one that forks ``n``) started together; their results."""
    workdir.mkdir()
    go = workdir / "go"
    procs = [subprocess.Popen([sys.executable, "-c", code, str(go), str(n if forks else i)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(1 if forks else n)]
    # all start together once all are ready (however long their start-up takes under load)
    until(lambda: all(procs[0 if forks else i].poll() is not None or Path(f"{go}.{i}").exists() for i in range(n)),
          seconds=300)
    go.write_text("")
    results = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        lines = [json.loads(x[2:]) for x in out.splitlines() if x.startswith("@@")]
        results += lines[-1:] if not forks else lines
        if not lines or (forks and len(lines) != n):
            results.append({"error": f"exit {p.returncode}: {err[-2000:]}"})
    return results


def _check(results: list[dict], cache, want_mode: str) -> str:
    errors = [r for r in results if "error" in r and r.get("mode") != want_mode]
    assert not errors, errors
    assert all(r["mode"] == want_mode for r in results), results
    homes = {r["home"] for r in results}
    assert len(homes) == 1, homes
    home = homes.pop()
    assert all(r["is_view"] for r in results) and home.startswith(str(cache)), home
    assert not tmp_dirs(cache / "cuda-home")
    name = os.path.basename(home)  # the view, maybe the builders' lock
    assert sorted(os.listdir(cache / "cuda-home")) in ([".lock", name], [name])
    return home


@pytest.mark.slow  # seconds: whole builds, servers or worker fleets in child processes
def test_many_workers_resolve_one_view(tmp_path, clean_env):
    for rnd in range(ROUNDS):
        cache = tmp_path / f"cache{rnd}"
        env = dict(clean_env, FLASHINFER_SM120_CACHE_DIR=str(cache))
        _check(_race(_RESOLVE, WORKERS, env, tmp_path / f"round{rnd}"), cache, "resolved")


@pytest.mark.slow  # seconds: whole builds, servers or worker fleets in child processes
@needs_flashinfer
def test_many_workers_import_flashinfer_and_all_patch(tmp_path, clean_env):
    cache = tmp_path / "cache"
    env = dict(clean_env, FLASHINFER_SM120_CACHE_DIR=str(cache))
    results = _race(_IMPORT, FLASHINFER_WORKERS, env, tmp_path / "round", forks=True)
    home = _check(results, cache, "patched")
    assert all(r["fi_home"] == home for r in results), results
