"""What one evaluation found: each clip's scores (ClipScore), their summary over the clips (EvalResult, made by
`judge`: means, the typical length, eligibility by the timing rule) and how the log line says it. The Evaluator
that makes them (finetune/reporting/evaluation.py, whose docstring says what each figure is) and the choice of the
kept model (selection.py) read them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from finetune.reporting.measures import TimingRule

# A clip says nothing when nearly all its samples either stay where the one before was (within FLAT_STEP of
# full scale: silence, or one level held) or sit at full scale (|x| >= PINNED_LEVEL: a decoder pinned at its
# limits). Two scratch:small pretrainings collapsed so on a CPU (bench/RESULTS.md): one said -1.00 for every
# sample, the other the same +-1 pattern whatever the text. New weights' loud noise is at full scale 67-91% of
# the time and repeats its sample 7-65% of it; speech neither.
FLAT_STEP = 1e-4
PINNED_LEVEL = 0.999
SAYS_NOTHING_SHARE = 0.99


@dataclass
class ClipScore:
    mcd_db: float
    length_ratio: float  # frames of the median duration draw / recording frames, before any cap
    duration_error: float
    capped: bool  # the synthesis hit its ceiling (the model asked for more than was rendered)
    naturalness: float | None = None  # DNSMOS OVRL of the synthesised clip (None: the measure is off)
    length_draws: tuple[float, ...] = ()  # the length ratio of each duration draw (not written per clip)
    draw_spread: float = 1.0  # geometric standard deviation of those draws (1: all alike)
    says_nothing: bool = False  # the synthesised clip holds no speech: silence, one level, full scale (says_nothing())
    judged: dict = field(default_factory=dict)  # each judge's score of the clip (finetune/reporting/judges.py)
    # Across speakers with focus tokens: the focus frames' distance over the sentence's median frame
    # (measures.focus_over_sentence); None elsewhere, or where the clip has none of the tokens rendered.
    focus_relative: float | None = None


def says_nothing(waveform: np.ndarray) -> bool:
    """Whether a synthesised waveform (full scale 1) holds no speech: at least SAYS_NOTHING_SHARE of its samples
    within FLAT_STEP of the one before (silence, one level held), or at full scale (pinned at its limits)."""
    if len(waveform) < 2:
        return True
    held = float(np.mean(np.abs(np.diff(waveform)) < FLAT_STEP))
    pinned = float(np.mean(np.abs(waveform) >= PINNED_LEVEL))
    return max(held, pinned) >= SAYS_NOTHING_SHARE


def all_say_nothing(scores: dict[str, ClipScore]) -> bool:
    """Every clip scored (at least one) came out without speech: the voice says nothing."""
    return bool(scores) and all(score.says_nothing for score in scores.values())


@dataclass
class EvalResult:
    step: int
    mcd_db: float  # mean over held-out clips; lower is better
    per_clip: dict[str, ClipScore]
    val_losses: dict[str, float]
    seconds: float
    length_ratio: float = 1.0  # median length ratio over every duration draw of every clip: the typical single draw
    draw_spread: float = 1.0  # median over clips of each clip's geometric standard deviation between draws
    naturalness: float | None = None  # mean DNSMOS OVRL over clips (None: the measure is off)
    duration_error: float = 0.0  # mean over clips
    eligible: bool = True  # may become the best model (timing within the rule, a finite score)
    ineligible_reason: str = ""
    samples: list[str] = field(default_factory=list)  # WAV files written
    extra: dict[str, float] = field(default_factory=dict)  # further named scores (feedback rounds)
    chosen_as: str = ""  # why it became best_model, when it did (finetune/training/selection.py)
    clips_planned: int = 0  # held-out clips the evaluation was to score
    cut_short: str = ""  # why it stopped before the last clip or test sentence ("" when it did them all)
    sentences_planned: int = 0
    others: dict[str, dict] = field(default_factory=dict)  # other speakers of the crowd, reported beside it
    mcd_se_db: float = float("nan")  # standard error of the mean MCD over the clips scored: the measure's own noise
    choice_scores: dict[str, float] = field(
        default_factory=dict
    )  # each clip's MCD behind `mcd_db`, paired by the choice
    judged: dict[str, float] = field(default_factory=dict)  # each judge's mean over the clips (judges.py)
    voting: tuple = ()  # the judges among them that vote (judges.py Panel.voting)

    @property
    def clips_scored(self) -> int:
        return len(self.per_clip)

    @property
    def skipped(self) -> bool:
        """Not a single clip fitted in the time it had."""
        return not self.per_clip

    @property
    def says_nothing(self) -> bool:
        """Every clip scored came out without speech (says_nothing()): never kept as best_model."""
        return all_say_nothing(self.per_clip)

    def summary(self) -> dict:
        return {
            "step": self.step,
            "mcd_db": round(self.mcd_db, 4),
            **({"mcd_se_db": round(self.mcd_se_db, 4)} if np.isfinite(self.mcd_se_db) else {}),
            "length_ratio": round(self.length_ratio, 4),
            "draw_spread": round(self.draw_spread, 4),
            **({"naturalness": round(self.naturalness, 4)} if self.naturalness is not None else {}),
            **({"judges": {name: round(value, 4) for name, value in self.judged.items()}} if self.judged else {}),
            "duration_error": round(self.duration_error, 4),
            "eligible": self.eligible,
            **({"ineligible_reason": self.ineligible_reason} if not self.eligible else {}),
            **({"says_nothing": True} if self.says_nothing else {}),
            "clips_scored": self.clips_scored,
            "clips_planned": self.clips_planned,
            "sentences_written": len(self.samples),
            "sentences_planned": self.sentences_planned,
            **({"cut_short": self.cut_short} if self.cut_short else {}),
            "seconds": round(self.seconds, 2),
            **{f"val_{k}": round(v, 4) for k, v in self.val_losses.items()},
            **{k: round(v, 4) for k, v in self.extra.items()},
            **({"others": self.others} if self.others else {}),
        }

    def per_clip_dict(self) -> dict[str, dict]:
        def plain(value):
            if isinstance(value, float):
                return round(value, 4)
            return {k: round(v, 4) for k, v in value.items()} if isinstance(value, dict) else value

        return {
            name: {
                k: plain(v)
                for k, v in asdict(score).items()
                if k != "length_draws" and v is not None and not (k == "judged" and not v)
            }
            for name, score in self.per_clip.items()
        }

    def judged_clips(self, name: str) -> dict[str, float]:
        """Clip id -> judge `name`'s score of it (the clips it judged)."""
        return {item: score.judged[name] for item, score in self.per_clip.items() if name in score.judged}


