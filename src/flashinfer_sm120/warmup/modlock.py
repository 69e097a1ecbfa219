"""FlashInfer's per-module lock, taken as FlashInfer takes it: a wait is told, another uid's holder refused.

FlashInfer 0.4 - 0.7.x (``flashinfer/jit/core.py``) serialises builds of one module on
``FileLock(FLASHINFER_JIT_DIR/tmp/<name>.lock)``: servers, ``build`` and ``cache import`` take turns
(threat-model: P5).  Anyone who can read the file can hold it for ever, so a holder of another uid
ends the wait at once (P6).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from filelock import FileLock, Timeout  # a dependency (and FlashInfer's)

from flashinfer_sm120.errors import PlaceError
from flashinfer_sm120.safety.fs.lease import Holder, holders

#: Seconds between two "still waiting" lines while another process of this user builds the module.
SAY_EVERY_S = 60.0


def lock_path(jit_dir: str | os.PathLike, name: str) -> Path:
    return Path(jit_dir) / "tmp" / f"{name}.lock"


def try_take(path: str | os.PathLike) -> FileLock | None:
    lock = FileLock(str(path), thread_local=False)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        return None
    return lock


def foreign_holder(path: str | os.PathLike) -> Holder | None:
    me = os.geteuid()
    return next((h for h in holders(path) if h.uid is not None and h.uid != me), None)


def refusal(path: str | os.PathLike, label: str, h: Holder) -> str:
    return (f"{label}: FlashInfer's lock {path} is held by pid {h.pid} of uid {h.uid}, not you; it can hold "
            f"your build off for as long as it likes, so it is not waited for. Fix: build in a JIT directory "
            f"others cannot enter (mkdir -m 700 ~/fi-jit; FLASHINFER_WORKSPACE_BASE=~/fi-jit), or ask uid "
            f"{h.uid} to end pid {h.pid}")


def take(path: str | os.PathLike, label: str, say: Callable[[str], None], *,
         every: float = SAY_EVERY_S, poll: float = 0.5) -> FileLock:
    """The lock at ``path``, waited for while this user's processes hold it (told to ``say`` every
    ``every`` s); :raises PlaceError: another uid holds it."""
    t0, said = time.monotonic(), None
    while (lock := try_take(path)) is None:
        h = foreign_holder(path)
        if h is not None:
            raise PlaceError(refusal(path, label, h))
        now = time.monotonic()
        if said is None or now - said >= every:
            said = now
            pids = ", ".join(str(x.pid) for x in holders(path)) or "not visible here"
            say(f"{label}: waiting for another process building it (FlashInfer's lock {path}, held by "
                f"pid {pids}){f'; {round(now - t0)} s so far' if now > t0 + 1 else ''}")
        time.sleep(poll)
    return lock


@contextlib.contextmanager
def held(path: str | os.PathLike, label: str, say: Callable[[str], None]) -> Iterator[None]:
    lock = take(path, label, say)
    try:
        yield
    finally:
        lock.release()
