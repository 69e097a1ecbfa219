"""Set up FlashInfer for a warm-up build and build a list of specs in one pool."""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from flashinfer_sm120.errors import Sm120Error

if TYPE_CHECKING:
    from flashinfer_sm120.core.toolkit.model import Toolkit

#: ``build --for`` values: the servers whose JIT directory a warm-up build can target.
SERVER_CHOICES = ("vllm", "sglang")

_WSB = "FLASHINFER_WORKSPACE_BASE"


class BuildError(Sm120Error):
    """The warm-up build cannot start; the message names the fix."""


@dataclasses.dataclass
class Session:
    """What this process builds with: FlashInfer's version, toolkit and targets."""

    flashinfer: str
    cuda_home: str
    cuda_version: str
    targets: list[str]
    jit_dir: Path
    summary: str
    targets_from: str | None = None
    toolkit: Toolkit | None = None  # the one the patch chose; None: FlashInfer's own


NO_TARGETS = ("no target architectures: no GPU is visible and no --arch was given; "
              "pass e.g. --arch 12.0 (RTX 5090 / RTX PRO 6000) or --arch 12.1 (DGX Spark)")


def no_gpu_no_arch() -> bool:
    """No arch list is set and no GPU can give one, known without importing torch or FlashInfer: NVML
    counted none, or failed where no ``/dev/nvidia*`` exists (torch may see a GPU NVML cannot)."""
    import glob

    from flashinfer_sm120.core.facts import gpus

    if os.environ.get("FLASHINFER_CUDA_ARCH_LIST"):
        return False
    found = gpus.query(torch_fallback=False)
    return not found.gpus and (found.source == "nvml" or not glob.glob("/dev/nvidia[0-9]*"))


def _server_for(for_server: str | None, entries, strict: bool) -> tuple[str | None, str]:
    """Which server's JIT directory to build into, and why (``None``: FlashInfer's own)."""
    from flashinfer_sm120.core.facts import serverprobe, servers

    if for_server is not None:
        return for_server, f"--for {for_server}"
    recorded = sorted({e["server"] for e in entries or () if e.get("server") in SERVER_CHOICES})
    if len(recorded) == 1:
        return recorded[0], "the manifest was recorded under it"
    if len(recorded) > 1 and strict:
        raise BuildError(f"the manifest was recorded under {' and '.join(recorded)}, whose JIT directories "
                         f"differ: pass --for {recorded[0]} or --for {recorded[1]}")
    here = [i.release.key for i in servers.installed()]
    if len(here) == 1:
        return here[0], f"{here[0]} is installed here"
    if not here:
        return None, "no server is installed here"
    default = os.environ.get(_WSB) or os.path.expanduser("~")  # FlashInfer's own; empty is unset (workspace.normalize_base)
    bases = {k: serverprobe.workspace_base(k, dict(os.environ))[0] or default for k in here}
    if len(set(bases.values())) == 1:
        return here[0], f"{' and '.join(here)} are installed and use the same directory"
    if strict:
        shown = ", ".join(f"{k}: {b}" for k, b in bases.items())
        raise BuildError(f"{' and '.join(here)} are installed here and put FlashInfer's JIT cache in different "
                         f"places (FLASHINFER_WORKSPACE_BASE {shown}): pass --for "
                         f"{' or --for '.join(here)}, or set FLASHINFER_WORKSPACE_BASE so that both use one")
    return None, f"{' and '.join(here)} are installed here and use different directories"


def apply_server_cache(for_server: str | None = None, entries=None, *, strict: bool = True) -> dict:
    """Point FlashInfer's workspace where the server (:func:`_server_for`) will look, before FlashInfer's import
    (SGLang's ``SGLANG_CACHE_DIR``); ``strict`` (``build``, not ``doctor``) raises when it cannot be decided."""
    from flashinfer_sm120.core.facts import serverprobe, servers

    before = os.environ.get(_WSB)
    key, why = _server_for(for_server, entries, strict)
    out = {"server": key, "why": why, "base": before, "how": "", "before": before, "changed": False}
    if key is None:
        out["how"] = "FlashInfer's own default" if before is None else f"{_WSB} is set"
        return out
    base, out["how"] = serverprobe.workspace_base(key, dict(os.environ))
    if base is None or base == before:
        return out
    if not os.path.isabs(base):
        out["how"] = (f"{servers.newest(key).name}'s rule gives {_WSB}={base!r} ({out['how']}), a relative path: "
                      f"FlashInfer would build in the server's current directory. Fix: set SGLANG_CACHE_DIR "
                      f"(or {_WSB}) to an absolute directory")
        if strict:
            raise BuildError(out["how"])
        return out
    os.environ[_WSB] = base
    return dict(out, base=base, changed=True)


