"""One optimizer step's window of micro-batches, for the discriminator's warm-up and for training alike.

A window takes its micro-batches one at a time from the feed, deciding before each (with every process
of a data-parallel run) whether a stop was asked for and whether this micro-batch must be the window's
last (the deadline leaves no room for another: finetune/training/pacing.py). Each is timed into the
pacer's timer. Where the window started is kept (the sampler's position and every random state: the
boundary) until its update is applied, so that a stop or an out-of-memory refit mid-window goes back to
the last completed step exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

from finetune.data.feed import MicroBatchFeed
from finetune.data.sampler import BucketSampler, SamplerState
from finetune.system.interrupt import StopRequest, StopRequested
from finetune.system.profile import section
from finetune.training.checkpoint import capture_rng, restore_rng
from finetune.training.pacing import Pacer
from finetune.training.step import StepResult, TrainStep, Window


@dataclass
class Boundary:
    """The state after the last completed optimizer step, to go back to when a stop comes mid-window."""

    sampler: SamplerState
    rng: dict


@dataclass
class Accumulated:
    window: Window
    epoch_ended: bool  # its last micro-batch ended an epoch
    cut_to: int = 0  # its last micro-batch was cut to this many clips to end on time (0: not cut)


@dataclass
class StepOutcome:
    result: StepResult
    epoch_ended: bool
    last: bool  # the run's last step
    first_update: bool  # the optimizers had no state before it (their state is made at the first update)


class MicroBatches:
    """The micro-batches of one window as (batch, whether it is the window's last), for
    TrainStep.accumulate_window; `epoch_ended` says afterwards whether the last one ended an epoch, and
    `cut_to` whether it was cut to fewer clips at the deadline (each process cuts its own to what its
    clock leaves; whether a micro-batch is the last is decided jointly)."""

    def __init__(self, runner: "WindowRunner", pacer: Pacer):
        self.runner, self.pacer, self.epoch_ended, self.cut_to = runner, pacer, False, 0

    def __iter__(self):
        runner, clock, index = self.runner, self.runner.clock, 0
        while True:
            index += 1
            keep = self.pacer.clips_that_fit()
            stop, last = runner.step.dist.any_of(
                index > 1 and runner.stop.requested, self.pacer.micro_batch_is_last(index)
            )
            if stop:
                raise StopRequested(runner.stop.signal_name or "SIGTERM")
            if runner.cpu_threads is not None:
                runner.cpu_threads.adjust()
            started = clock.now()
            with section("data"):
                batch, self.epoch_ended = runner.feed.take()
            if keep < min(len(batch), self.pacer.timer.clips):  # what the deadline leaves time for; the rest unseen
                batch, self.cut_to = batch.first(keep), keep
            yield batch, last or self.epoch_ended
            if not self.cut_to:  # a cut micro-batch is not what a whole one costs
                self.pacer.timer.micro_batches.add(clock.now() - started)
            if last or self.epoch_ended:
                return


class WindowRunner:
    """Windows of micro-batches through the optimizer step, with the boundary to go back to."""

    def __init__(
        self, step: TrainStep, feed: MicroBatchFeed, sampler: BucketSampler, clock, stop: StopRequest, cpu_threads=None
    ):
        self.step, self.feed, self.sampler, self.clock, self.stop = step, feed, sampler, clock, stop
        self.cpu_threads = cpu_threads  # finetune/system/cpu_threads.py, on a CPU run
        self.boundary: Boundary | None = None  # set while a window runs

    def mark_boundary(self) -> None:
        self.boundary = Boundary(SamplerState(self.sampler.state.epoch, self.sampler.state.position), capture_rng())

    def rewind(self) -> bool:
        """Back to the start of the window under way, if one is: the sampler's position and every random
        state as they were; the feed forgets what it fetched. False when no window was under way."""
        if self.boundary is None:
            return False
        self.sampler.state = self.boundary.sampler
        restore_rng(self.boundary.rng)
        self.feed.restart()
        self.boundary = None
        return True

    def accumulate(self, pacer: Pacer, generator: bool = True) -> Accumulated:
        """Forward and backward over a window (generator False: the discriminator's alone)."""
        self.mark_boundary()
        micro_batches = MicroBatches(self, pacer)
        whole = pacer.timer.clips if pacer.timer.clips > 1 else 0  # 0: a whole micro-batch is the first one's size
        window = self.step.accumulate_window(micro_batches, pacer.timer.accumulation, generator, whole)
        return Accumulated(window, micro_batches.epoch_ended, micro_batches.cut_to)

    def update(self, accumulated: Accumulated, pacer: Pacer, last: bool = False) -> StepOutcome:
        """The window's update (at the learning rates already set), timed into the pacer's timer; the
        boundary moves here."""
        first_update = not (
            self.step.optimizer_g.state if accumulated.window.generator else self.step.optimizer_d.state
        )
        started = self.clock.now()
        result = self.step.apply(accumulated.window)
        pacer.timer.updates.add(self.clock.now() - started)
        self.boundary = None
        return StepOutcome(result, accumulated.epoch_ended, last, first_update)
