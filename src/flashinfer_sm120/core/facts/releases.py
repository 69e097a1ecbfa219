"""What each FlashInfer release needs from the toolkit, and what to patch in it (data).

One row per range of releases whose JIT layer behaves the same for us.  Every row
cites the FlashInfer files it was read from (wheels from PyPI; 0.4.x ships as an
sdist only).  The patch layer (:mod:`flashinfer_sm120.core.patch.steps`) and the
toolkit choice (``min_nvcc``) read this table; nothing else decides per release.

======================  ===========  =====================================================
releases                era          arch rules (``flashinfer/compilation_context.py``)
======================  ===========  =====================================================
< 0.4.0                 unsupported  not patched (version gate below)
0.4.0 - 0.4.x           inline-a     no ``_normalize_cuda_arch``; ``__init__`` adds ``a``
                                     for major >= 9; arch-list entries taken verbatim
0.5.0 - 0.6.7.postN     sm12x-120f   ``_normalize_cuda_arch``: every SM 12.x -> 120f,
                                     raises below nvcc 12.9
0.6.8 - 0.7.0.postN     sm121a       SM 12.0 -> 120f, SM 12.x -> 12xa, both need 12.9
0.7.1 -                 sm120a-12.8  SM 12.0 -> 120f on 12.9+, 120a on 12.8
======================  ===========  =====================================================

Every supported release computes the JIT workspace in ``flashinfer/jit/env.py``
``_get_workspace_dir_name()`` from ``CompilationContext().TARGET_CUDA_ARCHS``
(``~/.cache/flashinfer/<arch>`` before 0.6.18 in our table rows below,
``~/.cache/flashinfer/<version>/<arch>`` from 0.6.18), and looks up prebuilt
cubins (``FLASHINFER_CUBIN_DIR``, the ``flashinfer-cubin`` package, else
``~/.cache/flashinfer/cubins``) and AOT modules (the ``flashinfer-jit-cache``
package, else ``flashinfer/data/aot``) in ``jit/env.py`` independently of the
workspace, so a per-toolkit workspace leaves both lookups untouched.
"""

from __future__ import annotations

from dataclasses import dataclass

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

__all__ = ["ReleaseInfo", "RELEASES", "SUPPORTED", "TESTED_UP_TO", "release_info"]

#: The version gate: releases outside it are not patched (see :func:`release_info`).
SUPPORTED = SpecifierSet(">=0.4.0")

#: Newest release this table was checked against.
TESTED_UP_TO = Version("0.7.4")


@dataclass(frozen=True)
class ReleaseInfo:
    """What one FlashInfer release needs and how it is patched.

    Attributes:
        version: the release as read (``None`` when FlashInfer is not installed).
        supported: whether flashinfer-sm120 patches it.
        reason: why not supported (names the release and the fix), else ``None``.
        era: name of its arch-rule era (``"inline-a"``, ``"sm12x-120f"``,
            ``"sm121a"``, ``"sm120a-12.8"``; ``"unsupported"``/``"unknown"``).
        arch_rules: where its arch rules live, with the FlashInfer file they come from.
        has_normalizer: ``CompilationContext._normalize_cuda_arch`` exists.
        min_nvcc: minimum nvcc ``major.minor`` for the release's own build flags, or ``None``.
        min_nvcc_why: the flag and FlashInfer file behind ``min_nvcc``.
        workspace: how the release names its JIT workspace directory.
        prebuilt: where it looks up prebuilt cubins and AOT modules.
        guard_points: ``(module, attribute)`` JIT entry points guarded when no
            toolkit fits (``"Class.method"`` for methods).
        source: the FlashInfer files (and lines) the row was read from.
    """

    version: Version | None
    supported: bool
    reason: str | None
    era: str
    arch_rules: str = ""
    has_normalizer: bool = True
    min_nvcc: Version | None = None
    min_nvcc_why: str | None = None
    workspace: str = ""
    prebuilt: str = ""
    guard_points: tuple[tuple[str, str], ...] = ()
    source: str = ""

    def to_dict(self) -> dict:
        """JSON-ready form."""
        return {
            "version": str(self.version) if self.version else None,
            "supported": self.supported,
            "reason": self.reason,
            "era": self.era,
            "arch_rules": self.arch_rules,
            "min_nvcc": str(self.min_nvcc) if self.min_nvcc else None,
            "min_nvcc_why": self.min_nvcc_why,
            "workspace": self.workspace,
        }


_PREBUILT = ("cubins: flashinfer-cubin package, else $FLASHINFER_CUBIN_DIR, else "
             "~/.cache/flashinfer/cubins; AOT modules: flashinfer-jit-cache package, else "
             "flashinfer/data/aot (flashinfer/jit/env.py _get_cubin_dir/_get_aot_dir)")

