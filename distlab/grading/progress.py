"""What an instructor sees during a long grading run: notebooks done out of the total, the rate,
and an ETA from the measured rate. On a terminal a progress bar redrawn in place; in a log or a
Slurm output file a plain line about every ``every`` seconds (and at the end)."""
from __future__ import annotations

import sys
import time


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s" if m else f"{s}s"


class Progress:
    """``done(n)`` after each student's ``n`` notebooks. ``stream``: where to write (stderr by
    default); ``tty``: draw a bar (default: whether ``stream`` is a terminal); ``clock``: seconds
    (``time.monotonic``; a test passes its own)."""

    WIDTH = 30

    def __init__(self, total: int, stream=None, tty: bool | None = None, every: float = 60.0,
                 clock=time.monotonic):
        self.total, self.count, self.every, self.clock = total, 0, every, clock
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.start = self.last = clock()

    def status(self) -> str:
        """"12/140 notebooks, 3.1/min, ETA 41m18s" (no rate or ETA before the first is done)."""
        elapsed = self.clock() - self.start
        text = f"{self.count}/{self.total} notebooks"
        if self.count and elapsed > 0:
            rate = self.count / elapsed
            text += f", {rate * 60:.1f}/min"
            if self.count < self.total:
                text += f", ETA {_duration((self.total - self.count) / rate)}"
        return text + f", {_duration(elapsed)} elapsed"

    def done(self, n: int = 1) -> None:
        self.count += n
        now = self.clock()
        if self.tty:
            filled = int(self.WIDTH * self.count / max(self.total, 1))
            bar = "#" * filled + "-" * (self.WIDTH - filled)
            self.stream.write(f"\r[{bar}] {self.status()}\x1b[K")
            if self.count >= self.total:
                self.stream.write("\n")
        elif now - self.last >= self.every or self.count >= self.total:
            self.stream.write(f"progress: {self.status()}\n")
            self.last = now
        self.stream.flush()

    def clear(self) -> None:
        """Before printing another line on a terminal: start it on a fresh line."""
        if self.tty and 0 < self.count < self.total:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
