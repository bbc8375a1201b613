"""Where a training step's time goes: waiting for data, the generator's forward pass, the alignment
search, the discriminator (its forward and backward on real and generated audio), the generator's loss
and backward (through the frozen discriminator), and the optimizer update.

Sections are marked where the work is done (`with section("alignment"):`); nested sections count
apart from their parent (alignment is inside the generator's forward and is not counted twice).
On the CPU each mark is a clock reading. On CUDA the work is asynchronous, so a mark is a CUDA event
recorded on the stream, read later, once the GPU has passed it (`Event.query()`): no device sync is
added to the step. `exact=True` (`--profile`) synchronises at every mark instead: exact host-side
times, slower steps. Data wait is host time either way.

Totals per phase over the run go to the final summary line, metrics.jsonl and TensorBoard.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import torch

PHASES = ("data", "generator_forward", "alignment", "discriminator", "generator_backward", "optimizer")

_ACTIVE: "StepProfile | None" = None


def section(phase: str):
    """Time the block as `phase` in the active profile (a no-op when none is active)."""
    return _ACTIVE.section(phase) if _ACTIVE is not None else contextlib.nullcontext()


@dataclass
class Mark:
    phase: str
    parent: int | None  # index of the enclosing mark in the step
    start: object = None  # float seconds, or a CUDA event
    end: object = None


@dataclass
class StepProfile:
    device: torch.device
    exact: bool = False
    totals: dict[str, float] = field(default_factory=lambda: {phase: 0.0 for phase in PHASES})
    steps: int = 0

    def __post_init__(self):
        self.marks: list[Mark] = []
        self.pending: list[list[Mark]] = []  # steps whose CUDA events are not all read yet
        self.stack: list[int] = []
        self.on_cuda = self.device.type == "cuda"

    # ------------------------------------------------------------ marking

    def _now(self, host: bool):
        if not self.on_cuda or host:
            return time.perf_counter()
        if self.exact:
            torch.cuda.synchronize(self.device)
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    @contextlib.contextmanager
    def section(self, phase: str):
        host = phase == "data"
        mark = Mark(phase, self.stack[-1] if self.stack else None, start=self._now(host))
        self.marks.append(mark)
        self.stack.append(len(self.marks) - 1)
        try:
            yield
        finally:
            self.stack.pop()
            mark.end = self._now(host)

    def activate(self) -> "StepProfile":
        global _ACTIVE
        _ACTIVE = self
        return self

    def deactivate(self) -> None:
        global _ACTIVE
        if _ACTIVE is self:
            _ACTIVE = None

    # ------------------------------------------------------------ reading

    def end_step(self) -> None:
        """Close the step's marks; read every step whose times are known by now."""
        if self.marks:
            self.pending.append(self.marks)
            self.steps += 1
        self.marks, self.stack = [], []
        while self.pending and self._ready(self.pending[0]):
            self._add(self.pending.pop(0))

    def flush(self) -> None:
        """Read everything still pending (waits for the GPU: call it at the end of a run)."""
        if self.on_cuda and self.pending:
            torch.cuda.synchronize(self.device)
        for marks in self.pending:
            self._add(marks)
        self.pending = []

    @staticmethod
    def _ready(marks: list[Mark]) -> bool:
        return all(not isinstance(m.end, torch.cuda.Event) or m.end.query() for m in marks)

    @staticmethod
    def _seconds(mark: Mark) -> float:
        if isinstance(mark.start, torch.cuda.Event) and isinstance(mark.end, torch.cuda.Event):
            return mark.start.elapsed_time(mark.end) / 1000.0
        if isinstance(mark.start, float) and isinstance(mark.end, float):
            return mark.end - mark.start
        return 0.0  # a section cut off by an exception

    def _add(self, marks: list[Mark]) -> None:
        seconds = [self._seconds(m) for m in marks]
        exclusive = list(seconds)
        for index, mark in enumerate(marks):
            if mark.parent is not None:
                exclusive[mark.parent] -= seconds[index]
        for mark, value in zip(marks, exclusive):
            self.totals[mark.phase] = self.totals.get(mark.phase, 0.0) + max(0.0, value)

    def shares(self) -> dict[str, float]:
        total = sum(self.totals.values())
        return {phase: (value / total if total else 0.0) for phase, value in self.totals.items()}

    def describe(self) -> str:
        return ", ".join(f"{phase.replace('_', ' ')} {100 * share:.1f}%" for phase, share in self.shares().items())
