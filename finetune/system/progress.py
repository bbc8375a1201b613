"""Progress for long work: a tqdm bar on a terminal, plain labelled lines in logs and pipes.

A bar full of carriage returns is unreadable in a log file, so when stderr is not a terminal we print
one line every `interval_s` seconds instead: "prepare: 1200/42139 (2.8%) 35.1/s ETA 19m24s".
"""

from __future__ import annotations

import sys
import time

from tqdm import tqdm


def format_duration(seconds: float) -> str:
    """12345 -> '3h25m45s'; 75 -> '1m15s'; 4.2 -> '4s'."""
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m{secs:02d}s"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


class Progress:
    """Counts finished units of work; `update(n)` after each, `close()` at the end."""

    def __init__(self, label: str, total: int | None, unit: str = "it", interval_s: float = 10.0):
        self.label, self.total, self.unit, self.interval_s = label, total, unit, interval_s
        self.done = 0
        self.start = time.monotonic()
        self._last_line = self.start
        self._bar = tqdm(total=total, desc=label, unit=unit, dynamic_ncols=True) if sys.stderr.isatty() else None

    def update(self, n: int = 1) -> None:
        self.done += n
        if self._bar is not None:
            self._bar.update(n)
            return
        now = time.monotonic()
        if now - self._last_line >= self.interval_s:
            self._last_line = now
            print(self.line(now), file=sys.stderr, flush=True)

    def line(self, now: float | None = None) -> str:
        elapsed = (now or time.monotonic()) - self.start
        rate = self.done / elapsed if elapsed > 0 else 0.0
        if self.total:
            eta = (self.total - self.done) / rate if rate > 0 else float("inf")
            eta_text = format_duration(eta) if eta != float("inf") else "?"
            return (
                f"{self.label}: {self.done}/{self.total} ({100 * self.done / self.total:.1f}%) "
                f"{rate:.1f} {self.unit}/s ETA {eta_text}"
            )
        return f"{self.label}: {self.done} {self.unit} {rate:.1f} {self.unit}/s"

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        else:
            print(self.line(), file=sys.stderr, flush=True)
