"""A progress bar on stderr: redrawn in place on a terminal, a line every 10 % otherwise."""

from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, total: int, label: str, unit_bytes: int = 0, stream=None, width: int = 30):
        self.total = max(1, total)
        self.label = label
        self.unit_bytes = unit_bytes
        self.stream = stream or sys.stderr
        self.width = width
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.t0 = time.monotonic()
        self._last_draw = 0.0
        self._last_decile = -1

    def line(self, done: int) -> str:
        frac = min(1.0, done / self.total)
        fill = int(frac * self.width)
        dt = max(1e-9, time.monotonic() - self.t0)
        rate = ""
        if self.unit_bytes:
            rate = f" {done * self.unit_bytes / dt / (1 << 20):7.1f} MiB/s"
        eta = (self.total - done) * dt / done if done else 0.0
        return f"{self.label} [{'#' * fill}{'.' * (self.width - fill)}] {done}/{self.total} {frac * 100:5.1f}%{rate} eta {eta:5.1f}s"

    def update(self, done: int) -> None:
        now = time.monotonic()
        if self.tty:
            if done >= self.total or now - self._last_draw >= 0.1:
                self._last_draw = now
                self.stream.write("\r" + self.line(done))
                self.stream.flush()
        else:
            decile = int(10 * done / self.total)
            if decile != self._last_decile:
                self._last_decile = decile
                self.stream.write(self.line(done) + "\n")
                self.stream.flush()

    def finish(self, done: int) -> None:
        if self.tty:
            self.stream.write("\r" + self.line(done) + "\n")
            self.stream.flush()
        elif int(10 * done / self.total) != self._last_decile:
            self.stream.write(self.line(done) + "\n")
            self.stream.flush()
