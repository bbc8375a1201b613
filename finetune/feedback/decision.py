"""Whether a round's model is kept (decide): the held-out corrections better beyond the noise, the voice's own
clips no worse beyond theirs, its timing and identity held.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

from finetune.feedback.round_evaluator import (
    JUDGED_PARTS,
    Deciding,
    FeedbackEvaluator,
    clip_values,
    judge_keys,
    mean_focus_ratio,
    oriented,
)
from finetune.reporting.evaluation import EvalResult
from finetune.training.selection import MIN_PAIRED_CLIPS, NOISE_CONFIDENCE, Comparison, paired


def identity_change(baseline: EvalResult, result: EvalResult | dict, judge: str) -> Comparison | None:
    """How much further from its own recordings the voice's held-out clips are than at the start, by the speaker
    judge, paired clip by clip (a selection.Comparison whose advantage is how much nearer the start is: positive is
    further now); None when no speaker judge votes."""
    if not judge:
        return None
    per_clip = result["per_clip"] if isinstance(result, dict) else result.per_clip
    before = oriented(clip_values(baseline.per_clip, "originals", judge), True)
    after = oriented(clip_values(per_clip, "originals", judge), True)
    return paired(after, before)  # how much lower (better) the start is than the candidate


def identity_moved(baseline: EvalResult, result: EvalResult | dict, judge: str) -> str:
    """Why the voice no longer sounds like itself ("" when it does, or when no speaker judge votes): the speaker
    judge's similarity of its held-out clips to its recordings lower than at the start beyond that judge's noise."""
    return moved_reason(judge, identity_change(baseline, result, judge))


def moved_reason(judge: str, worse: Comparison | None) -> str:
    """identity_change's comparison as a reason to reject ("" when the voice did not move beyond the noise)."""
    if worse is None or not worse.beyond_noise:
        return ""
    return (
        f"the voice moved: the {judge} judge finds its held-out clips further from its own recordings than at the "
        f"start ({worse.describe().replace(' dB', '')})"
    )


@dataclass(frozen=True)
class NonInferiority:
    """Whether the voice's own clips got no worse than `margin` (their noise): the mean change (after - before,
    positive is worse) and its one-sided upper confidence bound, paired clip by clip."""

    change: float
    upper: float  # the mean change plus its one-sided Student t bound (nan when the noise cannot be known)
    margin: float
    clips: int
    cannot_tell: str = ""

    @property
    def holds(self) -> bool:
        return not self.cannot_tell and math.isfinite(self.margin) and self.upper <= self.margin

    def describe(self, unit: str = " dB") -> str:
        if self.cannot_tell:
            return f"{self.change:+.3f}{unit}; cannot tell: {self.cannot_tell}"
        return (
            f"{self.change:+.3f}{unit} (at most {self.upper:+.3f}{unit}) against their noise of {self.margin:.3f}{unit} "
            f"on {self.clips} clips"
        )


def non_inferiority(
    before: dict[str, float], after: dict[str, float], margin: float, confidence: float = NOISE_CONFIDENCE
) -> NonInferiority:
    """after - before on the clips both scored (lower is better), tested against `margin`: the voice is no worse
    when the upper one-sided bound of the mean change is at most the margin (a clip's own noise between two draws
    of the start: a change smaller than that is not one a listener could tell from drawing again)."""
    worse = paired(after, before, confidence)  # its advantage: how much lower `before` is, i.e. after - before
    if not math.isfinite(margin):
        return NonInferiority(worse.advantage_db, math.nan, margin, worse.clips, "the clips' noise was not measured")
    if worse.cannot_tell and worse.clips >= MIN_PAIRED_CLIPS and "do not vary" in worse.cannot_tell:
        # every clip changed alike (unchanged, where the round moved nothing the voice's clips say): known exactly
        return NonInferiority(worse.advantage_db, worse.advantage_db, margin, worse.clips)
    if worse.cannot_tell:
        return NonInferiority(worse.advantage_db, math.nan, margin, worse.clips, worse.cannot_tell)
    return NonInferiority(worse.advantage_db, worse.advantage_db + worse.bound_db, margin, worse.clips)


@dataclass
class Decision:
    accepted: bool
    reason: str
    before: dict  # the scores of the starting model (SCORES, and the learnt ones when there are)
    after: dict  # the same for the candidate: the best evaluation, else the last one
    candidate_step: int
    measure: str = ""  # what decided whether the corrections improved
    improvement: str = ""  # that comparison, in words (advantage, noise bound, clips)
    identity: str = ""  # the speaker judge's guard of the voice, in words, where it votes
    voice: str = ""  # the voice's own clips against their noise (non-inferiority), in words


SCORES = ("corrections_mcd_db", "originals_mcd_db")


