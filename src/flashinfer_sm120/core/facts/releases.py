"""What each FlashInfer release needs from the toolkit and how it is patched: one row per range of releases
whose JIT layer behaves the same; nothing else decides per release (``docs/releases.md``, ``docs/gen_ref.py``)."""

from __future__ import annotations

from dataclasses import dataclass

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

#: The version gate: releases outside it are not patched.
SUPPORTED = SpecifierSet(">=0.4.0")

#: Newest release this table was checked against.
TESTED_UP_TO = Version("0.7.4")


@dataclass(frozen=True)
class ReleaseInfo:
    """One release's row: ``reason`` it is unsupported, ``min_nvcc`` its flags need, ``guard_points`` guarded."""

    version: Version | None
    supported: bool
    reason: str | None
    era: str
    arch_rules: str = ""
    has_normalizer: bool = True  # CompilationContext._normalize_cuda_arch exists
    min_nvcc: Version | None = None
    min_nvcc_why: str | None = None
    workspace: str = ""
    guard_points: tuple[tuple[str, str], ...] = ()

    def to_dict(self) -> dict:
        keys = ("version", "supported", "reason", "era", "arch_rules", "min_nvcc", "min_nvcc_why", "workspace")
        out = {k: getattr(self, k) for k in keys}
        return {k: str(v) if isinstance(v, Version) else v for k, v in out.items()}


#: JIT entry points that raise "sm75 or higher" or lead to nvcc, identical in 0.4.0 - 0.7.4:
#: flashinfer/jit/core.py ``check_cuda_arch`` (called by ``gen_jit_spec``), and
#: flashinfer/jit/cpp_ext.py ``generate_ninja_build_for_op`` (every ``write_ninja``) and
#: ``run_ninja`` (every build; core.py binds both by name, so the bindings are replaced too).
_GUARD = (("flashinfer.jit.core", "check_cuda_arch"),
          ("flashinfer.jit.cpp_ext", "generate_ninja_build_for_op"),
          ("flashinfer.jit.cpp_ext", "run_ninja"))

_COMPRESS = ("FlashInfer 0.6.18+ passes --compress-mode=size to every JIT build "
             "(flashinfer/jit/core.py gen_jit_spec, 0.6.18 line 546), which nvcc < 12.8 rejects")
_NORMALIZE = "CompilationContext._normalize_cuda_arch: "
_SM121A = _NORMALIZE + "SM 12.0 -> 120f, SM 12.x -> 12xa, RuntimeError below nvcc 12.9"
_OLD_WS, _NEW_WS = "~/.cache/flashinfer/<arch>", "~/.cache/flashinfer/<version>/<arch>"

#: ``(releases, row)``, first match wins.  Verified against the wheels of 0.4.0 (sdist), 0.5.0, 0.6.7, 0.6.8,
#: 0.6.18, 0.7.1, 0.7.2.post1 and 0.7.4 (0.7.3 is not on the index here): ``compilation_context.py`` (arch
#: rules), ``jit/core.py`` (flags), ``jit/env.py`` ``_get_workspace_dir_name()`` (workspace; prebuilt cubins
#: and AOT modules are looked up apart from it, so a per-toolkit workspace leaves them untouched).
RELEASES: tuple[tuple[SpecifierSet, dict], ...] = (
    (SpecifierSet(">=0.4.0,<0.5.0"), dict(
        era="inline-a", has_normalizer=False, workspace=_OLD_WS,
        arch_rules="CompilationContext.__init__ only: major >= 9 gets 'a' (SM120 -> 120a, "
                   "needs nvcc 12.8; SM121 -> 121a, 12.9); FLASHINFER_CUDA_ARCH_LIST entries "
                   "verbatim, so '12.0' gives plain compute_120")),
    (SpecifierSet(">=0.5.0,<0.6.8"), dict(
        era="sm12x-120f", workspace=_OLD_WS,
        arch_rules=_NORMALIZE + "SM 12.x -> 120f (SM121 too), RuntimeError below nvcc 12.9")),
    (SpecifierSet(">=0.6.8,<0.6.18"), dict(era="sm121a", arch_rules=_SM121A, workspace=_OLD_WS)),
    (SpecifierSet(">=0.6.18,<0.7.1"), dict(
        era="sm121a", min_nvcc=Version("12.8"), min_nvcc_why=_COMPRESS, arch_rules=_SM121A, workspace=_NEW_WS)),
    (SpecifierSet(">=0.7.1"), dict(
        era="sm120a-12.8", min_nvcc=Version("12.8"), min_nvcc_why=_COMPRESS, workspace=_NEW_WS,
        arch_rules=_NORMALIZE + "SM 12.0 -> 120f on 12.9+, 120a on 12.8; SM 12.x -> 12xa, RuntimeError below 12.9")),
)


def release_info(version: str | None) -> ReleaseInfo:
    """The :data:`RELEASES` row of FlashInfer ``version`` (``None``: not installed); never raises."""
    if version is None:
        return ReleaseInfo(None, False, "FlashInfer is not installed", "unknown")
    try:
        ver = Version(str(version))
    except InvalidVersion:
        return ReleaseInfo(None, False, f"FlashInfer version {version!r} cannot be parsed; "
                           "not patching. Fix: reinstall flashinfer-python", "unknown")
    # Pre-releases (0.6.18rc10) and local versions (+cu129) follow their release's row.
    base = Version(ver.base_version)
    if base not in SUPPORTED:
        return ReleaseInfo(ver, False, f"FlashInfer {ver} is not supported (flashinfer-sm120 "
                           f"supports FlashInfer {SUPPORTED}), not patching. Fix: pip install "
                           "'flashinfer-python>=0.4.0', or uninstall flashinfer-sm120", "unsupported")
    row = next(row for spec, row in RELEASES if base in spec)  # the rows cover SUPPORTED
    return ReleaseInfo(ver, True, None, guard_points=_GUARD, **row)
