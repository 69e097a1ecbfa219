"""Toolkit layouts: the libraries a JIT link opens must be regular files (P1, P6).

A toolkit whose ``lib64/libcudart.so*`` or ``lib64/stubs/libcuda.so`` is a FIFO, a device or a
symlink loop (``os.path.exists`` is true for a FIFO) is neither used as ``CUDA_HOME`` nor linked into
a view with ``import flashinfer`` saying "patched": the first JIT link would hang in ``ld`` opening
the FIFO (or fail on the loop), under load, where a refusal at import names the file.
"""

from __future__ import annotations

import os

import pytest

from helpers.toolkits import make_toolkit
from flashinfer_sm120.core.view.build import linkable_home
from flashinfer_sm120.errors import ViewError
from flashinfer_sm120.core.toolkit.probe import inspect


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHINFER_SM120_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _fifo(p):
    p.unlink(missing_ok=True)
    os.mkfifo(p)


def _loop(p):
    p.unlink(missing_ok=True)
    os.symlink(p.name + ".loop", p)
    os.symlink(p.name, p.with_name(p.name + ".loop"))


def _dev(p):
    p.unlink(missing_ok=True)
    os.symlink("/dev/zero", p)


LAYOUTS = {
    "libcudart.so a FIFO": lambda lib: _fifo(lib / "libcudart.so"),
    "libcudart.so a symlink loop": lambda lib: _loop(lib / "libcudart.so"),
    "libcudart.so a device": lambda lib: _dev(lib / "libcudart.so"),
    # only a versioned runtime, and that one a FIFO: the view's own libcudart.so would point at it
    "libcudart.so.13 a FIFO": lambda lib: ((lib / "libcudart.so").unlink(), _fifo(lib / "libcudart.so.13")),
    "stubs/libcuda.so a FIFO": lambda lib: _fifo(lib / "stubs" / "libcuda.so"),
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_a_library_that_is_not_a_regular_file_is_never_handed_to_the_linker(tmp_path, cache, layout):
    root = make_toolkit(tmp_path / "tk", "13.0.88", curand=True)
    LAYOUTS[layout](root / "lib64")
    try:
        home = linkable_home(inspect(str(root)))
    except ViewError as exc:
        assert str(root) in str(exc) and "regular file" in str(exc), exc
        return
    for rel in ("lib64/libcudart.so", "lib64/stubs/libcuda.so"):  # what 'ld -lcudart -lcuda' opens
        assert os.path.isfile(os.path.join(home.path, rel)), (rel, home)


def test_an_ordinary_toolkit_is_still_used_as_it_is(tmp_path, cache):
    root = make_toolkit(tmp_path / "tk", "13.0.88", curand=True)
    assert linkable_home(inspect(str(root))).path == str(root)
