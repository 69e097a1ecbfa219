"""What an installed server (:data:`.servers.SERVERS`) does in an environment, without importing it: vLLM's
``has_flashinfer()``, SGLang's workspace and targets (its functions in a bounded child, else its row), its fallbacks."""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import shutil
import sys
from dataclasses import dataclass

from flashinfer_sm120.core.facts import servers
from flashinfer_sm120.core.facts.arch import nvcc_spelling
from flashinfer_sm120.core.toolkit.ninja import package_dir
from flashinfer_sm120.core.toolkit.sources import flashinfer_naive_root
from flashinfer_sm120.errors import FormatError
from flashinfer_sm120.safety.formats.base import shown


def vllm_has_flashinfer(env: dict[str, str]) -> tuple[bool, str]:
    """``(has_flashinfer(), why)`` as vLLM 0.33.0 and 0.34.0 compute it in a process with environment ``env``."""
    if importlib.util.find_spec("flashinfer") is None:
        return False, "flashinfer is not installed"
    cubin = env.get("VLLM_HAS_FLASHINFER_CUBIN", "0")
    try:
        if int(cubin):
            return True, "VLLM_HAS_FLASHINFER_CUBIN is set: no nvcc or ninja needed"
    except ValueError:
        return False, f"VLLM_HAS_FLASHINFER_CUBIN={cubin!r} is not an integer (vLLM raises ValueError)"
    if importlib.util.find_spec("flashinfer_cubin") is not None:
        return True, "flashinfer-cubin is installed: no nvcc or ninja needed"
    home = flashinfer_naive_root(env, server=True)
    nvcc = shutil.which(os.path.join(home, "bin", "nvcc"))
    ninja = shutil.which("ninja", path=env.get("PATH", os.defpath))
    missing = [w for w, ok in ((f"no nvcc at {home}/bin/nvcc", nvcc), ("no ninja on PATH", ninja)) if not ok]
    if missing:
        return False, " and ".join(missing)
    return True, f"nvcc {nvcc}, ninja {ninja}"


#: Runs ``function()`` of the server's file ``argv[1]``, executed on its own (nothing else of the server imported).
_ENVIRON_PROBE = r"""
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("_flashinfer_sm120_server_environ", sys.argv[1])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
sys.stdout.write("\n@@" + json.dumps(getattr(mod, sys.argv[2])()))
"""

#: Runs only ``function`` of the file once per GPU capability, with stand-ins for what it asks (sglang 0.5.23's
#: ``is_flashinfer_available()`` on a CUDA machine): prints the environment each call left.
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


@functools.lru_cache(maxsize=32)
def _run_rule(probe: str, path: str, function: str, env_items: tuple, *args: str) -> tuple[object, str]:
    """``(JSON the probe printed or None, how)``: ``probe`` run on the server's file ``path`` in a child (P2, P6)."""
    from flashinfer_sm120.safety import proc
    from flashinfer_sm120.safety.formats.reads import loads_json
    from flashinfer_sm120.safety.ownership import trust_reason

    problem = trust_reason(path, absent_ok=False)  # threat-model: P2 (run only what the trust rule admits)
    if problem:
        return None, f"not reading {path}: {problem}"
    env = dict(env_items, FLASHINFER_SM120_DISABLE="1")
    env.pop("SGLANG_CUDA_COREDUMP", None)  # its import of sglang.srt.debug_utils would pull in the server
    # threat-model: P6 (a deadline, an output cap, and the answer read as bounded JSON)
    res = proc.run([sys.executable, "-I", "-c", probe, path, function, *args], timeout=30.0,
                   max_output=1 << 16, env=env)
    text = res.text()
    at = text.rfind("\n@@")
    if not res.ok or at < 0:
        why = res.error or ("timed out" if res.timed_out else f"exit {res.returncode}")
        return None, f"{path} {function}() failed ({why}: {shown(text.strip()[-300:], 300)})"
    try:
        return loads_json(text[at + 3:], f"{path} {function}()"), f"read from {path} {function}()"
    except FormatError as exc:
        return None, str(exc)


def workspace_base(key: str, env: dict[str, str]) -> tuple[str | None, str]:
    """``(base, how)``: the ``FLASHINFER_WORKSPACE_BASE`` server ``key`` sets with ``env`` (``None``: FlashInfer's
    default), by its installed source, else by its row."""
    rule = servers.newest(key).cache_rule
    if rule is None:
        return None, f"{servers.newest(key).name} leaves FlashInfer's workspace as it is"
    if rule.variable in env:
        return env[rule.variable], f"{rule.variable} is set, which {key}'s setdefault keeps"
    from flashinfer_sm120.safety.formats.fields import field

    pkg = package_dir(key)
    why = f"{key} is not installed"
    if pkg is not None:
        path = os.path.join(pkg, *rule.environ_file.split("/"))
        got, why = _run_rule(_ENVIRON_PROBE, path, rule.function, tuple(sorted(env.items())))
        if got is not None:
            try:
                return field(got, rule.variable, str, f"{path} {rule.function}()", max_len=4096), why
            except FormatError as exc:
                why = str(exc)
    value = env.get(rule.from_variable, rule.default)
    if (value == "~" or value.startswith("~/")) and env.get("HOME"):  # the server's HOME, not ours
        value = env["HOME"].rstrip("/") + value[1:] if value != "~" else env["HOME"]
    return os.path.expanduser(value), (f"{rule.variable}={rule.from_variable} (default {rule.default}) as in "
                                       f"{rule.source} ({why})")


