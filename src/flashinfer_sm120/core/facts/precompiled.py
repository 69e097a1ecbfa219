"""FlashInfer's precompiled kernels installed here, from package metadata: 0.7.4 ``jit/env.py`` loads from a provider
of :data:`GROUP` via ``flashinfer_jit_cache`` at its version (``+cuXYZ`` too), ``flashinfer-cubin`` at its exact one."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

GROUP = "flashinfer.jit_cache.providers"
_ARCH = re.compile(r"sm([0-9]{1,2})([0-9])([af]?)")


def tag(target: str) -> str:
    """FlashInfer's spelling of a target: ``12.0f`` or ``sm_120f`` -> ``sm120f``."""
    return "sm" + target.removeprefix("sm").replace(".", "").replace("_", "")


def runs_on(binary: str, target: str) -> bool:
    """Whether code for ``binary`` (``sm120f``) runs for ``target`` (``sm120a``), by FlashInfer 0.7.4's rule."""
    b, t = _ARCH.fullmatch(binary), _ARCH.fullmatch(target)
    if b is None or t is None:
        return False
    if b.group(3) == "a":
        return b.group(1, 2) == t.group(1, 2)
    return b.group(1) == t.group(1) and int(b.group(2)) <= int(t.group(2))


@dataclass(frozen=True)
class Provider:
    """One entry point of :data:`GROUP`: what it declares (schema 1), or ``error`` when it could not be read."""

    entry_point: str
    distribution: str = "?"
    version: str = "?"
    jit_cache_dir: str = ""
    cuda_architectures: frozenset = frozenset()
    modules: frozenset = frozenset()
    error: str | None = None

    def ships(self, module: str, targets: list[str]) -> bool:
        return (module in self.modules and bool(targets)
                and all(any(runs_on(a, t) for a in self.cuda_architectures) for t in targets)
                and os.path.isfile(os.path.join(self.jit_cache_dir, module, f"{module}.so")))


def _provider(ep) -> Provider:
    try:
        data = ep.load()
        data = data() if callable(data) else data
        if not isinstance(data, Mapping) or data.get("schema_version") != 1:
            return Provider(ep.name, error="not schema_version 1")
        return Provider(ep.name, str(data["distribution"]), str(data["version"]), str(data["jit_cache_dir"]),
                        frozenset(map(str, data["cuda_architectures"])), frozenset(map(str, data["modules"])))
    except Exception as exc:  # a broken provider is reported, not fatal to doctor or build
        return Provider(ep.name, error=f"{type(exc).__name__}: {exc}"[:300])


def dist_version(dist: str) -> str | None:
    """The installed distribution's version, read from its metadata (nothing imported), else ``None``."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


@dataclass(frozen=True)
class Precompiled:
    """The precompiled packages installed, and which FlashInfer would use."""

    flashinfer: str | None
    jit_cache: str | None  # the flashinfer-jit-cache package (the shim FlashInfer asks)
    cubin: str | None
    providers: tuple[Provider, ...]
    checks_off: bool = False  # FLASHINFER_DISABLE_VERSION_CHECK

    def mismatch(self, what: str, version: str | None) -> str | None:
        """Why FlashInfer ignores package ``what`` at ``version``; ``None``: it uses it."""
        if version is None or self.checks_off or self.flashinfer is None:
            return None
        if what == "flashinfer-cubin":
            ok = version == self.flashinfer
        elif what == "flashinfer-jit-cache":
            ok = version == self.flashinfer or version.startswith(self.flashinfer + "+")
        else:  # a provider: the shim's version exactly
            ok = self.jit_cache is not None and version == self.jit_cache and not self.mismatch(
                "flashinfer-jit-cache", self.jit_cache)
        return None if ok else f"{what} {version} does not match flashinfer-python {self.flashinfer}"

    def usable(self) -> list[Provider]:
        """The providers FlashInfer loads modules from."""
        if self.jit_cache is None or self.mismatch("flashinfer-jit-cache", self.jit_cache):
            return []
        return [p for p in self.providers if p.error is None and not self.mismatch(p.distribution, p.version)]

    def shipped_by(self, module: str, targets: list[str]) -> Provider | None:
        """The usable provider that ships ``module`` for ``targets`` (FlashInfer loads it, no JIT build)."""
        return next((p for p in self.usable() if p.ships(module, targets)), None)


def read() -> Precompiled:
    """What is installed here (entry points and metadata; FlashInfer not imported)."""
    eps = importlib.metadata.entry_points(group=GROUP)
    # FlashInfer asks the providers only through an importable flashinfer_jit_cache (has_flashinfer_jit_cache)
    shim = dist_version("flashinfer-jit-cache") if importlib.util.find_spec("flashinfer_jit_cache") else None
    return Precompiled(dist_version("flashinfer-python"), shim, dist_version("flashinfer-cubin"),
                       tuple(_provider(ep) for ep in sorted(eps, key=lambda e: e.name)),
                       bool(os.environ.get("FLASHINFER_DISABLE_VERSION_CHECK")))


def doctor_section(report: dict) -> dict:
    """``doctor``'s precompiled section: packages, their match, the JIT directory's modules shipped or JIT-built."""
    pc = read()
    targets = [tag(t) for t in ((report.get("resolution") or {}).get("choice") or {}).get("targets") or []]
    jit_dir = (report.get("after") or {}).get("jit_dir")
    try:
        used = sorted(e.name for e in os.scandir(jit_dir) if e.is_dir() and e.name != "tmp") if jit_dir else []
    except OSError:
        used = []
    packages = [{"name": n, "version": v, "mismatch": pc.mismatch(n, v)}
                for n, v in (("flashinfer-jit-cache", pc.jit_cache), ("flashinfer-cubin", pc.cubin)) if v]
    packages += [{"name": p.distribution, "version": p.version, "entry_point": p.entry_point, "error": p.error,
                  "mismatch": p.error or pc.mismatch(p.distribution, p.version),
                  "declares": sorted(p.cuda_architectures), "modules": len(p.modules),
                  "for_targets": sum(p.ships(m, targets) for m in p.modules) if p in pc.usable() else 0}
                 for p in pc.providers]
    shipped = {m: p.distribution for m in used if (p := pc.shipped_by(m, targets))}
    return {"flashinfer": pc.flashinfer, "targets": targets, "packages": packages, "shipped": shipped,
            "jit_build": [m for m in used if m not in shipped]}
