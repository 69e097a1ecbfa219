"""What an installed server does in a process with a given environment, found without importing it:
vLLM's ``has_flashinfer()``, the FlashInfer workspace SGLang sets (its rule run from its own source in
a child), the JIT directory that gives, the server this process is, and which fallbacks its source defines.

The rows these follow, per release, are :data:`flashinfer_sm120.core.facts.servers.SERVERS`.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import sys

from flashinfer_sm120.core.facts import servers
from flashinfer_sm120.core.toolkit.sources import flashinfer_naive_root

__all__ = ["vllm_has_flashinfer", "workspace_base", "jit_dir_for", "running", "recorded", "fallbacks",
           "fallback_text", "expanduser"]

_ENVIRON_TIMEOUT_S = 30.0


# ----------------------------------------------------------------------------- nvcc and ninja, as they look


def vllm_has_flashinfer(env: dict[str, str]) -> tuple[bool, str]:
    """``has_flashinfer()`` as vLLM 0.33.0 computes it in a process with environment ``env``.

    Returns:
        ``(value, why)``: why names the nvcc and ninja found, or what is missing."""
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


# ----------------------------------------------------------------------------- cache redirection


_SGLANG_PROBE = r"""
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("_flashinfer_sm120_server_environ", sys.argv[1])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
sys.stdout.write("\n@@" + json.dumps(getattr(mod, sys.argv[2])()))
"""


def _package_dir(key: str) -> str | None:
    try:
        spec = importlib.util.find_spec(key)  # a top-level package: found, not imported
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


@functools.lru_cache(maxsize=32)
def _read_rule(path: str, function: str, variable: str, env_items: tuple) -> tuple[str | None, str]:
    """Run ``function()`` of the installed server's file at ``path`` in a child (standard library
    only, nothing else of the server imported), with the given environment."""
    from flashinfer_sm120.safety import formats, proc
    from flashinfer_sm120.safety.ownership import trust_reason

    problem = trust_reason(path, absent_ok=False)
    if problem:
        return None, f"not reading {path}: {problem}"
    env = dict(env_items)
    env.pop("SGLANG_CUDA_COREDUMP", None)  # its import of sglang.srt.debug_utils would pull in the server
    env["FLASHINFER_SM120_DISABLE"] = "1"
    res = proc.run([sys.executable, "-I", "-c", _SGLANG_PROBE, path, function], timeout=_ENVIRON_TIMEOUT_S,
                   max_output=1 << 16, env=env)
    text = res.text()
    at = text.rfind("\n@@")
    if not res.ok or at < 0:
        why = res.error or ("timed out" if res.timed_out else f"exit {res.returncode}")
        return None, f"{path} {function}() failed ({why}: {formats.shown(text.strip()[-300:], 300)})"
    try:
        value = formats.field(formats.loads_json(text[at + 3:], f"{path} {function}()"), variable, str,
                              f"{path} {function}()", max_len=4096)
    except formats.FormatError as exc:
        return None, str(exc)
    return value, f"read from {path} {function}()"


def workspace_base(key: str, env: dict[str, str]) -> tuple[str | None, str]:
    """The ``FLASHINFER_WORKSPACE_BASE`` server ``key`` gives FlashInfer in a process with ``env``.

    ``None`` means FlashInfer's own default (``FLASHINFER_WORKSPACE_BASE``, else the home
    directory).  For SGLang the rule is run from the installed package when it is there,
    else taken from the row.

    Returns:
        ``(base or None, how it was found)``."""
    rule = servers.newest(key).cache_rule
    if rule is None:
        return None, f"{servers.newest(key).name} leaves FlashInfer's workspace as it is"
    if rule.variable in env:
        return env[rule.variable], f"{rule.variable} is set, which {key}'s setdefault keeps"
    pkg = _package_dir(key)
    why = f"{key} is not installed"
    if pkg is not None:
        value, why = _read_rule(os.path.join(pkg, *rule.environ_file.split("/")), rule.function,
                                rule.variable, tuple(sorted(env.items())))
        if value is not None:
            return value, why
    value = env.get(rule.from_variable)
    expanded = expanduser(value if value is not None else rule.default, env)
    return expanded, f"{rule.variable}={rule.from_variable} (default {rule.default}) as in {rule.source} ({why})"


def expanduser(text: str, env: dict[str, str]) -> str:
    """``os.path.expanduser`` with ``HOME`` taken from ``env`` (as the server process would)."""
    if (text == "~" or text.startswith("~/")) and env.get("HOME"):
        return (env["HOME"].rstrip("/") or "/") + text[1:] if text != "~" else env["HOME"]
    return os.path.expanduser(text)


def jit_dir_for(base: str | None, jit_dir: str | None, this_base: str) -> str | None:
    """``jit_dir`` (FlashInfer's, computed under workspace base ``this_base``) as it is under
    ``base`` (FlashInfer 0.7.x ``flashinfer/jit/env.py``: ``<base>/.cache/flashinfer/...``)."""
    if jit_dir is None:
        return None
    if base is None:
        return jit_dir
    prefix = os.path.join(this_base, ".cache", "flashinfer")
    if jit_dir != prefix and not jit_dir.startswith(prefix + os.sep):
        return None
    return os.path.join(base, ".cache", "flashinfer") + jit_dir[len(prefix):]


def running() -> str | None:
    """The server whose process this is (its package is imported), or ``None``."""
    for key in ("sglang", "vllm"):  # SGLang may import vLLM's kernels, not the reverse
        if key in sys.modules:
            return key
    return None


def recorded() -> dict:
    """What a manifest entry records about the server process it came from (for
    ``build --from``): ``server`` and ``workspace_base``; ``{}`` outside a server."""
    key = running()
    if key is None:
        return {}
    return {"server": key, "workspace_base": os.environ.get("FLASHINFER_WORKSPACE_BASE")}


# ----------------------------------------------------------------------------- fallbacks


@functools.lru_cache(maxsize=8)
def _marker_found(pkg: str, rel: str, text: str) -> bool | None:
    from flashinfer_sm120.safety import formats

    try:
        return text in formats.read_text(os.path.join(pkg, *rel.split("/")), 8 << 20)
    except formats.FormatError:
        return None


def fallbacks(found: list[servers.Installed] | None = None
              ) -> list[tuple[servers.Installed, servers.Fallback, bool | None]]:
    """Each installed server's fallbacks, with whether the installed source defines it
    (``None``: could not tell)."""
    out = []
    for inst in servers.installed() if found is None else found:
        pkg = _package_dir(inst.release.key)
        for fb in inst.release.fallbacks:
            seen = [_marker_found(pkg, rel, text) for rel, text in fb.markers] if pkg else [None]
            ok = False if False in seen else (None if None in seen else True)
            out.append((inst, fb, ok))
    return out


def fallback_text(found: list[servers.Installed] | None = None) -> str:
    """One sentence for the guard's message, after its fix: the installed servers' own
    ways to serve without FlashInfer's JIT ("" when no server is installed)."""
    parts: dict[str, list[str]] = {}
    for inst, fb, ok in fallbacks(found):
        note = "" if ok is not False else " (not found in its source: check --help)"
        parts.setdefault(inst.label(), []).append(fb.text + note)
    if not parts:
        return ""
    return ("Until then, to serve without FlashInfer's JIT kernels: "
            + "; ".join(f"{label}: {' and '.join(items)}" for label, items in parts.items()))

