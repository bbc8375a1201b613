"""The learning-rate curve, all of it: the rates one optimizer step runs at, from the plan the budget makes.

    warm-up          linear from 0 to the peak (--learning_rate) over --warmup_steps, cut to a tenth of a
                     short plan (warmup_steps)
    hold             the peak, while the cosine's share of the steps after the warm-up (--lr_decay_share)
                     has not begun
    cosine           from the peak down to peak x --lr_floor_ratio, reached at the plan's last step
    the last step    at the floor wherever it falls: the deadline may end a run before its plan did
    before a plan    the benchmark's steps run on the plan their timings foretell (pacing.Pacer.foretold_plan);
                     before the first step is timed, on --warmup_steps alone
    setbacks         every rate x the run's setback scale (state.Setbacks.lr_scale: lowered each time a NaN
                     storm sent the run back to its last good state)
    discriminator    the generator's rate x --discriminator_learning_rate / --learning_rate; in its own
                     warm-up (warmup.py) it trains alone at a constant rate, the generator at 0

A resumed run makes its plan again from the step it reached: the curve is a function of the step and the plan,
and nothing else about it is kept.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from finetune.training.budget import Plan

UNPLANNED = 10**9  # the length of the curve before anything is timed: its cosine has not begun


@dataclass(frozen=True)
class ScheduleSettings:
    learning_rate: float  # the generator's peak
    discriminator_learning_rate: float  # the discriminator's peak
    lr_floor_ratio: float  # the cosine's end, as a share of the peak
    lr_decay_share: float  # the cosine's share of the steps after the warm-up (the peak held before it)
    warmup_steps: int  # linear warm-up of the learning rate (cut to a tenth of a short plan)

    @property
    def discriminator_ratio(self) -> float:
        return self.discriminator_learning_rate / self.learning_rate


def warmup_steps(wanted: int, total_steps: int) -> int:
    """The warm-up a plan of `total_steps` runs: `wanted`, at most a tenth of the plan (at least one step)."""
    return min(wanted, max(1, total_steps // 10))


def curve(step: int, total_steps: int, warmup: int, peak: float, floor_ratio: float, decay_share: float = 1.0) -> float:
    """Linear warm-up from 0 to `peak` over steps 1..warmup, then a cosine from `peak` down to
    `peak * floor_ratio`, reached exactly at step `total_steps` (and held after it). The cosine spans the last
    `decay_share` of the steps after the warm-up; the rate holds at `peak` before it."""
    if warmup > 0 and step <= warmup:
        return peak * step / warmup
    floor = peak * floor_ratio
    span = max(1, round((total_steps - warmup) * decay_share))
    progress = min(1.0, max(0.0, (step - (total_steps - span)) / span))
    return floor + (peak - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def rates(
    schedule: ScheduleSettings, step: int, last: bool, plan: Plan | None, setback_scale: float = 1.0
) -> tuple[float, float]:
    """(generator, discriminator) learning rates of optimizer step `step` (counted from 1) on `plan` (the
    run's, or the one the benchmark's timings foretell; None before any is timed); `last`: the run's last
    step, at the floor."""
    total = step if last else (plan.total_steps if plan else UNPLANNED)
    warmup = plan.warmup_steps if plan else schedule.warmup_steps
    generator = setback_scale * curve(
        step,
        max(total, step),
        warmup,
        schedule.learning_rate,
        schedule.lr_floor_ratio,
        schedule.lr_decay_share,
    )
    return generator, generator * schedule.discriminator_ratio


def discriminator_warmup_rates(warmup_learning_rate: float, setback_scale: float = 1.0) -> tuple[float, float]:
    """(generator, discriminator) learning rates of a step of a new discriminator's warm-up: it learns alone."""
    return 0.0, warmup_learning_rate * setback_scale
