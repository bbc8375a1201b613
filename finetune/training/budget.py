"""The time budget: one clock from process start, and the plan that fits training into what is left.

Everything here is plain arithmetic on seconds and step counts, so it is tested alone with an injected
clock. The loop asks two questions of it, through the pacer (pacing.py): how many steps fit (make_plan), and
how long the next one will take (StepTimer, Durations). The learning-rate curve that spans the plan is
schedule.py's.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import asdict, dataclass
from typing import Callable

from finetune.training import schedule

EARLY = 5  # warm durations kept as what the work cost when the run began (Durations.early_s)


def seconds_since_process_start() -> float:
    """How long this run has existed: interpreter start-up and imports count against the budget. Under
    torchrun the run started when the launcher did (its own start-up, before the workers, counts too)."""
    import os

    import psutil

    process = psutil.Process()
    if "TORCHELASTIC_RUN_ID" in os.environ and process.parent() is not None:
        process = process.parent()
    return max(0.0, time.time() - process.create_time())


class Clock:
    """Monotonic seconds since the process started. Tests pass their own `now` (no sleeps)."""

    def __init__(self, now: Callable[[], float] | None = None):
        if now is None:
            origin = time.monotonic() - seconds_since_process_start()
            now = lambda: time.monotonic() - origin  # noqa: E731
        self.now = now


@dataclass
class Budget:
    """Seconds allowed for the whole run, of which `used_before_s` went to earlier (resumed) processes."""

    target_s: float
    clock: Clock
    used_before_s: float = 0.0
    safety_s: float = 2.0  # kept free at the end: interpreter exit, estimate error (safety_margin_s)

    def used_s(self) -> float:
        return self.used_before_s + self.clock.now()

    def left_s(self) -> float:
        return self.target_s - self.used_s()


def safety_margin_s(target_s: float) -> float:
    """Kept free at the end of a run: 0.3% of the budget, between 1 s and 60 s. It holds the interpreter's
    exit (0.4-0.7 s with torch loaded on a 2-core machine) and the error of the final save's estimates,
    which are each part's cost as last measured; more would leave the user's hours unused (2 s of a
    180 s budget is 1.1%)."""
    return min(60.0, max(1.0, 0.003 * target_s))


class Durations:
    """Recent durations of one kind of work, leaving the first `skip` out of the estimates once enough
    later ones exist (compilation, allocator warm-up and autotuning make the first ones slower)."""

    def __init__(self, skip: int = 2, window: int = 50, prior_s: float | None = None):
        self.skip, self.seen = skip, 0
        self.first: list[float] = []  # the first `skip`, kept to bound estimates until warm ones exist
        self.early: list[float] = []  # the first EARLY warm ones: what the work cost when the run began
        self.recent: deque[float] = deque(maxlen=window)
        self.prior_s = prior_s  # an estimate to use before any is timed (e.g. from a checkpoint)

    def add(self, seconds: float) -> None:
        self.seen += 1
        (self.first if self.seen <= self.skip else self.recent).append(seconds)
        if self.seen > self.skip and len(self.early) < EARLY:
            self.early.append(seconds)

    @property
    def ready(self) -> bool:
        return self.seen > 0 or self.prior_s is not None

    @property
    def mean_s(self) -> float:
        """For planning: the mean of the warm ones; before any, of the first ones (slower: safe)."""
        values = self.recent or self.first
        if values:
            return sum(values) / len(values)
        return self.prior_s if self.prior_s is not None else float("inf")

    @property
    def cautious_s(self) -> float:
        """For deciding whether more work fits: the 90th percentile of the warm ones once there are 10
        (lengths vary; the slowest of them would waste time at every deadline), before that the slowest
        seen, the first ones included; and never less than the median of the last three, so that a
        machine that suddenly got slower (another job started) is believed within two steps. Unluckier
        work than this is absorbed by the safety margin."""
        if len(self.recent) >= 10:
            ordered = sorted(self.recent)
            return max(ordered[int(0.9 * (len(ordered) - 1))], self.latest_s)
        values = list(self.recent) + self.first
        if values:
            return max(values)
        return self.prior_s if self.prior_s is not None else float("inf")

    @property
    def latest_s(self) -> float:
        """The median of the last three (robust to one unusually long batch)."""
        last = sorted(list(self.recent)[-3:])
        return last[len(last) // 2] if last else self.mean_s

    @property
    def lately_s(self) -> float:
        """The median of the last five: what it costs now, believed within three slower ones."""
        last = sorted(list(self.recent)[-5:])
        return last[len(last) // 2] if last else self.mean_s

    @property
    def early_s(self) -> float:
        """The median of the first EARLY warm ones (0.0 before any): what the work cost as the run began, when
        the costs timed before it (the baseline evaluation) were."""
        first = sorted(self.early)
        return first[len(first) // 2] if first else 0.0


class StepTimer:
    """What an optimizer step costs, in its two parts: each micro-batch (data, forward, backward) and the
    update (clipping, both optimizers). A step of an accumulation window of n micro-batches costs about
    n micro-batches and one update; the deadline decisions work a micro-batch at a time, and within the
    last one a clip at a time (`clips` a micro-batch, each about 1/clips of it), so that the last step of
    a run is cut short instead of leaving most of a step's time unused."""

    def __init__(
        self,
        accumulation: int,
        skip: int = 2,
        prior_micro_batch_s: float | None = None,
        prior_update_s: float | None = None,
        clips: int = 1,
    ):
        self.accumulation = accumulation
        self.clips = clips  # clips a whole micro-batch (1: it is never cut into clips)
        self.micro_batches = Durations(skip=skip, prior_s=prior_micro_batch_s)
        self.updates = Durations(skip=skip, prior_s=prior_update_s)

    @property
    def ready(self) -> bool:
        return self.micro_batches.ready

    def record(self, micro_batch_s: list[float], update_s: float | None) -> None:
        """A step's timings: each whole micro-batch (a cut one is not what a whole one costs), the update (None:
        the step made none)."""
        for seconds in micro_batch_s:
            self.micro_batches.add(seconds)
        if update_s is not None:
            self.updates.add(update_s)

    @property
    def micro_batch_s(self) -> float:
        """Cautious seconds of one more micro-batch (0 before any is timed: the first always runs)."""
        return self.micro_batches.cautious_s if self.micro_batches.ready else 0.0

    @property
    def update_s(self) -> float:
        return self.updates.cautious_s if self.updates.ready else 0.0

    @property
    def clip_s(self) -> float:
        """Cautious seconds of one clip of a micro-batch: the least a step's data can cost."""
        return self.micro_batch_s / max(1, self.clips)

    @property
    def step_s(self) -> float:
        """Mean seconds of a whole step (a full window and its update): what the plan counts in."""
        update = self.updates.mean_s if self.updates.ready else 0.0
        return self.accumulation * self.micro_batches.mean_s + update

    @property
    def cautious_step_s(self) -> float:
        return self.accumulation * self.micro_batch_s + self.update_s


