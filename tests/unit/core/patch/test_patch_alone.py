"""The "FlashInfer would already do this" probe, whatever way a release imports its helpers.

Runs FlashInfer-shaped classes (no FlashInfer needed): the probe must answer
each release's own ``_normalize_cuda_arch`` with the chosen nvcc version, without
importing the real ``flashinfer.jit.cpp_ext`` or touching global state.
"""

import builtins
import sys
import textwrap
import types

import pytest
from packaging.version import Version

from flashinfer_sm120.core.patch.alone import flashinfer_would_target

BODY = '''
import os
{top}
class CompilationContext:
    @staticmethod
    def _normalize_cuda_arch(major, minor):
        if major == 12:
            {inner}
            if {call}("12.9"):
                return (12, "0f")
            raise RuntimeError("SM 12.x requires CUDA >= 12.9")
        return (major, str(minor))

    def __init__(self):
        self.TARGET_CUDA_ARCHS = set()
        for major, minor in [(12, 0), (8, 9)]:
            try:
                self.TARGET_CUDA_ARCHS.add(self._normalize_cuda_arch(major, minor))
            except Exception as e:
                logger.warning("Failed: %s", e)
'''

STYLES = {
    "absolute from-import": ("", "from flashinfer.jit.cpp_ext import is_cuda_version_at_least",
                             "is_cuda_version_at_least"),
    "relative from-import": ("", "from .jit.cpp_ext import is_cuda_version_at_least", "is_cuda_version_at_least"),
    "package from-import": ("", "from flashinfer.jit import cpp_ext", "cpp_ext.is_cuda_version_at_least"),
    "plain import": ("", "import flashinfer.jit.cpp_ext", "flashinfer.jit.cpp_ext.is_cuda_version_at_least"),
    "module-level name": ("def is_cuda_version_at_least(v):\n    raise AssertionError('real one called')",
                          "pass", "is_cuda_version_at_least"),
}


def _load(style):
    top, inner, call = STYLES[style]
    mod = types.ModuleType("flashinfer.compilation_context")
    mod.__package__ = "flashinfer"
    mod.logger = types.SimpleNamespace(warning=lambda *a: (_ for _ in ()).throw(AssertionError("warned")))
    exec(textwrap.dedent(BODY.format(top=top, inner=inner, call=call)), vars(mod))
    return mod.CompilationContext


@pytest.mark.parametrize("style", sorted(STYLES))
def test_probe_answers_every_import_style(style, monkeypatch):
    cls = _load(style)
    before = dict(sys.modules), builtins.__import__
    assert flashinfer_would_target(cls, Version("13.0"), "/x") == {(12, "0f"), (8, "9")}
    # nvcc 12.8: FlashInfer's own normaliser raises for SM 12.x and FlashInfer drops it
    assert flashinfer_would_target(cls, Version("12.8"), "/x") == {(8, "9")}
    assert "flashinfer.jit.cpp_ext" not in sys.modules or sys.modules["flashinfer.jit.cpp_ext"] is before[0].get(
        "flashinfer.jit.cpp_ext")
    assert builtins.__import__ is before[1]


def test_probe_reports_none_when_flashinfer_raises():
    class CompilationContext:
        def __init__(self):
            raise ValueError("garbled FLASHINFER_CUDA_ARCH_LIST")

    assert flashinfer_would_target(CompilationContext, Version("13.0"), "/x") is None
