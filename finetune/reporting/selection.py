"""Which evaluation's model becomes best_model. Pure functions of an evaluation's figures, tested alone.

The rule, in order (README "Which model is kept"):
    1. an evaluation whose median length ratio passes the timing rule (and whose score is finite) beats
       every evaluation that does not;
    2. among those that pass: the lower MCD wins;
    3. while none has passed: the one nearest to the timing rule wins (its timing error, the distance in
       log ratio from the rule's band, in steps of 0.01, about 1%: finer differences are below what
       the evaluation can measure), then the lower MCD. So a run always ends with a best_model, and
       one that never met the rule says so (the log, eval.json's "chosen_as", report.html).
A model whose speech is not finite is never kept.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

TIMING_STEP = 0.01  # timing errors closer than this (in log ratio) count as equal: then MCD decides


@dataclass(frozen=True)
class Standing:
    """What the choice compares: whether the rule is met, how far it is missed, the score."""

    eligible: bool  # passes the timing rule (and every other condition of the evaluator)
    timing_error: float  # distance of the median length ratio from the rule's band, |log| units; 0 inside
    score: float  # MCD dB, lower is better

    def key(self) -> tuple[int, float, float]:
        missed = 0.0 if self.eligible else self.timing_error
        if math.isfinite(missed):
            missed = round(missed / TIMING_STEP) * TIMING_STEP
        return (0 if self.eligible else 1, missed, self.score)

    def to_dict(self) -> dict:
        return {"eligible": self.eligible, "timing_error": self.timing_error, "score": self.score}


NONE_YET = Standing(eligible=False, timing_error=math.inf, score=math.inf)  # before any model is kept


def timing_error(length_ratio: float, max_length_ratio: float) -> float:
    """How far a length ratio lies outside [1/max, max], in log units (0 inside; inf when not finite)."""
    if not (math.isfinite(length_ratio) and length_ratio > 0):
        return math.inf
    return max(0.0, abs(math.log(length_ratio)) - math.log(max_length_ratio))


def standing(eligible: bool, length_ratio: float, score: float, max_length_ratio: float) -> Standing | None:
    """The standing of one evaluation; None when it may never be kept (a score that is not finite)."""
    if not math.isfinite(score):
        return None
    return Standing(eligible, 0.0 if eligible else timing_error(length_ratio, max_length_ratio), score)


def better(candidate: Standing | None, incumbent: Standing) -> bool:
    """Whether `candidate` should replace the kept model (NONE_YET before any)."""
    return candidate is not None and candidate.key() < incumbent.key()


def chosen_as(kept: Standing, length_ratio: float, reason: str) -> str:
    """One line for eval.json, the log and the report: why this model was kept (`reason`: why it is not
    eligible, when it is not)."""
    if kept.eligible:
        return "the lowest MCD among the evaluations within the timing rule"
    return (f"fallback: no evaluation so far was eligible ({reason}); this one, length x{length_ratio:.2f}, is the "
            "nearest to the timing rule (then the lowest MCD)")