@dataclass
class Plan:
    time_left_s: float  # when the plan was made
    step_s: float  # seconds per optimizer step
    eval_s: float  # seconds per evaluation (synthesis, scoring, saving the best model)
    checkpoint_s: float  # seconds per checkpoint
    final_s: float  # final evaluation + export + checkpoint, kept for the end
    steps_per_epoch: int
    steps_done: int
    total_steps: int  # optimizer steps in the whole run, done ones included
    eval_every: int  # optimizer steps between evaluations
    warmup_steps: int
    epochs: float  # total_steps / steps_per_epoch
    limited_by: str  # "time" or "max_epochs"
    # True: the interval was planned, evaluations count from steps_done and none falls within half an
    # interval of the end; False: --val_every's, every multiple of it from step 0 (a plan.json of an
    # earlier version too)
    evaluations_planned: bool = False

    def to_dict(self) -> dict:
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in asdict(self).items()}

    def evaluation_due(self, step: int) -> bool:
        """--val_every's: at each multiple. Planned: every `eval_every` steps from the plan's start, and not
        within half an interval of its end, where the final evaluation stands in for it (counted from step
        0, a run planned at step 25 for one evaluation at its end evaluated at step 42 of 48: 15 s, five
        steps' time, for six steps' difference)."""
        if not self.evaluations_planned:
            return step % self.eval_every == 0
        since, steps = step - self.steps_done, self.total_steps - self.steps_done
        return since > 0 and since % self.eval_every == 0 and since + self.eval_every / 2 <= steps

    @property
    def evaluations_before_final(self) -> int:
        if not self.evaluations_planned:
            return max(0, (self.total_steps - 1) // self.eval_every - self.steps_done // self.eval_every)
        return evaluations_before_end(self.total_steps - self.steps_done, self.eval_every)

    @property
    def evaluations_in_words(self) -> str:
        before = self.evaluations_before_final
        if before == 0:
            return "no evaluation before the final one"
        return f"an evaluation every {self.eval_every} steps ({before} before the final one)"


def evaluations_before_end(steps: int, eval_every: int) -> int:
    """The evaluations a planned interval brings in `steps` steps, the final one not counted (one due within
    half an interval of the end is left to it)."""
    return max(0, math.floor(steps / eval_every - 0.5))


def make_plan(
    time_left_s: float,
    step_s: float,
    eval_s: float,
    checkpoint_s: float,
    final_s: float,
    steps_per_epoch: int,
    steps_done: int,
    warmup_steps: int,
    safety_s: float,
    eval_every: int = 0,
    evals_wanted: int = 20,
    max_epochs: int = 0,
    checkpoint_every_s: float = 1800.0,
    evaluations_planned: bool = False,
    checkpoint_min_s: float = 0.0,
) -> Plan:
    """How many optimizer steps fit in `time_left_s`, with evaluations and checkpoints counted.

    With eval_every = 0 the evaluations are planned (`evaluations_planned`, Plan.evaluation_due): about
    `evals_wanted` of them, the final one included, spending at most 10% of the usable time on them, the
    final one counted. So a short run (a 225 s fine-tune whose evaluation costs 20 s) has none but the
    final: one more, steps before it, would buy nothing to keep and cost a tenth of the run's steps. A
    given eval_every is the user's (--val_every), unless `evaluations_planned` says it was planned before.
    Checkpoints come at each epoch end (at most one every `checkpoint_min_s`) and every `checkpoint_every_s`.
    The warm-up is cut to a tenth of a short plan (schedule.warmup_steps).
    """
    usable = max(0.0, time_left_s - final_s - safety_s)
    step_s = max(step_s, 1e-6)  # a clock too coarse to see a step must not divide by zero
    epoch_ends = (
        min(1.0 / steps_per_epoch, step_s / checkpoint_min_s) if checkpoint_min_s > 0 else 1.0 / steps_per_epoch
    )
    per_step = step_s + checkpoint_s * (epoch_ends + step_s / checkpoint_every_s)
    if eval_every <= 0:
        evaluations_planned = True
        fit = int(0.1 * usable / eval_s) if eval_s > 0 else evals_wanted
        before_final = max(0, min(evals_wanted, fit) - 1)
        steps = int(max(0.0, usable - before_final * eval_s) / per_step)
        eval_every = max(1, math.ceil(steps / (before_final + 1)))
    elif evaluations_planned:  # as many steps as fit with the evaluations they bring
        steps = int(usable / (per_step + eval_s / eval_every))  # too few: the last one is the final
        for _ in range(2):  # the evaluations of a longer plan, once more if it brought one more
            steps = int(max(0.0, usable - evaluations_before_end(steps, eval_every) * eval_s) / per_step)
    else:
        steps = int(usable / (per_step + eval_s / eval_every))
    limited_by = "time"
    if max_epochs > 0 and steps_done + steps >= max_epochs * steps_per_epoch:
        steps, limited_by = max(0, max_epochs * steps_per_epoch - steps_done), "max_epochs"
    total = steps_done + steps
    return Plan(
        time_left_s=time_left_s,
        step_s=step_s,
        eval_s=eval_s,
        checkpoint_s=checkpoint_s,
        final_s=final_s,
        steps_per_epoch=steps_per_epoch,
        steps_done=steps_done,
        total_steps=total,
        eval_every=eval_every,
        warmup_steps=schedule.warmup_steps(warmup_steps, total),
        epochs=total / steps_per_epoch,
        limited_by=limited_by,
        evaluations_planned=evaluations_planned,
    )
