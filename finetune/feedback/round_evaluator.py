"""What a feedback round is judged on at each evaluation (FeedbackEvaluator): the corrections, the voice's own
clips, each by the measure that decides (Deciding); the figures each part keeps per clip (clip_values).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from finetune.reporting.evaluation import EvalResult, Evaluator, describe_cut


def change_pct(before: float, after: float) -> float:
    return 100.0 * (after - before) / before if before else 0.0


@dataclass(frozen=True)
class Deciding:
    """What decides a round: the clips of `part` ("held": corrections held out of its training; "said": the
    corrections it trained on, when too few came to hold some out) by `measure` ("mcd": MCD across speakers;
    FOCUS_RATIO: where a round has focus tokens, the distance on their frames over the sentence's median frame;
    else a voting judge of what is said, finetune/reporting/content_judges.py)."""

    part: str
    measure: str
    higher_is_better: bool = False

    def describe(self, focus: bool = False) -> str:
        clips = (
            "the corrections held out of the round's training"
            if self.part == "held"
            else "the corrections it trained on (too few to hold some out: this says they were learnt, not that the "
            "fix carries)"
        )
        if self.measure == FOCUS_RATIO:
            return (
                f"how much further from the recording the voice is on the frames that say what the corrections "
                f"correct than on the rest of each sentence (their distance over the sentence's median frame; the "
                "recordings compared as another speaker's: normalised cepstra at the best frequency warp; the mean of "
                f"{DECIDING_DRAWS} draws a clip), on {clips}"
            )
        if self.measure == "mcd":
            where = "the frames that say what the corrections correct" if focus else "the corrected sentences"
            return (
                f"the voice's MCD on {where}, {clips}, compared as another speaker's recordings (normalised cepstra "
                "at the best frequency warp; their tempo not judged)"
            )
        return f"the {self.measure} judge (what is said, whoever says it) on {clips}"


FOCUS_RATIO = "focus_ratio"  # the measure: measures.focus_over_sentence, each clip's ClipScore.focus_relative
DECIDING_DRAWS = 4  # synthesis draws a clip of the part that decides is scored on (Evaluator.synthesis_draws)

PREFIX = {"said": "correction/", "held": "held/", "originals": "original/", "learnt": "learnt/"}
REPORTED = {"said": "the corrections it trained on", "learnt": "the corrections in their own voice"}


def clip_values(per_clip: dict, part: str, measure: str = "mcd") -> dict[str, float]:
    """Clip id -> one part's per-clip figure (ClipScores or their dicts): its MCD, its FOCUS_RATIO, or a judge's
    score."""
    values = {}
    for name, score in per_clip.items():
        if not name.startswith(PREFIX[part]):
            continue
        as_dict = (
            score
            if isinstance(score, dict)
            else {"mcd_db": score.mcd_db, "judged": score.judged, "focus_relative": score.focus_relative}
        )
        if measure == "mcd":
            value = as_dict["mcd_db"]
        elif measure == FOCUS_RATIO:
            value = as_dict.get("focus_relative")
        else:
            value = as_dict.get("judged", {}).get(measure)
        if value is not None:
            values[name] = value
    return values


def oriented(values: dict[str, float], higher_is_better: bool) -> dict[str, float]:
    """Lower is better, as `paired` compares."""
    return {k: -v for k, v in values.items()} if higher_is_better else dict(values)


class FeedbackEvaluator:
    """Scores a round's model on what a correction is for, and on the voice it must not move:

        said       the corrections it trained on, the voice speaking each against its recording: what chooses the
                   round's model (the held-out corrections never do). The corrections of --corrections_voice own
                   are other people's recordings, at their own tempo and timbre: they are compared as another
                   speaker's (MCD across speakers, finetune/reporting/measures.py: normalised cepstra at the best
                   frequency warp, which a voice sounding more like the corrector does not improve), by the focus
                   ratio where the round knows what it corrects (finetune/feedback/focus.py: those tokens' frames
                   over the sentence's median frame; their MCD reported), or by the phonetic judge where one votes
                   (what is said, whoever says it); their length is reported, never judged. Recordings that
                   are the voice's own (--corrections_voice voice) are compared plainly, timing included.
        held       (when enough corrections came) the corrections held out of the round's training, by the same
                   measure, each clip on DECIDING_DRAWS draws: scored on the starting model (the baseline), and
                   once on the round's model after its training (judge_held): what decides. A round is for saying
                   the corrected words right everywhere, so it is judged on sentences it did not learn, and once: a
                   model chosen on them would be the best of many looks, tested on the clips that chose it.
        learnt     (own ids only) the corrections' own speaker id speaking them, plain MCD and length: how
                   well they were learnt in their own voice and tempo; reported.
        originals  the voice on its own held-out clips, its tempo by the timing rule (a model outside it is never
                   the round's choice); the baseline scores them a second time, at another draw (`retest`), so that
                   the decision knows their noise: the round's model must be no worse than the start beyond it
                   (finetune/feedback/decision.py), and, where the speaker judge votes, still sound like the voice.

    The first evaluation (step 0, the starting model) is the baseline."""

    # The round's choice compares the trained corrections' means, so one cut short never takes part in it.
    compares_cut_short = False
    judges = None  # its parts hold their judges; no judge vetoes the round's choice of model (decide judges it)

    def describe(self, result: EvalResult) -> str:
        x = result.extra
        eligible = "" if result.eligible else f"; not eligible: {result.ineligible_reason}"
        learnt = (
            f", in their own voice {x['corrections_learnt_mcd_db']:.3f} dB (length "
            f"x{x['corrections_learnt_length_ratio']:.2f})"
            if "corrections_learnt_mcd_db" in x
            else ""
        )
        held = (
            f"held-out corrections {x['held_out_mcd_db']:.3f} dB{ratio_of(x, 'held_out')}{judged(x, 'held_out')}; "
            if "held_out_mcd_db" in x
            else ""
        )
        noise = f", noise {x['originals_noise_db']:.3f} dB a clip" if "originals_noise_db" in x else ""
        reported_cut = "".join(
            f"; {REPORTED[k.removeprefix('cut_short_')]} cut short by the deadline ({v:.0f} clips unscored; reported only)"
            for k, v in x.items()
            if k.startswith("cut_short_")
        )
        return (
            f"{held}corrections as the voice says them {x['corrections_mcd_db']:.3f} dB{ratio_of(x, 'corrections')}"
            f"{judged(x, 'corrections')}{learnt}; "
            f"held-out originals {x['originals_mcd_db']:.3f} dB{judged(x, 'originals')} ({x['originals_change_pct']:+.1f}%"
            f"{noise}, length x{x['originals_length_ratio']:.2f}){eligible}{describe_cut(result)}{reported_cut}"
        )

    def __init__(
        self,
        said: Evaluator,
        originals: Evaluator,
        learnt: Evaluator | None = None,
        held: Evaluator | None = None,
        retest: Evaluator | None = None,
    ):
        self.said, self.originals, self.learnt, self.held, self.retest = said, originals, learnt, held, retest
        self.rule = originals.rule  # the voice's timing, on its own clips
        self.baseline: EvalResult | None = None
        panel = said.judges
        what = [n for n in (panel.voting if panel else []) if panel.judges[n].kind in ("phonetic", "asr")]
        deciding = held or said
        if what:
            self.deciding = Deciding("held" if held else "said", what[0], panel.higher_is_better(what[0]))
        else:
            on_focus = deciding.across_speakers and bool(deciding.focus)
            self.deciding = Deciding("held" if held else "said", FOCUS_RATIO if on_focus else "mcd")
        self.choosing = Deciding("said", self.deciding.measure, self.deciding.higher_is_better)
        voice = originals.judges
        self.identity = "speaker" if voice and "speaker" in voice.voting else ""  # the voice's identity judge

    @property
    def choice_in_db(self) -> bool:
        """Whether what chooses the round's model is an MCD (else the focus ratio or a judge's score: no unit)."""
        return self.choosing.measure == "mcd"

    @property
    def measure(self) -> str:
        """What decides, in words (the report says it)."""
        part = self.held or self.said
        return self.deciding.describe(focus=bool(part.across_speakers and part.focus))

    @property
    def example_mels(self):
        return self.said.example_mels

    def fit_tempo(self, model):
        """The voice's tempo is fitted on its own held-out clips, not on the corrections (other voices)."""
        return self.originals.fit_tempo(model)

    def parts(self, baseline: bool = False) -> list[tuple[str, Evaluator]]:
        """What chooses first (the corrections it trained on, then the voice's own clips), what is reported
        after: a deadline that cuts an evaluation short cuts the reports. The held-out corrections and the
        retest only in the baseline."""
        found = [("said", self.said), ("originals", self.originals), ("learnt", self.learnt)]
        if baseline:
            found = [("held", self.held), *found, ("retest", self.retest)]
        return [(name, part) for name, part in found if part is not None]

    @property
    def decisive(self) -> tuple[str, ...]:
        """The parts the round's choice compares by their means: a partial one cannot take part."""
        return ("held", "said", "originals", "retest") if self.baseline is None else ("said", "originals")

    def measure_costs_now(self, model, limit) -> None:
        """Nothing: a round is never resumed, so it always starts with its baseline evaluation, timed."""

    def expected_s(self) -> float:
        return sum(part.expected_s() for _, part in self.parts())

    def cost_estimates(self) -> tuple[float, float, int]:
        """None kept in a checkpoint: a round writes none (its parts keep their own estimates)."""
        return 0.0, 0.0, 0

    def restore_cost_estimates(self, group_s: float, sentence_s: float, batch_size: int) -> None:
        """Nothing to restore: a round is never resumed."""

    def pay_one_time_costs(self, stop=None) -> None:
        """What each part's first evaluation would pay once (finetune/reporting/evaluation.py), paid now."""
        for _, part in self.parts(baseline=True):
            part.pay_one_time_costs(stop)

    def evaluate(self, model, step: int, stop=None, limit=None) -> EvalResult:
        """Each part inside one time limit, what chooses first; cut short if a part that chooses was."""
        first = self.baseline is None
        scored = {name: part.evaluate(model, step, stop, limit) for name, part in self.parts(baseline=first)}
        said, originals = scored["said"], scored["originals"]
        # A reported part cut short is said (in `extra` and the eval line) but leaves the evaluation whole: what
        # it planned is what it scored.
        reported_cut = {n: p for n, p in scored.items() if n not in self.decisive and p.clips_scored < p.clips_planned}
        extra = {
            "corrections_mcd_db": said.mcd_db,
            "corrections_length_ratio": said.length_ratio,
            "originals_mcd_db": originals.mcd_db,
            "originals_length_ratio": originals.length_ratio,
        }
        for name, label in (("held", "held_out"), ("said", "corrections"), ("originals", "originals")):
            if name in scored:
                extra.update({f"{label}_{judge}": value for judge, value in scored[name].judged.items()})
        if "held" in scored:
            extra["held_out_mcd_db"] = scored["held"].mcd_db
        for name, label in (("held", "held_out"), ("said", "corrections")):
            ratio = mean_focus_ratio(scored[name]) if name in scored else None
            if ratio is not None:
                extra[f"{label}_focus_ratio"] = ratio
        if "retest" in scored:
            extra["originals_noise_db"] = retest_noise(
                {k: v.mcd_db for k, v in originals.per_clip.items()},
                {k: v.mcd_db for k, v in scored["retest"].per_clip.items()},
            )
        for name, part in reported_cut.items():
            extra[f"cut_short_{name}"] = part.clips_planned - part.clips_scored  # clips it left unscored
        if "learnt" in scored:
            learnt = scored["learnt"]
            extra.update(corrections_learnt_mcd_db=learnt.mcd_db, corrections_learnt_length_ratio=learnt.length_ratio)
        baseline = self.baseline.extra["originals_mcd_db"] if self.baseline else originals.mcd_db
        extra["originals_change_pct"] = change_pct(baseline, originals.mcd_db)
        per_clip = {
            f"{PREFIX[name]}{k}": v
            for name, part in scored.items()
            if name != "retest"
            for k, v in part.per_clip.items()
        }
        choosing = oriented(
            clip_values(per_clip, self.choosing.part, self.choosing.measure), self.choosing.higher_is_better
        )
        result = EvalResult(
            step=step,
            mcd_db=sum(choosing.values()) / len(choosing) if choosing else math.nan,  # what chooses, lower is better
            per_clip=per_clip,
            val_losses=originals.val_losses,
            seconds=sum(part.seconds for part in scored.values()),
            length_ratio=originals.length_ratio,
            draw_spread=originals.draw_spread,
            duration_error=originals.duration_error,
            samples=said.samples,
            extra=extra,
            clips_planned=sum(
                part.clips_scored if name in reported_cut else part.clips_planned
                for name, part in scored.items()
                if name != "retest"
            ),
            cut_short=next(
                (part.cut_short for name, part in scored.items() if part.cut_short and name in self.decisive), ""
            ),
            sentences_planned=said.sentences_planned,
            mcd_se_db=said.mcd_se_db if self.choosing.measure == "mcd" else math.nan,
            choice_scores=choosing,
        )
        reasons = self.ineligible(scored)
        result.eligible, result.ineligible_reason = not reasons, "; ".join(reasons)
        if self.baseline is None:
            self.baseline = result
        return result

    def judge_held(self, model, stop=None, limit=None, speaker: int | None = None) -> EvalResult | None:
        """The held-out corrections, once, on the round's model (`speaker`: the voice's id in `model`, None for
        the exported single-voice folder); None when none were held out."""
        if self.held is None:
            return None
        kept = self.held.speaker
        self.held.speaker = speaker
        try:
            result = self.held.evaluate(model, -1, stop, limit)
        finally:
            self.held.speaker = kept
        result.per_clip = {f"{PREFIX['held']}{k}": v for k, v in result.per_clip.items()}
        return result

    def ineligible(self, scored: dict) -> list[str]:
        """Why this evaluation's model may not be the round's choice: a part that chooses cut short (its mean is
        not comparable), the voice outside the timing rule. Whether it moved the voice is the decision's, once."""
        reasons = []
        for name in self.decisive:
            part = scored.get(name)
            if part is None:
                continue
            label = {
                "held": "held-out corrections",
                "said": "corrections",
                "originals": "originals",
                "retest": "retest",
            }
            if part.clips_scored < part.clips_planned:
                reasons.append(
                    f"{label[name]}: cut short by the deadline after {part.clips_scored} of {part.clips_planned} clips "
                    "(a partial score is not compared)"
                )
            elif not part.eligible:
                reasons.append(f"{label[name]}: {part.ineligible_reason}")
        return reasons


def retest_noise(first: dict[str, float], second: dict[str, float]) -> float:
    """A clip's own noise in the voice's score (clip -> score, two draws of the same model): the standard
    deviation of one clip's score between the draws, from their differences (sd of the difference / sqrt 2); nan
    with fewer than two clips scored by both."""
    values = [first[k] - second[k] for k in first if k in second]
    values = [v for v in values if math.isfinite(v)]
    if len(values) < 2:
        return math.nan
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1) / 2)


JUDGED_PARTS = ("held_out", "corrections", "originals")  # the labels of the parts judges score in `extra`


def judge_keys(figures: dict, label: str) -> dict[str, str]:
    """Judge name -> its key among one part's figures of a round (`{label}_{judge}`; the MCDs, ratios and
    changes beside them are not judges')."""
    return {
        k[len(label) + 1 :]: k
        for k in figures
        if k.startswith(f"{label}_") and not k.endswith(("_db", "_ratio", "_pct"))
    }


def judged(extra: dict, label: str) -> str:
    return "".join(f", {name} {extra[key]:.3f}" for name, key in judge_keys(extra, label).items())


def mean_focus_ratio(result: EvalResult) -> float | None:
    """The mean FOCUS_RATIO over the clips of an evaluation that have one (None when none has)."""
    values = [score.focus_relative for score in result.per_clip.values() if score.focus_relative is not None]
    return sum(values) / len(values) if values else None


def ratio_of(extra: dict, label: str) -> str:
    key = f"{label}_focus_ratio"
    return f" (focus x{extra[key]:.3f} the rest)" if key in extra else ""
