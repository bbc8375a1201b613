"""Where an optimizer step draws its micro-batches, and the boundary to go back to mid-window.

The step (finetune/training/step.py, TrainStep.optimizer_step) draws each micro-batch of its window here:
before each after the first, every process of a data-parallel run learns whether a stop was asked for (one
collective), and on the CPU the torch threads follow the free cores; one drawn near the deadline is watched
while it runs (late_check, finetune/training/late.py). Where the window started is kept
(the sampler's position and every random state: the boundary) until the step returns, so that a stop or
an out-of-memory refit mid-window goes back to the last completed step exactly.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable

from finetune.data.examples import Batch
from finetune.data.feed import MicroBatchFeed
from finetune.data.sampler import BucketSampler, SamplerState
from finetune.system.cpu_threads import LOOK_BEFORE_S, CpuThreads
from finetune.system.interrupt import StopRequest, StopRequested
from finetune.system.profile import section
from finetune.training.budget import Clock
from finetune.training.checkpoint_file import capture_rng, restore_rng
from finetune.training.late import AT_RISK, WATCHED_S
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
        one_more_fits: Callable[[float], bool] | None = None,
        must_end_in_s: Callable[[float], float] | None = None,
        usual_s: Callable[[], float] | None = None,
    ):
        self.step, self.feed, self.sampler, self.clock, self.stop = step, feed, sampler, clock, stop
        self.cpu_threads = cpu_threads  # finetune/system/cpu_threads.py, on a CPU run
        # The pacer's one_more_fits (finetune/training/pacing.py): whether a micro-batch as long as the last one
        # and the update still leave the final save
        self.one_more_fits = one_more_fits
        # The pacer's must_end_in_s, and what a micro-batch usually costs (its timer's cautious estimate, 0 before
        # one is timed): a micro-batch drawn near the deadline is watched while it runs (late_check)
        self.must_end_in_s, self.usual_s = must_end_in_s, usual_s
        self.last_s = 0.0  # what the last micro-batch of this window took (0: none has run yet)
        self.boundary: Boundary | None = None  # set while a window runs
        self.last_start: Boundary | None = None  # where the last window started (a refit runs it again)
        self.drawn_at = 0.0  # when the micro-batch under way was drawn

    @contextmanager
    def kept(self):
        """While one optimizer step runs (TrainStep.optimizer_step drawing from this source), where its window
        started is kept: a stop mid-window goes back to it (rewind), and a refit runs its clips again from it
        (run_again). A step that raises leaves it set, for the stop that follows."""
        self.boundary = Boundary(SamplerState(self.sampler.state.epoch, self.sampler.state.position), capture_rng())
        yield self
        self.last_start, self.boundary = self.boundary, None

    def draw(self, index: int) -> tuple[Batch | None, bool]:
        """Micro-batch `index` of the window under way, and whether it ended an epoch; before it (after the
        first: the loop asked before the step) a stop request, seen by any process, stops every one, and the
        deadline is asked again (None: the window ends here, jointly; see in_time)."""
        now = self.clock.now()
        self.last_s = now - self.drawn_at if index > 1 else 0.0
        late = index > 1 and not self.in_time(self.last_s)
        stop, late = self.step.dist.any_of(index > 1 and self.stop.requested, late)
        if stop:
            raise StopRequested(self.stop.signal_name or "SIGTERM")
        if late:
            return None, False
        self.drawn_at = now
        if self.cpu_threads is not None:
            self.cpu_threads.adjust()
        with section("data"):
            return self.feed.take()

    def match_threads(self) -> None:
        """Before an evaluation, which runs on the threads it starts with: a CPU run's thread count set from a
        look at the cores now (finetune/system/cpu_threads.py)."""
        if self.cpu_threads is not None:
            self.cpu_threads.adjust(LOOK_BEFORE_S)

    def in_time(self, last_s: float) -> bool:
        """Whether one more micro-batch fits at the speed the last one ran (`last_s`): the window was decided at
        what micro-batches cost before it began, and a machine that got three times slower during a window of four
        17 s micro-batches ran 96 s past a 180 s budget."""
        return self.one_more_fits is None or self.one_more_fits(last_s)

    def late_check(self) -> Callable[[], bool] | None:
        """For the micro-batch just drawn, when it could end too late even AT_RISK times slower than micro-batches
        have run, or starts within WATCHED_S of the time the final save needs: what says, while it runs, that the time the final save needs has come (the step then gives it
        up: finetune/training/late.py). None where it is not at risk, where nothing is timed yet (the first
        micro-batch always runs) and in a data-parallel run (its processes must run the same micro-batches)."""
        if self.must_end_in_s is None or self.usual_s is None or self.step.dist.active:
            return None
        expected_s = max(self.last_s, self.usual_s())
        end_in_s = self.must_end_in_s(expected_s)
        if expected_s <= 0 or end_in_s > max(AT_RISK * expected_s, WATCHED_S):
            return None
        end_at = self.clock.now() + end_in_s
        return lambda: self.clock.now() > end_at

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