def decide(
    baseline: EvalResult,
    best: dict | None,
    last: EvalResult,
    evaluator: FeedbackEvaluator,
    held_after: EvalResult | None = None,
    confidence: float = NOISE_CONFIDENCE,
) -> Decision:
    """Accept the round's model (its best evaluation by the corrections it trained on, else its last) when the
    voice says the held-out corrections, scored once on that model (`held_after`; too few to hold some out: the
    corrected sentences), better than the starting model beyond the noise, by what decides (FeedbackEvaluator:
    the phonetic judge where it votes, else the focus ratio on what the corrections correct, else MCD across
    speakers), paired clip by clip; its own held-out clips no worse than the start beyond their noise
    (non_inferiority), within the timing rule and, where the speaker judge votes, still its voice. Without a best model beyond the start, the last
    evaluation is the candidate, so the report always shows what the round produced."""
    deciding, measure = evaluator.deciding, evaluator.measure
    keep = (*SCORES, "held_out_mcd_db", "corrections_learnt_mcd_db")
    judges = {key for label in JUDGED_PARTS for key in judge_keys(baseline.extra, label).values()}
    before = {k: v for k, v in baseline.extra.items() if k in keep or k.endswith("_ratio") or k in judges}
    from_best = best is not None and best["step"] > 0  # the round's best_model: eligible, or the nearest (a fallback)
    source = best if from_best else last.extra
    after = {k: source[k] for k in before if k in source}
    after.update({k: v for k, v in source.items() if k.startswith("cut_short_")})  # reported parts cut short
    if held_after is not None:
        after["held_out_mcd_db"] = held_after.mcd_db
        ratio = mean_focus_ratio(held_after)
        if ratio is not None:
            after["held_out_focus_ratio"] = ratio
        after.update({f"held_out_{judge}": value for judge, value in held_after.judged.items()})
    if from_best:
        step, after_clips = int(best["step"]), dict(best["per_clip"])
        problem = best.get("ineligible_reason", "not eligible") if not best.get("eligible", True) else ""
    else:
        step, after_clips = last.step, dict(last.per_clip)
        problem = last.ineligible_reason if not last.eligible else ""
        if last.clips_scored < last.clips_planned and step > 0:  # means over fewer clips than the start's
            return Decision(
                False,
                f"the round's last evaluation was cut short by {last.cut_short} ({last.clips_scored} of "
                f"{last.clips_planned} clips scored), so it could not be compared with the start: give the round more "
                "time (--target_minutes)",
                before,
                after,
                step,
                measure,
                "not compared",
            )
    if held_after is not None:
        after_clips.update(held_after.per_clip)
    values = lambda clips: oriented(clip_values(clips, deciding.part, deciding.measure), deciding.higher_is_better)  # noqa: E731
    improvement = paired(values(baseline.per_clip), values(after_clips), confidence)
    voice = non_inferiority(
        clip_values(baseline.per_clip, "originals"),
        clip_values(after_clips, "originals"),
        baseline.extra.get("originals_noise_db", math.nan),
        confidence,
    )
    judge = evaluator.identity
    identity = identity_change(baseline, {"per_clip": after_clips}, judge)
    identity_text = (
        f"the {judge} judge on the voice's held-out clips, how much further from its recordings than at the start: "
        f"{identity.describe().replace(' dB', '')}"
        if identity is not None
        else ""
    )
    decision = partial(
        Decision,
        before=before,
        after=after,
        candidate_step=step,
        measure=measure,
        improvement=describe(improvement, deciding),
        identity=identity_text,
        voice=f"the voice's own held-out clips, MCD after - before: {voice.describe()}",
    )
    if not all(math.isfinite(after.get(k, math.nan)) and math.isfinite(before[k]) for k in SCORES):
        return decision(False, "a score is not a finite number (the model produced no usable speech)")
    if not voice.holds:
        why = voice.cannot_tell or f"worse than the start beyond their noise: {voice.describe()}"
        return decision(False, f"the voice moved: its own held-out clips are not shown to be as good ({why})")
    moved = moved_reason(judge, identity)  # the comparison above, not computed again
    if moved:
        return decision(False, moved)
    if problem:
        timing = [p for p in problem.split("; ") if "length ratio" in p]
        return decision(
            False, f"the voice's timing drifted ({'; '.join(timing)})" if timing else f"not eligible ({problem})"
        )
    what = "held-out corrections" if deciding.part == "held" else "corrections"
    if step == 0 or not improvement.beyond_noise:
        return decision(False, f"the {what} did not improve beyond the noise ({describe(improvement, deciding)})")
    return decision(
        True,
        f"the {what} improved beyond the noise ({describe(improvement, deciding)}), the voice's own held-out clips "
        "no worse beyond their noise" + (", still its voice by the speaker judge" if evaluator.identity else ""),
    )


def describe(comparison, deciding: Deciding) -> str:
    """The comparison in the measure's own unit (dB for MCD; the judge's otherwise)."""
    text = comparison.describe()
    return text if deciding.measure == "mcd" else text.replace(" dB", "")
