"""Which evaluation's model becomes best_model. Pure functions of evaluations' figures, tested alone.

The rule, in order (docs/training.md, "Which model is kept"):
    1. an evaluation whose median length ratio passes the timing rule (and whose score is finite) beats
       every evaluation that does not;
    2. while none has passed: the one nearest to the timing rule wins (its timing error, the distance in
       log ratio from the rule's band, in steps of 0.01, about 1%: finer differences are below what
       the evaluation can measure). So a run always ends with a best_model, and one that never met the
       rule says so (the log, eval.json's "chosen_as", report.html);
    3. between two evaluations of the same standing (both within the rule, or both as near to it), the
       MCD decides only beyond the evaluations' own noise: the later model, which trained longer,
       replaces the kept one unless the kept one is better beyond that noise. So the model kept at the
       end is better, beyond the noise, than every model evaluated after it.
A model whose speech is not finite is never kept. And a model the MCD would let in is kept out when a judge
that votes (finetune/reporting/judges.py: validated by bench/bench_judges.py) finds the kept one better beyond
its own noise, clip by clip (judges_veto): a voice nearer its recordings' spectra that sounds less like the
speaker, or says the words worse, does not replace one that sounds right.

An evaluation cut short by the deadline (scored on fewer clips than planned; judge_cut_short) takes part
only where it can be compared clip by clip: eligible (within the timing rule, on the clips it scored), on
at least MIN_PAIRED_CLIPS clips that the kept model scored too (its mean over fewer clips is not comparable
with a whole one's; clip by clip it is). It replaces a kept model of the same standing only when better
beyond the noise on those clips (no tie goes to it), and a fallback by the timing rule, as a whole one
does. Before this, none took part, and a 450 s run whose one evaluation after the start was cut at 14 of
16 clips (2.5 dB nearer on them) ended with its start as the voice (bench/RESULTS.md).

Beyond the noise: both evaluations score the same held-out clips (same texts, same seeds), so they are
compared clip by clip: the difference of the two MCDs on each clip, whose mean must exceed its one-sided
Student t bound at NOISE_CONFIDENCE (the t quantile for n - 1 degrees of freedom times the standard error
of the mean difference). Two clips cannot decide anything that way (the bound is 6.3 standard errors);
sixteen can tell models about 1.7 standard errors apart. Where the noise cannot be known, nothing is
"beyond" it: with fewer than MIN_PAIRED_CLIPS clips in common (a state saved before clip scores were
kept, or too few held-out clips), or with differences that do not vary at all from clip to clip (a
spread of 0 would make any difference, +0.001 dB, count), the comparison says it cannot tell, and the
lower mean decides, said as no more than that (a tie goes to the later model).

Why not the lowest mean, as before: on 2 held-out clips a 180 s fine-tune kept step 100 over step 246 for
an MCD 0.1% lower, while a judgement on more sentences preferred step 246 (bench/RESULTS.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

TIMING_STEP = 0.01  # timing errors closer than this (in log ratio) count as equal: then MCD decides
NOISE_CONFIDENCE = 0.95  # one-sided: how sure "better beyond the noise" must be
MIN_PAIRED_CLIPS = 3  # fewer clips scored by both cannot estimate the noise (2 give a bound of 6.3 standard errors)
NO_SPREAD_DB = 1e-6  # clip-to-clip spread of the differences below this is none (scores are kept to 1e-4 dB)


@dataclass(frozen=True)
class Standing:
    """What the choice compares: whether the rule is met, how far it is missed, the score and each clip's."""

    eligible: bool  # passes the timing rule (and every other condition of the evaluator)
    timing_error: float  # distance of the median length ratio from the rule's band, |log| units; 0 inside
    score: float  # MCD dB, lower is better
    clips: dict = field(default_factory=dict, compare=False)  # clip id -> its MCD dB (the noise, paired)
    step: int = -1

    def rank(self) -> tuple[int, float]:
        """Timing first: within the rule, else how near to it (in TIMING_STEP steps)."""
        missed = 0.0 if self.eligible else self.timing_error
        if math.isfinite(missed):
            missed = round(missed / TIMING_STEP) * TIMING_STEP
        return (0 if self.eligible else 1, missed)

    def key(self) -> tuple[int, float, float]:
        return (*self.rank(), self.score)

    def to_dict(self) -> dict:
        return {"eligible": self.eligible, "timing_error": self.timing_error, "score": self.score}


