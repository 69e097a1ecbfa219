"""Compiler variables: options that make the compiler run other programs (P2).

``CXX``, ``FLASHINFER_*_LAUNCHER`` and ``FLASHINFER_NVCC`` are checked not only word by word for
the programs they run and the files they name, but for the compiler's own options too:
``CXX='g++ -B/tmp/x/'`` (g++ runs ``cc1plus``, ``as`` and ``ld`` from ``/tmp/x``),
``-wrapper /tmp/x/w,x``, ``-fplugin=/tmp/x/p.so``, ``-specs=/tmp/x/s`` and ``-Wl,--plugin`` kept
would make every JIT build run or load code from a directory anyone may write.
"""

from __future__ import annotations

import os

import pytest

from flashinfer_sm120.safety import compilers
from helpers.toolkits import script


@pytest.fixture
def evil(tmp_path):
    d = tmp_path / "evil"
    d.mkdir()
    d.chmod(0o777)
    for n in ("as", "ld", "cc1plus", "w", "p.so", "s"):
        script(d / n, "#!/bin/sh\n")
    return d


HOSTILE = ["g++ -B{d}/", "g++ -B {d}", "g++ -wrapper {d}/w,x", "g++ -fplugin={d}/p.so", "g++ -specs={d}/s",
           "g++ -Wl,--plugin={d}/p.so", "g++ -Xlinker -plugin", "g++ -I{d}", "g++ -isystem {d}",
           "g++ -fuse-ld={d}/ld", "g++ -save-temps={d}/"]


@pytest.mark.parametrize("value", HOSTILE)
def test_an_option_that_picks_programs_is_refused(evil, value):
    value = value.format(d=evil)
    problem = compilers.trust_problem(value, os.environ.get("PATH"))
    assert problem is not None, value
    assert len(problem) < 600


@pytest.mark.parametrize("value", ["g++", "g++ -O2", "g++ -std=c++17 -m64 -fPIC", "/usr/bin/g++ -Wall"])
def test_ordinary_compiler_values_are_kept(value):
    if not os.path.exists("/usr/bin/g++"):
        pytest.skip("no /usr/bin/g++ here")
    assert compilers.trust_problem(value, "/usr/bin:/bin") is None
