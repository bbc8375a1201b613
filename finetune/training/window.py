"""Where an optimizer step draws its micro-batches, and the boundary to go back to mid-window.

The step (finetune/training/step.py, TrainStep.optimizer_step) draws each micro-batch of its window here:
before each after the first, every process of a data-parallel run learns whether a stop was asked for (one
collective), and on the CPU the torch threads follow the free cores. Where the window started is kept
(the sampler's position and every random state: the boundary) until the step returns, so that a stop or
an out-of-memory refit mid-window goes back to the last completed step exactly.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

from finetune.data.examples import Batch
from finetune.data.feed import MicroBatchFeed
from finetune.data.sampler import BucketSampler, SamplerState
from finetune.system.cpu_threads import CpuThreads
from finetune.system.interrupt import StopRequest, StopRequested
from finetune.system.profile import section
from finetune.training.budget import Clock
from finetune.training.checkpoint import capture_rng, restore_rng
from finetune.training.step import TrainStep


@dataclass
class Boundary:
    """The state after the last completed optimizer step, to go back to when a stop comes mid-window."""

    sampler: SamplerState
    rng: dict


class WindowRunner:
    """Optimizer steps over the feed's micro-batches (the step's MicroBatchSource), with the boundary."""

    def __init__(
        self,
        step: TrainStep,
        feed: MicroBatchFeed,
        sampler: BucketSampler,
        clock: Clock,
        stop: StopRequest,
        cpu_threads: CpuThreads | None = None,
    ):
        self.step, self.feed, self.sampler, self.clock, self.stop = step, feed, sampler, clock, stop
        self.cpu_threads = cpu_threads  # finetune/system/cpu_threads.py, on a CPU run
        self.boundary: Boundary | None = None  # set while a window runs
        self.last_start: Boundary | None = None  # where the last window started (a refit runs it again)

    @contextmanager
    def kept(self):
        """While one optimizer step runs (TrainStep.optimizer_step drawing from this source), where its window
        started is kept: a stop mid-window goes back to it (rewind), and a refit runs its clips again from it
        (run_again). A step that raises leaves it set, for the stop that follows."""
        self.boundary = Boundary(SamplerState(self.sampler.state.epoch, self.sampler.state.position), capture_rng())
        yield self
        self.last_start, self.boundary = self.boundary, None

    def draw(self, index: int) -> tuple[Batch, bool]:
        """Micro-batch `index` of the window under way, and whether it ended an epoch; before it (after the
        first: the loop asked before the step) a stop request, seen by any process, stops every one."""
        if self.step.dist.any(index > 1 and self.stop.requested):
            raise StopRequested(self.stop.signal_name or "SIGTERM")
        if self.cpu_threads is not None:
            self.cpu_threads.adjust()
        with section("data"):
            return self.feed.take()

    def now(self) -> float:
        return self.clock.now()

    def rewind(self) -> bool:
        """Back to the start of the window under way, if one is: the sampler's position and every random
        state as they were; the feed forgets what it fetched. False when no window was under way."""
        if self.boundary is None:
            return False
        self.go_to(self.boundary)
        return True

    def run_again(self) -> None:
        """Back to where the last window started, to run its clips again (after an out-of-memory refit)."""
        if self.last_start is not None:
            self.go_to(self.last_start)

    def go_to(self, boundary: Boundary) -> None:
        self.sampler.state = boundary.sampler
        restore_rng(boundary.rng)
        self.feed.restart()
        self.boundary = self.last_start = None
