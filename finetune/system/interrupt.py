"""Ctrl-C and SIGTERM: stop within seconds, keeping the state after the last completed optimizer step.

The first signal only records the request. Long work polls it at safe points (`check()` raises
StopRequested): between clips while loading, between groups of clips in an evaluation, between the
micro-batches of an accumulation window, between steps. The training loop then puts back the sampler
position and random state of the last completed step, writes a checkpoint and exits (130 for SIGINT,
143 for SIGTERM). Nothing polls inside an optimizer update or a save, so neither is left half done.

A second signal exits at once (same status), for when saving hangs or the user means it: whatever
write was under way is abandoned, and writes are atomic (finetune/system/atomic.py), so the last good files stay.
"""

from __future__ import annotations

import contextlib
import os
import signal

EXIT_STATUS = {"SIGINT": 130, "SIGTERM": 143}


class StopRequested(Exception):
    """Raised at a safe point after Ctrl-C or SIGTERM; carries the signal's name."""

    def __init__(self, signal_name: str):
        self.signal_name = signal_name
        super().__init__(f"stop requested ({signal_name})")


class StopRequest:
    def __init__(self):
        self.signal_name: str | None = None
        self._previous: dict = {}
        self._depth = 0

    @property
    def requested(self) -> bool:
        return self.signal_name is not None

    @property
    def exit_status(self) -> int:
        return EXIT_STATUS.get(self.signal_name or "", 130)

    def request(self, name: str) -> None:
        self.signal_name = name

    def check(self) -> None:
        """Raise StopRequested if a stop was asked for: call it where stopping leaves nothing half done."""
        if self.signal_name is not None:
            raise StopRequested(self.signal_name)

    def _handle(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.signal_name is not None:
            os.write(2, f"\n{name} again: exiting now, without saving\n".encode())
            os._exit(EXIT_STATUS.get(name, 130))
        self.signal_name = name
        os.write(2, f"\n{name}: stopping at the next safe point (send it again to exit at once)\n".encode())

    def install(self) -> "StopRequest":
        """Handle SIGINT and SIGTERM (nested installs are counted; the outermost restore puts the previous
        handlers back)."""
        self._depth += 1
        if self._depth == 1:
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def restore(self) -> None:
        self._depth -= 1
        if self._depth == 0:
            for sig, handler in self._previous.items():
                signal.signal(sig, handler)
            self._previous.clear()

    @contextlib.contextmanager
    def installed(self):
        self.install()
        try:
            yield self
        finally:
            self.restore()