NONE_YET = Standing(eligible=False, timing_error=math.inf, score=math.inf)  # before any model is kept


def timing_error(length_ratio: float, max_length_ratio: float) -> float:
    """How far a length ratio lies outside [1/max, max], in log units (0 inside; inf when not finite)."""
    if not (math.isfinite(length_ratio) and length_ratio > 0):
        return math.inf
    return max(0.0, abs(math.log(length_ratio)) - math.log(max_length_ratio))


def standing(
    eligible: bool,
    length_ratio: float,
    score: float,
    max_length_ratio: float,
    clips: dict | None = None,
    step: int = -1,
) -> Standing | None:
    """The standing of one evaluation; None when it may never be kept (a score that is not finite)."""
    if not math.isfinite(score):
        return None
    return Standing(
        eligible, 0.0 if eligible else timing_error(length_ratio, max_length_ratio), score, dict(clips or {}), step
    )


@dataclass(frozen=True)
class Comparison:
    """How much lower `a`'s MCD is than `b`'s, and the bound that difference must pass to count."""

    advantage_db: float  # mean over paired clips of b - a (or b's mean - a's), positive when a is lower
    bound_db: float  # the noise: one-sided t bound of that mean (nan when it cannot be known)
    clips: int  # clips paired
    cannot_tell: str = ""  # why the noise is unknown ("" when it is known)

    @property
    def beyond_noise(self) -> bool:
        return not self.cannot_tell and self.advantage_db > self.bound_db

    def describe(self) -> str:
        if self.cannot_tell:
            return f"{self.advantage_db:+.3f} dB; cannot tell: {self.cannot_tell}"
        return f"{self.advantage_db:+.3f} dB against a noise bound of {self.bound_db:.3f} dB on {self.clips} clips"


def paired(before: dict[str, float], after: dict[str, float], confidence: float = NOISE_CONFIDENCE) -> Comparison:
    """How much lower `after`'s per-clip MCDs are than `before`'s (clip id -> dB), on the clips both scored
    (finite), with the one-sided Student t bound of that mean difference; "cannot tell" with too few clips
    or differences that do not vary."""
    shared = [name for name in after if name in before and math.isfinite(after[name]) and math.isfinite(before[name])]
    differences = [before[name] - after[name] for name in shared]
    n = len(differences)
    mean = sum(differences) / n if n else (mean_of(before) - mean_of(after))
    if n < MIN_PAIRED_CLIPS:
        return Comparison(
            mean,
            math.nan,
            n,
            f"{n} clip{'s' if n != 1 else ''} in common, at least {MIN_PAIRED_CLIPS} are needed to know the noise",
        )
    sd = math.sqrt(sum((d - mean) ** 2 for d in differences) / (n - 1))
    if sd < NO_SPREAD_DB:
        return Comparison(mean, math.nan, n, f"the {n} clips' differences do not vary, so their noise is unknown")
    return Comparison(mean, t_quantile(confidence, n - 1) * sd / math.sqrt(n), n)


def mean_of(scores: dict[str, float]) -> float:
    finite = [v for v in scores.values() if math.isfinite(v)]
    return sum(finite) / len(finite) if finite else math.nan


def compare(a: Standing, b: Standing, confidence: float = NOISE_CONFIDENCE) -> Comparison:
    """`a` against `b` (a lower MCD is better), paired clip by clip where both scored the same clips."""
    comparison = paired(b.clips, a.clips, confidence)
    if not comparison.clips:  # nothing to pair: the means, said as such
        return Comparison(b.score - a.score, math.nan, 0, comparison.cannot_tell)
    return comparison


def t_quantile(confidence: float, degrees: int) -> float:
    from scipy.stats import t

    return float(t.ppf(confidence, degrees))


@dataclass(frozen=True)
class Verdict:
    replace: bool
    why: str  # for the log: what decided


