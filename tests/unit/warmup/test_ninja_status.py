"""Ninja's output as the build pool reads it is bounded input (P6).

Ninja passes the compilers' output through, so a line of theirs shaped like a status line
(``[<5000 digits>/1] x``) must not end ``build`` in a ``ValueError`` traceback from ``int()``
(Python's 4300-digit limit for integer strings).
"""

from __future__ import annotations

import io

from hypothesis import given, strategies as st

from flashinfer_sm120.warmup import moddir, pool
from helpers.warm import fake_job

NOISE = (b"[" + b"9" * 5000 + b"/1] fake\n"   # a status line's shape, a number int() refuses
         b"a\x00b\n"                          # a NUL byte
         b"[\xd9\xa3/\xd9\xa3] x\n"           # Arabic-Indic digits: \d matched them
         b"[1/1]\n" + b"x" * 200_000 + b"\n")  # a huge single line


def test_compiler_output_shaped_like_status_lines_does_not_stop_the_build(tmp_path):
    job = fake_job(tmp_path, "m", 1)
    (tmp_path / "noise.txt").write_bytes(NOISE)
    nvcc = tmp_path / "fake_nvcc.sh"
    nvcc.write_text(f"cat {tmp_path / 'noise.txt'}\n" + nvcc.read_text())
    out = io.StringIO()
    res = pool.run_pool([job], 1, out)
    assert [r.status for r in res] == ["built"], out.getvalue()[-2000:]
    assert "[2/2] done: m" in out.getvalue()


@given(st.text(alphabet=st.sampled_from("[]/ 0123456789\u0663\U0001d7d7x"), max_size=40)
       | st.from_regex(r"\[[0-9]{1,6000}/[0-9]{1,20}\] .*", fullmatch=True))
def test_a_status_line_is_ascii_numbers_int_can_read(line):
    m = moddir.STATUS_RE.match(line)
    if m:
        assert 0 <= int(m.group(1)) < 10**9 and 0 <= int(m.group(2)) < 10**9
