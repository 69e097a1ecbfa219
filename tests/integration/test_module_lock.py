"""FlashInfer's per-module lock as ``build`` meets it: any reader of the JIT directory can ``flock`` the
lock file, so a holder of another uid is named and not waited for (threat model P6)."""

import json
import os

from helpers.child import cli
from helpers.host import needs_flashinfer
from helpers.toolkits import make_toolkit
from helpers.probing import lock_held_as, reachable_dir

pytestmark = needs_flashinfer


def test_build_names_another_uids_holder_of_a_module_lock_instead_of_waiting(clean_env, tmp_path):
    """``build`` names another uid holding a module lock and stops, instead of waiting silently
    without end (P8)."""
    tk = make_toolkit(tmp_path / "cuda-13.0", "13.0.88", curand=True)
    with reachable_dir() as base:
        env = dict(clean_env, CUDA_HOME=str(tk), FAKE_GPU_CAPS="12.0", FAKE_TORCH_CUDA="13.0",
                   FLASHINFER_WORKSPACE_BASE=str(base))
        first = cli(["build", "--arch", "12.0", "--ninja-only", "--json", "sampling"], env)
        assert first.returncode == 0, first.stderr[-2000:]
        ninja = json.loads(first.stdout)["modules"][0]["ninja"]
        lock = os.path.join(os.path.dirname(os.path.dirname(ninja)), "tmp", os.path.basename(os.path.dirname(ninja)) + ".lock")
        assert os.path.isfile(lock), lock  # FlashInfer's lock file, left readable by all
        with lock_held_as(4321, lock) as holder:
            proc = cli(["build", "--arch", "12.0", "--ninja-only", "--json", "sampling"], env, timeout=120)
        assert proc.returncode != 0
        text = json.dumps(json.loads(proc.stdout))
        assert f"held by pid {holder.pid} of uid 4321" in text and "FLASHINFER_WORKSPACE_BASE" in text, text