def judge_candidate(candidate: Standing | None, kept: Standing, confidence: float = NOISE_CONFIDENCE) -> Verdict:
    """Whether `candidate` (the latest evaluation) should replace the kept model (NONE_YET before any)."""
    if candidate is None:
        return Verdict(False, "its score is not finite")
    if kept.score == math.inf:  # NONE_YET: nothing kept yet
        return Verdict(True, "the first model kept")
    if candidate.rank() != kept.rank():
        better_rank = candidate.rank() < kept.rank()
        return Verdict(better_rank, "nearer the timing rule" if better_rank else "further from the timing rule")
    against = compare(kept, candidate, confidence)
    if against.beyond_noise:
        return Verdict(False, f"step {kept.step} is better beyond the noise: {against.describe()}")
    against = compare(candidate, kept, confidence)
    if against.beyond_noise:
        return Verdict(True, f"better beyond the noise: {against.describe()}")
    if against.cannot_tell:  # the noise unknown: the lower mean, said as such (a tie to the longer-trained)
        lower = against.advantage_db >= 0
        return Verdict(
            lower,
            f"{'the lower' if lower else 'a higher'} mean, no more: {against.describe()} against step {kept.step}",
        )
    return Verdict(True, f"the longer-trained model, within the noise of step {kept.step}: {against.describe()}")


def judge_cut_short(candidate: Standing | None, kept: Standing, confidence: float = NOISE_CONFIDENCE) -> Verdict:
    """judge_candidate for an evaluation cut short by the deadline (fewer clips scored than planned). It must
    be eligible and share at least MIN_PAIRED_CLIPS clips with the kept model (have scored that many when
    none is kept yet). Then it wins by the timing rule as a whole one does (judged on its clips), and at the
    kept model's standing only when better beyond the noise on the clips in common: no tie goes to it, as the
    clips it did not score are unknown."""
    if candidate is None:
        return judge_candidate(candidate, kept, confidence)
    if not candidate.eligible:
        return Verdict(False, "cut short and not eligible: not compared")
    nothing_kept = kept.score == math.inf
    common = len(candidate.clips) if nothing_kept else sum(name in kept.clips for name in candidate.clips)
    if common < MIN_PAIRED_CLIPS:
        what = "clips scored" if nothing_kept else f"clips in common with step {kept.step}"
        return Verdict(
            False, f"cut short at {common} {what}: at least {MIN_PAIRED_CLIPS} are needed to compare it clip by clip"
        )
    verdict = judge_candidate(candidate, kept, confidence)
    if verdict.replace and not nothing_kept and candidate.rank() == kept.rank():
        against = compare(candidate, kept, confidence)
        if not against.beyond_noise:
            return Verdict(
                False, f"cut short, and not better beyond the noise than step {kept.step}: {against.describe()}"
            )
    return verdict


def judges_veto(
    kept: dict[str, dict[str, float]],
    candidate: dict[str, dict[str, float]],
    higher_is_better: dict[str, bool],
    kept_step: int,
    confidence: float = NOISE_CONFIDENCE,
) -> str:
    """Why the candidate may not replace the kept model although the MCD let it ("" when nothing says so): a
    voting judge (finetune/reporting/judges.py; name -> clip id -> score, for each model) that finds the kept
    model better beyond its noise, paired clip by clip on the clips both scored."""
    for name in sorted(kept):
        if name not in candidate:
            continue
        sign = -1.0 if higher_is_better.get(name, False) else 1.0  # lower is better, as `paired` compares
        worse = paired(
            {k: sign * v for k, v in candidate[name].items()}, {k: sign * v for k, v in kept[name].items()}, confidence
        )
        if worse.beyond_noise:
            return (
                f"the {name} judge finds step {kept_step} better beyond its noise "
                f"({worse.describe().replace(' dB', '')})"
            )
    return ""


def better(candidate: Standing | None, incumbent: Standing, confidence: float = NOISE_CONFIDENCE) -> bool:
    """Whether `candidate` should replace the kept model (see judge_candidate)."""
    return judge_candidate(candidate, incumbent, confidence).replace


def chosen_as(kept: Standing, length_ratio: float, reason: str) -> str:
    """One line for eval.json, the log and the report: why this model was kept (`reason`: why it is not
    eligible, when it is not)."""
    if kept.eligible:
        return (
            "within the timing rule, and no evaluation within it so far better beyond the noise (a tie goes "
            "to the model that trained longer)"
        )
    return (
        f"fallback: no evaluation so far was eligible ({reason}); this one, length x{length_ratio:.2f}, is the "
        "nearest to the timing rule (then the MCD, beyond the noise)"
    )
