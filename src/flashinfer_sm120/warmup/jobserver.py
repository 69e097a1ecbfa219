"""One GNU make jobserver shared by the ninjas of a build pool (see :class:`Jobserver`)."""

from __future__ import annotations

import os

from flashinfer_sm120.safety.fs.tmpdirs import make_private

__all__ = ["Jobserver", "cache_clear", "supports"]


class Jobserver:
    """A GNU make jobserver (a FIFO of tokens) shared by every module's ninja (ninja 1.13+
    is a client: ``MAKEFLAGS=--jobserver-auth=fifo:PATH`` and no ``-j``; ninja
    ``src/jobserver.h``, 1.13.2).  Each running ninja holds one token taken by the pool
    for it (its implicit slot) and takes more from the FIFO for further steps, so a module
    grows into slots the others free, whenever they free them.  At most ``slots`` steps
    run.  A token a killed ninja never returned is refilled when nothing runs."""

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self._dir = make_private("flashinfer-sm120-jobserver-")  # swept by the next build if we are killed
        self.dir = self._dir.path
        self.path = os.path.join(self.dir, "fifo")
        os.mkfifo(self.path, 0o600)
        self.fd = os.open(self.path, os.O_RDWR | os.O_NONBLOCK)
        os.write(self.fd, b"+" * slots)

    def take(self, nothing_runs: bool) -> bool:
        try:
            return len(os.read(self.fd, 1)) == 1
        except BlockingIOError:
            if not nothing_runs:
                return False
        self.refill()
        return len(os.read(self.fd, 1)) == 1

    def give(self) -> None:
        os.write(self.fd, b"+")

    def refill(self) -> None:
        """Nothing runs: every token is ours again."""
        try:
            while os.read(self.fd, 4096):
                pass
        except BlockingIOError:
            pass
        os.write(self.fd, b"+" * self.slots)

    def env(self) -> dict:
        return {"MAKEFLAGS": f" -j{self.slots} --jobserver-auth=fifo:{self.path}"}

    def close(self) -> None:
        os.close(self.fd)
        self._dir.close()


_SUPPORTS: dict[str, bool] = {}


def cache_clear() -> None:
    """Forget which ninja binaries were found to be jobserver clients (after one was replaced)."""
    _SUPPORTS.clear()


def supports(binary: str) -> bool:
    """Whether ninja ``binary`` is a jobserver client (1.13.0+); asked once per binary."""
    if binary not in _SUPPORTS:
        from flashinfer_sm120.safety import formats, proc

        res = proc.run([binary, "--version"], timeout=30, max_output=4096)  # bounded: time, output, leftovers
        try:  # "1.11.1", "1.13.2.git.kitware.jobserver-pipe-1"
            version = formats.parse_leading_version(res.text(), f"{binary} --version") if res.ok else None
        except formats.FormatError:
            version = None
        _SUPPORTS[binary] = version is not None and version.release[:2] >= (1, 13)
    return _SUPPORTS[binary]
