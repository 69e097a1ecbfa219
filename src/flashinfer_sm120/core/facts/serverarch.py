"""The FlashInfer targets a server's model processes set for themselves (SGLang's
``set_cuda_arch()``), run from the installed server's source as the cache redirect is
(:mod:`flashinfer_sm120.core.facts.servers` holds the rows; this module runs the rule).

Verified against sglang 0.5.23 ``sglang/srt/utils/common.py`` ``set_cuda_arch()``, called by
``ModelRunner.load_model()`` (``sglang/srt/model_executor/model_runner.py``).
"""

from __future__ import annotations

import functools
import json
import os
import sys
from dataclasses import dataclass

from flashinfer_sm120.core.facts.serverprobe import _ENVIRON_TIMEOUT_S, _package_dir
from flashinfer_sm120.core.facts.servers import newest

__all__ = ["ArchChoice", "cache_clear", "server_arch"]


@dataclass(frozen=True)
class ArchChoice:
    """What a server's model process on GPUs of ``capabilities`` sets ``variable`` to.

    ``value`` is ``None`` when it sets nothing (no rule, an older GPU, or FlashInfer
    switched off for it); ``targets`` are nvcc's names (``sm_120a``); ``how`` says
    whether the rule was run from the installed source or taken from the row, and why."""

    server: str
    name: str
    variable: str
    value: str | None
    targets: tuple[str, ...]
    function: str
    how: str


#: Runs one function of the installed server's file with stand-ins for what it asks (the GPU's
#: capability, whether FlashInfer is available, ``os.environ``): nothing of the server is
#: imported, nothing else of the file runs.  ``is_flashinfer_available()`` answers as SGLang
#: 0.5.23's does for a CUDA machine with FlashInfer installed: ``SGLANG_IS_FLASHINFER_AVAILABLE``
#: read by ``get_bool_env_var`` (true or 1).
_ARCH_PROBE = r"""
import ast, json, os, sys, types
path, function, caps = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
tree = ast.parse(open(path, encoding="utf-8").read(), path)
funcs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function]
if not funcs:
    raise SystemExit("no function %s in %s" % (function, path))
out = []
for major, minor in caps:
    env = {}
    fake_os = types.SimpleNamespace(environ=env, getenv=os.getenv, path=os.path)
    cuda = types.SimpleNamespace(get_device_capability=lambda *a, _c=(major, minor): _c, is_available=lambda: True)
    ns = {"os": fake_os, "torch": types.SimpleNamespace(cuda=cuda, version=types.SimpleNamespace(cuda="13.0", hip=None)),
          "is_flashinfer_available": lambda: os.getenv("SGLANG_IS_FLASHINFER_AVAILABLE", "true").lower() in ("true", "1")}
    exec(compile(ast.Module(body=funcs, type_ignores=[]), path, "exec"), ns)
    ns[function]()
    out.append(env)
sys.stdout.write("\n@@" + json.dumps(out))
"""


def cache_clear() -> None:
    """Forget the arch rules already run from installed servers' source (after that source changed)."""
    _run_arch_rule.cache_clear()


@functools.lru_cache(maxsize=32)
def _run_arch_rule(path: str, function: str, caps: tuple, env_items: tuple) -> tuple[list | None, str]:
    from flashinfer_sm120.safety import formats, proc
    from flashinfer_sm120.safety.ownership import trust_reason

    problem = trust_reason(path, absent_ok=False)  # threat-model: P2 (run only what the trust rule admits)
    if problem:
        return None, f"not reading {path}: {problem}"
    env = dict(env_items, FLASHINFER_SM120_DISABLE="1")
    # threat-model: P6 (a deadline, an output cap, and the answer read as bounded JSON)
    res = proc.run([sys.executable, "-I", "-c", _ARCH_PROBE, path, function, json.dumps([list(c) for c in caps])],
                   timeout=_ENVIRON_TIMEOUT_S, max_output=1 << 16, env=env)
    text = res.text()
    at = text.rfind("\n@@")
    if not res.ok or at < 0:
        why = res.error or ("timed out" if res.timed_out else f"exit {res.returncode}")
        return None, f"{path} {function}() could not be run ({why}: {formats.shown(text.strip()[-300:], 300)})"
    try:
        got = formats.loads_json(text[at + 3:], f"{path} {function}()")
        if not isinstance(got, list) or len(got) != len(caps) or not all(
                isinstance(e, dict) and all(isinstance(v, str) and len(v) <= 4096 for v in e.values()) for e in got):
            raise formats.FormatError(f"{path} {function}() gave {formats.shown(str(got), 200)}, not one "
                                      f"environment per GPU")
    except formats.FormatError as exc:
        return None, str(exc)
    return got, f"read from {path} {function}()"


def server_arch(key: str, capabilities: list[tuple[int, int]], env: dict[str, str]) -> ArchChoice | None:
    """What server ``key``'s model process sets FlashInfer's arch list to, on a GPU of each of
    ``capabilities`` (``None``: the server has no such rule).

    The rule is run from the installed package's source when it is there (:data:`_ARCH_PROBE`),
    else taken from the row; ``value`` is ``None`` when the process sets nothing.  With GPUs
    of several capabilities each process sets only its own GPU's, so ``value`` is the value of
    the first and ``targets`` lists every one (the caller decides whether that is usable)."""
    row = newest(key)
    rule = row.arch_rule
    if rule is None:
        return None
    caps = tuple(dict.fromkeys((int(a), int(b)) for a, b in capabilities))
    values: list[str | None] | None = None
    pkg = _package_dir(key)
    how = f"{key} is not installed"
    if pkg is not None and caps:
        got, how = _run_arch_rule(os.path.join(pkg, *rule.file.split("/")), rule.function, caps,
                                  tuple(sorted(env.items())))
        if got is not None:
            values = [e.get(rule.variable) for e in got]
    if values is None:
        on = env.get("SGLANG_IS_FLASHINFER_AVAILABLE", "true").lower() in ("true", "1")
        values = [f"{a}.{b}{rule.suffix}" if on and a >= rule.min_major else None for a, b in caps]
        how = (f"as in {row.name} {row.read_from}: {rule.variable}=<major>.<minor>{rule.suffix} for major >= "
               f"{rule.min_major} ({how})")
    targets = tuple(dict.fromkeys("sm_" + v.replace(".", "") for v in values if v))
    return ArchChoice(key, row.name, rule.variable, values[0] if values else None, targets,
                      f"{row.name.lower()}/{rule.file} {rule.function}()", how)


