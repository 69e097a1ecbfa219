"""A bound against a hang (never a speed goal): :func:`hang_guard`; waiting for what a process does
without guessing how long it takes under load: :func:`until`."""

from __future__ import annotations

import signal
import time
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


def until(check, seconds: float = 60, step: float = 0.05):
    """``check()``'s first true value, polled every ``step`` seconds; its last value after ``seconds``
    (a bound against a hang: a loaded machine takes what it takes, a broken one fails the assertion)."""
    deadline = time.monotonic() + seconds
    while True:
        value = check()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(step)