def jit_dir_for(base: str | None, jit_dir: str | None, this_base: str) -> str | None:
    """FlashInfer's ``jit_dir`` (under ``this_base``) as it is under ``base`` (0.7.x ``jit/env.py``)."""
    if jit_dir is None:
        return None
    if base is None:
        return jit_dir
    prefix = os.path.join(this_base, ".cache", "flashinfer")
    if jit_dir != prefix and not jit_dir.startswith(prefix + os.sep):
        return None
    return os.path.join(base, ".cache", "flashinfer") + jit_dir[len(prefix):]


def recorded() -> dict:
    """What a manifest entry records about the server process it came from (``build --from``)."""
    key = next((k for k in ("sglang", "vllm") if k in sys.modules), None)  # SGLang may import vLLM, not the reverse
    return {} if key is None else {"server": key, "workspace_base": os.environ.get("FLASHINFER_WORKSPACE_BASE")}


@functools.lru_cache(maxsize=8)
def _marker_found(pkg: str, rel: str, text: str) -> bool | None:
    from flashinfer_sm120.safety.formats.reads import read_text

    try:
        return text in read_text(os.path.join(pkg, *rel.split("/")), 8 << 20)
    except FormatError:
        return None


def fallbacks(found: list[servers.Installed] | None = None
              ) -> list[tuple[servers.Installed, servers.Fallback, bool | None]]:
    """Each installed server's fallbacks, and whether its source defines it (``None``: cannot tell)."""
    out = []
    for inst in servers.installed() if found is None else found:
        pkg = package_dir(inst.release.key)
        for fb in inst.release.fallbacks:
            seen = [_marker_found(pkg, rel, text) for rel, text in fb.markers] if pkg else [None]
            ok = False if False in seen else (None if None in seen else True)
            out.append((inst, fb, ok))
    return out


def fallback_text(found: list[servers.Installed] | None = None) -> str:
    """The guard message's last sentence: the installed servers' own ways to serve without FlashInfer's JIT."""
    parts: dict[str, list[str]] = {}
    for inst, fb, ok in fallbacks(found):
        note = "" if ok is not False else " (not found in its source: check --help)"
        parts.setdefault(inst.label(), []).append(fb.text + note)
    if not parts:
        return ""
    return ("Until then, to serve without FlashInfer's JIT kernels: "
            + "; ".join(f"{label}: {' and '.join(items)}" for label, items in parts.items()))


@dataclass(frozen=True)
class ArchChoice:
    """What a server's model process sets ``variable`` to (``None``: nothing), its ``targets``, and ``how`` found."""

    server: str
    name: str
    variable: str
    value: str | None
    targets: tuple[str, ...]
    function: str
    how: str


def server_arch(key: str, capabilities: list[tuple[int, int]], env: dict[str, str]) -> ArchChoice | None:
    """What server ``key``'s model process sets FlashInfer's arch list to on ``capabilities`` (``None``: no such
    rule); ``value`` is the first GPU's, ``targets`` every one's."""
    row = servers.newest(key)
    rule = row.arch_rule
    if rule is None:
        return None
    caps = tuple(dict.fromkeys((int(a), int(b)) for a, b in capabilities))
    values: list[str | None] | None = None
    pkg = package_dir(key)
    how = f"{key} is not installed"
    if pkg is not None and caps:
        path = os.path.join(pkg, *rule.file.split("/"))
        got, how = _run_rule(_ARCH_PROBE, path, rule.function, tuple(sorted(env.items())),
                             json.dumps([list(c) for c in caps]))
        if got is not None and not (isinstance(got, list) and len(got) == len(caps) and all(
                isinstance(e, dict) and all(isinstance(v, str) and len(v) <= 4096 for v in e.values()) for e in got)):
            got, how = None, (f"{path} {rule.function}() gave {shown(str(got), 200)}, not one "
                              f"environment per GPU")
        if got is not None:
            values = [e.get(rule.variable) for e in got]
    if values is None:
        on = env.get("SGLANG_IS_FLASHINFER_AVAILABLE", "true").lower() in ("true", "1")
        values = [f"{a}.{b}{rule.suffix}" if on and a >= rule.min_major else None for a, b in caps]
        how = (f"as in {row.name} {row.read_from}: {rule.variable}=<major>.<minor>{rule.suffix} for major >= "
               f"{rule.min_major} ({how})")
    targets = tuple(dict.fromkeys(nvcc_spelling(v) for v in values if v))
    return ArchChoice(key, row.name, rule.variable, values[0] if values else None, targets,
                      f"{row.name.lower()}/{rule.file} {rule.function}()", how)
