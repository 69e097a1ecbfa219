"""A bound against a hang (never a speed goal): :func:`hang_guard`."""

from __future__ import annotations

import signal
from contextlib import contextmanager


@contextmanager
def hang_guard(seconds: int):
    """Fail (not hang) when the body runs past ``seconds``: a bound against a hang, not a speed goal.
    Main thread only (``SIGALRM``)."""
    def _alarm(*_):
        raise AssertionError(f"still running after {seconds} s: a hang")
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
