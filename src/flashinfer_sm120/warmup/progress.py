"""The build pool's progress display: one line per finished or failed step, and a status
line (rewritten on a terminal, a heartbeat every 30 s otherwise)."""

from __future__ import annotations

import time

__all__ = ["Display"]


class Display:
    """Event lines (one per finished or failed step) and a status line: a rewritten
    line on a terminal, a heartbeat line every 30 s otherwise."""

    def __init__(self, stream, total: int) -> None:
        self.stream, self.total, self.done = stream, total, 0
        self.tty = hasattr(stream, "isatty") and stream.isatty()
        self.t0 = time.monotonic()
        self.last_beat = self.t0
        self.status = ""

    def event(self, text: str) -> None:
        prefix = "\r\x1b[K" if self.tty else ""
        self.stream.write(f"{prefix}[{self.done}/{self.total}] {text}  ({time.monotonic() - self.t0:.0f} s)\n")
        self._status_line()

    def now(self, compiling: list[str]) -> None:
        self.status = ("compiling now: " + ", ".join(compiling)) if compiling else "waiting"
        if self.tty:
            self._status_line()
        elif time.monotonic() - self.last_beat >= 30:
            self.last_beat = time.monotonic()
            self.stream.write(f"[{self.done}/{self.total}] {self.status}  "
                              f"({time.monotonic() - self.t0:.0f} s)\n")
            self.stream.flush()

    def _status_line(self) -> None:
        if self.tty and self.status:
            self.stream.write(f"\r\x1b[K[{self.done}/{self.total}] {self.status}"
                              f"  ({time.monotonic() - self.t0:.0f} s)")
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