def judge(
    step: int,
    scores: dict[str, ClipScore],
    val_losses: dict[str, float],
    seconds: float,
    rule: TimingRule | None,
    planned: int | None = None,
) -> EvalResult:
    """Per-clip scores -> one evaluation: means, the median length ratio of a single draw, and eligibility
    by the timing rule on the clips scored (fewer than the `planned` ones when cut short). `rule` None: the
    recordings are not at the voice's tempo (other people's), so the length is reported, not judged."""
    planned = len(scores) if planned is None else planned
    mcd = float(np.mean([s.mcd_db for s in scores.values()])) if scores else float("nan")
    ratio = typical_length_ratio(scores)
    error = float(np.mean([s.duration_error for s in scores.values()])) if scores else float("nan")
    natural = [s.naturalness for s in scores.values() if s.naturalness is not None]
    judged = {name for s in scores.values() for name in s.judged}
    judged_means = {
        name: float(np.mean([s.judged[name] for s in scores.values() if name in s.judged])) for name in judged
    }
    reason = ""
    if not np.isfinite(mcd):
        reason = "the synthesised speech is not finite"
    elif all_say_nothing(scores):
        reason = (
            f"the voice says nothing: all {len(scores)} clips came out held at one level or pinned at full scale (a "
            "collapsed generator; training on seldom brings it back: a lower --learning_rate, or the last checkpoint "
            "before it)"
        )
    elif rule is not None and not rule.accepts(ratio):
        digits = next((d for d in range(2, 7) if not rule.accepts(round(ratio, d))), 6)  # never "0.80 is outside 0.80-"
        reason = f"median length ratio {ratio:.{digits}f} is outside {rule.describe()}"
    return EvalResult(
        step=step,
        mcd_db=mcd,
        per_clip=scores,
        val_losses=val_losses,
        seconds=seconds,
        length_ratio=ratio,
        draw_spread=median_draw_spread(scores),
        duration_error=error,
        eligible=not reason,
        ineligible_reason=reason,
        naturalness=float(np.mean(natural)) if natural else None,
        clips_planned=planned,
        mcd_se_db=standard_error([s.mcd_db for s in scores.values()]),
        choice_scores={name: s.mcd_db for name, s in scores.items()},
        judged=dict(sorted(judged_means.items())),
    )


def mean_of(values: list) -> float | None:
    """The mean of the values that are not None (None when none is)."""
    present = [v for v in values if v is not None]
    return float(np.mean(present)) if present else None


def standard_error(values: list[float]) -> float:
    """Of their mean: sample standard deviation / sqrt(n); nan with fewer than 2 finite values (unknown)."""
    finite = np.array([v for v in values if np.isfinite(v)])
    return float(np.std(finite, ddof=1) / np.sqrt(len(finite))) if len(finite) >= 2 else float("nan")


def typical_length_ratio(scores: dict[str, ClipScore]) -> float:
    """The median length ratio of a single draw: over every draw of every clip (each clip's own ratio for
    a clip scored without draws); nan with no clip."""
    ratios = [r for s in scores.values() for r in (s.length_draws or (s.length_ratio,))]
    return float(np.median(ratios)) if ratios else float("nan")


def median_draw_spread(scores: dict[str, ClipScore]) -> float:
    """The voice's tempo variability: the median over clips of each clip's draw spread."""
    spreads = [s.draw_spread for s in scores.values() if s.length_draws]
    return float(np.median(spreads)) if spreads else 1.0


def describe_cut(result: EvalResult) -> str:
    """What a cut-short evaluation left out ("" for a whole one)."""
    if not result.cut_short:
        return ""
    return (
        f"; cut short by {result.cut_short}: {result.clips_scored} of {result.clips_planned} clips, "
        f"{len(result.samples)} of {result.sentences_planned} test sentences"
    )


def describe_judges(result: EvalResult) -> str:
    """`, judges: speaker 0.812*, phonetic 2.310` (a star: the judge votes; judges.py)."""
    if not result.judged:
        return ""
    return ", judges: " + ", ".join(
        f"{name} {value:.3f}{'*' if name in result.voting else ''}" for name, value in result.judged.items()
    )


def describe_timing(result: EvalResult) -> str:
    verdict = "" if result.eligible else f" (not eligible as best: {result.ineligible_reason})"
    spread = f" (x{result.draw_spread:.2f} a draw)" if result.draw_spread > 1.0 else ""
    return f"length x{result.length_ratio:.2f}{spread}, duration error {result.duration_error:.2f}{verdict}"
