"""A point on the run's clock that a bounded phase must end by, and what its pieces cost.

Work that cannot be interrupted once started (one clip synthesised and scored, one test sentence) is
done piece by piece; before each, the phase asks whether one more piece, at the cautious cost of the
pieces so far (or a prior, e.g. the last evaluation's), still ends before the limit. So a phase can
overrun its limit by at most the error of one piece's estimate, never by the whole phase: a final
evaluation that runs 17 times slower than the one before (a cold process, a machine that got busy)
is cut short instead of pushing the run past its deadline.

The clock is the run's (finetune/training/budget.py Clock.now), so tests drive it by hand.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable


@dataclass
class TimeLimit:
    now: Callable[[], float]  # the run's clock, seconds
    ends_at: float  # on that clock; math.inf: no limit

    @classmethod
    def none(cls) -> "TimeLimit":
        return cls(now=time.monotonic, ends_at=math.inf)

    def left_s(self) -> float:
        return self.ends_at - self.now()

    def fits(self, seconds: float) -> bool:
        return seconds <= self.left_s()


@dataclass
class PieceCosts:
    """Seconds of each piece of a bounded phase: the slowest one seen so far is the estimate of the next
    (cautious: a clip's length varies); before any, `prior_s` (None: unknown, the first piece runs)."""

    prior_s: float | None = None
    seen: list[float] = field(default_factory=list)

    def add(self, seconds: float) -> None:
        self.seen.append(seconds)

    @property
    def estimate_s(self) -> float | None:
        return max(self.seen) if self.seen else self.prior_s

    def next_fits(self, limit: TimeLimit) -> bool:
        """Whether one more piece ends before the limit (always, when nothing is known yet and time is left)."""
        estimate = self.estimate_s
        return limit.fits(estimate) if estimate is not None else limit.left_s() > 0
