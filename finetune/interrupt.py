"""Ctrl-C and SIGTERM ask the training loop to stop after the current optimizer step; it then saves a
checkpoint and exits. A second Ctrl-C stops at once (KeyboardInterrupt), for when saving hangs."""

from __future__ import annotations

import signal


class StopRequest:
    def __init__(self):
        self.signal_name: str | None = None
        self._previous: dict = {}

    @property
    def requested(self) -> bool:
        return self.signal_name is not None

    def request(self, name: str) -> None:
        self.signal_name = name

    def _handle(self, signum, frame) -> None:
        if self.signal_name is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signal_name = signal.Signals(signum).name

    def install(self) -> "StopRequest":
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