#: JIT entry points that raise "sm75 or higher" or lead to nvcc, identical in 0.4.0 - 0.7.4:
#: flashinfer/jit/core.py ``check_cuda_arch`` (called by ``gen_jit_spec``), and
#: flashinfer/jit/cpp_ext.py ``generate_ninja_build_for_op`` (every ``write_ninja``) and
#: ``run_ninja`` (every build; core.py binds both by name, so the bindings are replaced too).
_GUARD = (("flashinfer.jit.core", "check_cuda_arch"),
          ("flashinfer.jit.cpp_ext", "generate_ninja_build_for_op"),
          ("flashinfer.jit.cpp_ext", "run_ninja"))

_COMPRESS = ("FlashInfer 0.6.18+ passes --compress-mode=size to every JIT build "
             "(flashinfer/jit/core.py gen_jit_spec, 0.6.18 line 546), which nvcc < 12.8 rejects")

#: ``(releases, row)``: first match wins.
RELEASES: tuple[tuple[SpecifierSet, dict], ...] = (
    (SpecifierSet(">=0.4.0,<0.5.0"), dict(
        era="inline-a", has_normalizer=False,
        arch_rules="CompilationContext.__init__ only: major >= 9 gets 'a' (SM120 -> 120a, "
                   "needs nvcc 12.8; SM121 -> 121a, 12.9); FLASHINFER_CUDA_ARCH_LIST entries "
                   "verbatim, so '12.0' gives plain compute_120",
        workspace="~/.cache/flashinfer/<arch>", source="flashinfer/compilation_context.py "
        "(0.4.0 lines 33-47), flashinfer/jit/env.py (0.4.0 line 130)")),
    (SpecifierSet(">=0.5.0,<0.6.8"), dict(
        era="sm12x-120f",
        arch_rules="CompilationContext._normalize_cuda_arch: SM 12.x -> 120f (SM121 too), "
                   "RuntimeError below nvcc 12.9",
        workspace="~/.cache/flashinfer/<arch>", source="flashinfer/compilation_context.py "
        "(0.5.0 lines 33-55, 0.6.7 lines 33-58), flashinfer/jit/env.py (0.6.7 line 130)")),
    (SpecifierSet(">=0.6.8,<0.6.18"), dict(
        era="sm121a",
        arch_rules="CompilationContext._normalize_cuda_arch: SM 12.0 -> 120f, SM 12.x -> 12xa, "
                   "RuntimeError below nvcc 12.9",
        workspace="~/.cache/flashinfer/<arch>", source="flashinfer/compilation_context.py "
        "(0.6.8 lines 36-58)")),
    (SpecifierSet(">=0.6.18,<0.7.1"), dict(
        era="sm121a", min_nvcc=Version("12.8"), min_nvcc_why=_COMPRESS,
        arch_rules="CompilationContext._normalize_cuda_arch: SM 12.0 -> 120f, SM 12.x -> 12xa, "
                   "RuntimeError below nvcc 12.9",
        workspace="~/.cache/flashinfer/<version>/<arch>", source="flashinfer/compilation_context.py "
        "(0.6.18 lines 64-90), flashinfer/jit/core.py (0.6.18 line 546), flashinfer/jit/env.py "
        "(0.6.18 line 148)")),
    (SpecifierSet(">=0.7.1"), dict(
        era="sm120a-12.8", min_nvcc=Version("12.8"), min_nvcc_why=_COMPRESS,
        arch_rules="CompilationContext._normalize_cuda_arch: SM 12.0 -> 120f on 12.9+, 120a on "
                   "12.8; SM 12.x -> 12xa, RuntimeError below 12.9",
        workspace="~/.cache/flashinfer/<version>/<arch>", source="flashinfer/compilation_context.py "
        "(0.7.1 lines 84-110, 0.7.4 lines 84-110), flashinfer/jit/core.py (0.7.4 line 781), "
        "flashinfer/jit/env.py (0.7.4 line 382)")),
)


def release_info(version: str | None) -> ReleaseInfo:
    """Look a FlashInfer release up in :data:`RELEASES`.

    Args:
        version: ``flashinfer.__version__`` (or the installed distribution's
            version), e.g. ``"0.6.18.post1"``; ``None`` when FlashInfer is absent.

    Returns:
        The row's :class:`ReleaseInfo`; ``supported=False`` with a ``reason`` for a
        release below :data:`SUPPORTED`, an unparsable version, or ``None``.
        Releases newer than :data:`TESTED_UP_TO` use the newest row.

    Raises:
        Nothing.
    """
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
    for spec, row in RELEASES:
        if base in spec:
            return ReleaseInfo(ver, True, None, prebuilt=_PREBUILT, guard_points=_GUARD, **row)
    return ReleaseInfo(ver, False, f"FlashInfer {ver} matches no row of the release table, "
                       "not patching. Fix: upgrade flashinfer-sm120", "unknown")  # pragma: no cover