def apply_server_arch(server: str | None, sess: Session):
    """Set the arch list as ``server``'s model processes do after FlashInfer's import (SGLang's ``set_cuda_arch()``
    in ``ModelRunner.load_model()``), so what is built here is what it finds; the ``ArchChoice`` applied, or None."""
    from flashinfer_sm120.core.facts import serverprobe

    if server is None:
        return None
    caps = list(dict.fromkeys((int(t.split(".")[0]), int(t.split(".")[1][0])) for t in sess.targets))
    choice = serverprobe.server_arch(server, caps, dict(os.environ))
    if choice is None or choice.value is None:
        return None
    if len(choice.targets) > 1:
        raise BuildError(f"{choice.name}'s {choice.function} makes each model process build for its own GPU only "
                         f"({', '.join(choice.targets)}) in one shared JIT directory, so no single warm-up serves "
                         f"them all: warm each kind of GPU on its own, e.g. --arch {sess.targets[0][:4]}")
    os.environ[choice.variable] = choice.value
    return choice


def only_list(on: bool = True) -> None:
    """FlashInfer imported here makes its workspace (the directory, its log) in a private directory:
    a command that only lists, or one until its checks pass (P4); ``on=False`` then hands back the real one."""
    import wrapt

    from flashinfer_sm120.core.patch.state import STATE
    from flashinfer_sm120.core.patch.steps import refresh_derived

    if on and not STATE.listing:
        # runs after the patch's own hook (registered at import), and in every mode (guard, disabled)
        wrapt.register_post_import_hook(lambda env: STATE.listing and setattr(
            env, "FLASHINFER_WORKSPACE_DIR", type(env.FLASHINFER_WORKSPACE_DIR)(STATE.listing_dir())),
            "flashinfer.jit.env")
    elif not on and STATE.listing:
        STATE.listing = False
        refresh_derived()  # the real workspace, made
    STATE.listing = on


def prepare(targets_from: str | None = None) -> Session:
    """Patch and import FlashInfer for the arch list exported (default: the GPUs present); ``targets_from``
    (``from --arch 12.0``) goes into the summary.  :raises BuildError: naming the fix."""
    os.environ.setdefault("FLASHINFER_SM120_QUIET", "1")  # the summary is printed by the caller
    from flashinfer_sm120.core.facts.refusals import builds_refused, import_failure, import_refused

    refusal = import_refused()  # threat-model: P4: FlashInfer's import would write where it must not
    if refusal is not None:
        raise BuildError(str(refusal))
    import flashinfer_sm120 as shim
    from flashinfer_sm120.core.patch.state import STATE

    shim.install()
    listing = STATE.listing
    only_list()  # threat-model: P4: FlashInfer's import makes its workspace privately until the checks below pass
    try:
        import flashinfer.jit.core as core
        import flashinfer.jit.cpp_ext as cx
        from flashinfer import __version__ as fi_version
        from flashinfer.jit import env as jit_env
    except Exception as exc:
        if isinstance(exc, ModuleNotFoundError) and (exc.name or "").partition(".")[0] == "flashinfer":
            raise BuildError(f"FlashInfer is not installed for {sys.executable}: pip install flashinfer-python "
                             f"(into the environment of that interpreter)") from None
        raise BuildError(import_failure(exc, shim.status())) from None
    st = shim.status()
    if st["mode"] == "disabled":
        raise BuildError("FLASHINFER_SM120_DISABLE is set, so FlashInfer would build with its own "
                         "toolkit choice; unset it (or set it to 0) to build with flashinfer-sm120")
    if st["mode"] == "guard":  # what was found and the fix, once: on stderr, and in --json's error
        raise BuildError(st["error"])
    if st["mode"] not in ("patched", "noop"):
        raise BuildError(f"FlashInfer could not be set up ({st['mode']}): {st['error']}")
    if not st["target_cuda_archs"]:
        raise BuildError(NO_TARGETS)
    targets = sorted(f"{a}.{b}" for a, b in core.current_compilation_context.TARGET_CUDA_ARCHS)
    problem = builds_refused(str(jit_env.FLASHINFER_JIT_DIR))
    if problem:
        raise BuildError(problem)
    only_list(listing)
    from flashinfer_sm120.core.patch.state import render, targets_from_text

    with STATE.lock:  # the patch's summary line (the mode is patched or noop), where the targets came from, its toolkit
        res = STATE.resolution
        chosen = res is not None and res.choice is not None
        summary = render(STATE.mode, res, targets_from) if targets_from and res is not None else STATE.summary
        return Session(str(fi_version), cx.get_cuda_path(), str(cx.get_cuda_version()), targets,
                       Path(jit_env.FLASHINFER_JIT_DIR), summary,
                       targets_from or (targets_from_text(res) if chosen else None),
                       res.choice.toolkit if chosen else None)
