"""A feedback round's verdict: what it is judged on at each evaluation (FeedbackEvaluator), whether its model
is kept (decide), and the readable report (summary_text). The versions it makes: finetune/training/versions.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from finetune.reporting.evaluation import EvalResult, Evaluator, describe_cut
from finetune.reporting.selection import NOISE_CONFIDENCE, Comparison, paired


def change_pct(before: float, after: float) -> float:
    return 100.0 * (after - before) / before if before else 0.0


@dataclass(frozen=True)
class Deciding:
    """What decides a round: the clips of `part` ("held": corrections held out of its training; "said": the
    corrections it trained on, when too few came to hold some out) by `measure` ("mcd": MCD across speakers;
    else a voting judge of what is said, finetune/reporting/judges.py)."""

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
        if self.measure == "mcd":
            where = "the frames of the letters the corrections are about" if focus else "the corrected sentences"
            return (
                f"the voice's MCD on {where}, {clips}, compared as another speaker's recordings (normalised cepstra "
                "at the best frequency warp; their tempo not judged)"
            )
        return f"the {self.measure} judge (what is said, whoever says it) on {clips}"


PREFIX = {"said": "correction/", "held": "held/", "originals": "original/", "learnt": "learnt/"}
REPORTED = {"said": "the corrections it trained on", "learnt": "the corrections in their own voice"}


def clip_values(per_clip: dict, part: str, measure: str = "mcd") -> dict[str, float]:
    """Clip id -> one part's per-clip figure (ClipScores or their dicts): its MCD, or a judge's score."""
    values = {}
    for name, score in per_clip.items():
        if not name.startswith(PREFIX[part]):
            continue
        as_dict = score if isinstance(score, dict) else {"mcd_db": score.mcd_db, "judged": score.judged}
        value = as_dict["mcd_db"] if measure == "mcd" else as_dict.get("judged", {}).get(measure)
        if value is not None:
            values[name] = value
    return values


def oriented(values: dict[str, float], higher_is_better: bool) -> dict[str, float]:
    """Lower is better, as `paired` compares."""
    return {k: -v for k, v in values.items()} if higher_is_better else dict(values)


class FeedbackEvaluator:
    """Scores a round's model on what a correction is for, and on the voice it must not move:

        held       (when enough corrections came) the corrections held out of the round's training, the voice
                   speaking each against its recording: what decides. A round is for saying the corrected words
                   right everywhere, so it is judged on sentences it did not learn; judged by the phonetic judge
                   where one votes (what is said, whoever says it), else by MCD across speakers (below).
        said       the voice speaking each corrected sentence it trained on, against its recording. The
                   corrections of --corrections_voice own are other people's recordings, at their own tempo and
                   timbre: they are compared as another speaker's (MCD across speakers, finetune/reporting/
                   measures.py: normalised cepstra at the best frequency warp, which a voice sounding more like
                   the corrector does not improve), and their length is reported, never judged. Recordings that
                   are the voice's own (--corrections_voice voice) are compared plainly, timing included. What
                   decides when none could be held out; reported otherwise.
        learnt     (own ids only) the corrections' own speaker id speaking them, plain MCD and length: how
                   well they were learnt in their own voice and tempo; reported.
        originals  the voice on its own held-out clips: its MCD may rise at most `max_regression_pct` over
                   the starting model's, its length must pass the timing rule (the voice's tempo is the one
                   that is judged), and, where the speaker judge votes, it must not sound less like the voice
                   beyond that judge's noise.

    The first evaluation (step 0, the starting model) is the baseline. The round's best evaluation is the one
    that does best on what decides (beyond the noise: selection.py)."""

    # The round's verdict compares its parts' means (decide), so one cut short never takes part in the choice.
    compares_cut_short = False

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
            f"held-out corrections {x['held_out_mcd_db']:.3f} dB{judged(x, 'held_out')}; "
            if "held_out_mcd_db" in x
            else ""
        )
        reported_cut = "".join(
            f"; {REPORTED[k.removeprefix('cut_short_')]} cut short by the deadline ({v:.0f} clips unscored; reported only)"
            for k, v in x.items()
            if k.startswith("cut_short_")
        )
        return (
            f"{held}corrections as the voice says them {x['corrections_mcd_db']:.3f} dB{judged(x, 'corrections')}{learnt}; "
            f"held-out originals {x['originals_mcd_db']:.3f} dB{judged(x, 'originals')} ({x['originals_change_pct']:+.1f}%, "
            f"length x{x['originals_length_ratio']:.2f}){eligible}{describe_cut(result)}{reported_cut}"
        )

    def __init__(
        self,
        said: Evaluator,
        originals: Evaluator,
        max_regression_pct: float,
        learnt: Evaluator | None = None,
        held: Evaluator | None = None,
    ):
        self.said, self.originals, self.learnt, self.held = said, originals, learnt, held
        self.max_regression_pct = max_regression_pct
        self.rule = originals.rule  # the voice's timing, on its own clips
        self.baseline: EvalResult | None = None
        deciding = held or said
        panel = deciding.judges
        what = [n for n in (panel.voting if panel else []) if panel.judges[n].kind in ("phonetic", "asr")]
        self.deciding = Deciding(
            "held" if held else "said", what[0] if what else "mcd", panel.higher_is_better(what[0]) if what else False
        )
        voice = originals.judges
        self.identity = "speaker" if voice and "speaker" in voice.voting else ""  # the voice's identity judge

    @property
    def measure(self) -> str:
        """What decides, in words (the report says it)."""
        part = self.held or self.said
        return self.deciding.describe(focus=bool(part.across_speakers and part.focus_tokens))

    @property
    def example_mels(self):
        return self.said.example_mels

    def fit_tempo(self, model):
        """The voice's tempo is fitted on its own held-out clips, not on the corrections (other voices)."""
        return self.originals.fit_tempo(model)

    def parts(self) -> list[tuple[str, Evaluator]]:
        """What decides first (the held-out corrections, or the corrections when none are held out, then the
        voice's own clips), what is reported after: a deadline that cuts an evaluation short cuts the reports."""
        found = [("held", self.held), ("said", self.said), ("learnt", self.learnt), ("originals", self.originals)]
        found.sort(key=lambda item: item[0] not in self.decisive)
        return [(name, part) for name, part in found if part is not None]

    @property
    def decisive(self) -> tuple[str, ...]:
        """The parts the round's choice and verdict compare by their means: a partial one cannot take part."""
        return (self.deciding.part, "originals")

    def pay_once(self, stop=None) -> None:
        """What each part's first evaluation would pay once (finetune/reporting/evaluation.py), paid now."""
        for _, part in self.parts():
            part.pay_once(stop)

    def evaluate(self, model, step: int, stop=None, limit=None) -> EvalResult:
        """Each part inside one time limit, what decides first; cut short if a part that decides was."""
        scored = {name: part.evaluate(model, step, stop, limit) for name, part in self.parts()}
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
        for name, part in reported_cut.items():
            extra[f"cut_short_{name}"] = part.clips_planned - part.clips_scored  # clips it left unscored
        if "learnt" in scored:
            learnt = scored["learnt"]
            extra.update(corrections_learnt_mcd_db=learnt.mcd_db, corrections_learnt_length_ratio=learnt.length_ratio)
        baseline = self.baseline.extra["originals_mcd_db"] if self.baseline else originals.mcd_db
        extra["originals_change_pct"] = change_pct(baseline, originals.mcd_db)
        per_clip = {f"{PREFIX[name]}{k}": v for name, part in scored.items() for k, v in part.per_clip.items()}
        deciding = oriented(
            clip_values(per_clip, self.deciding.part, self.deciding.measure), self.deciding.higher_is_better
        )
        result = EvalResult(
            step=step,
            mcd_db=sum(deciding.values()) / len(deciding) if deciding else math.nan,  # what decides, lower is better
            per_clip=per_clip,
            val_losses=originals.val_losses,
            seconds=sum(part.seconds for part in scored.values()),
            length_ratio=originals.length_ratio,
            draw_spread=originals.draw_spread,
            duration_error=originals.duration_error,
            samples=said.samples,
            extra=extra,
            clips_planned=sum(
                part.clips_scored if name in reported_cut else part.clips_planned for name, part in scored.items()
            ),
            cut_short=next(
                (part.cut_short for name, part in scored.items() if part.cut_short and name in self.decisive), ""
            ),
            sentences_planned=said.sentences_planned,
            mcd_se_db=scored[self.deciding.part].mcd_se_db if self.deciding.measure == "mcd" else math.nan,
            choice_scores=deciding,
        )
        reasons = self.ineligible(scored, result)
        result.eligible, result.ineligible_reason = not reasons, "; ".join(reasons)
        if self.baseline is None:
            self.baseline = result
        return result

    def ineligible(self, scored: dict, result: EvalResult) -> list[str]:
        """Why this evaluation's model may not be the round's best: a part cut short (its mean is not comparable:
        the verdict compares means), a part outside its rule, the voice moved (its MCD past the tolerance, or
        further from its own recordings by the speaker judge, beyond its noise)."""
        reasons = []
        for name in self.decisive:
            part = scored.get(name)
            if part is None:
                continue
            label = {"held": "held-out corrections", "said": "corrections", "originals": "originals"}[name]
            if part.clips_scored < part.clips_planned:
                reasons.append(
                    f"{label}: cut short by the deadline after {part.clips_scored} of {part.clips_planned} clips "
                    "(a partial score is not compared)"
                )
            elif not part.eligible:
                reasons.append(f"{label}: {part.ineligible_reason}")
        if result.extra["originals_change_pct"] > self.max_regression_pct:
            reasons.append(
                f"originals {result.extra['originals_change_pct']:+.1f}%, past the {self.max_regression_pct}% tolerance"
            )
        moved = identity_moved(self.baseline, result, self.identity) if self.baseline is not None else ""
        if moved:
            reasons.append(moved)
        return reasons


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


SCORES = ("corrections_mcd_db", "originals_mcd_db")


def decide(
    baseline: EvalResult,
    best: dict | None,
    last: EvalResult,
    max_regression_pct: float,
    evaluator: FeedbackEvaluator | None = None,
    confidence: float = NOISE_CONFIDENCE,
) -> Decision:
    """Accept the round's best model when the voice says the held-out corrections (or, too few to hold out, the
    corrected sentences) better than the starting model beyond the noise, by what decides (FeedbackEvaluator:
    the phonetic judge where it votes, else MCD across speakers), paired clip by clip, its own held-out clips
    within the tolerance, the timing rule and, where the speaker judge votes, still its voice. Without a best
    model beyond the start, the last evaluation is the candidate, so the report always shows what the round
    produced."""
    deciding = evaluator.deciding if evaluator is not None else Deciding("said", "mcd")
    measure = evaluator.measure if evaluator is not None else "the corrections' MCD"
    keep = (*SCORES, "held_out_mcd_db", "corrections_learnt_mcd_db")
    judges = {key for label in JUDGED_PARTS for key in judge_keys(baseline.extra, label).values()}
    before = {k: v for k, v in baseline.extra.items() if k in keep or k.endswith("_ratio") or k in judges}
    from_best = best is not None and best["step"] > 0  # the round's best_model: eligible, or the nearest (a fallback)
    source = best if from_best else last.extra
    after = {k: source[k] for k in before if k in source}
    after.update({k: v for k, v in source.items() if k.startswith("cut_short_")})  # reported parts cut short
    if from_best:
        step, after_clips = int(best["step"]), best["per_clip"]
        problem = best.get("ineligible_reason", "not eligible") if not best.get("eligible", True) else ""
    else:
        step, after_clips = last.step, last.per_clip
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
    values = lambda clips: oriented(clip_values(clips, deciding.part, deciding.measure), deciding.higher_is_better)  # noqa: E731
    improvement = paired(values(baseline.per_clip), values(after_clips), confidence)
    judge = evaluator.identity if evaluator else ""
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
    )
    if not all(math.isfinite(after.get(k, math.nan)) and math.isfinite(before[k]) for k in SCORES):
        return decision(False, "a score is not a finite number (the model produced no usable speech)")
    regression = change_pct(before["originals_mcd_db"], after["originals_mcd_db"])
    if regression > max_regression_pct:
        return decision(
            False, f"the voice moved: its held-out clips got {regression:.1f}% worse (tolerance {max_regression_pct}%)"
        )
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
        "within tolerance"
        + (", still its voice by the speaker judge" if evaluator is not None and evaluator.identity else ""),
    )


def describe(comparison, deciding: Deciding) -> str:
    """The comparison in the measure's own unit (dB for MCD; the judge's otherwise)."""
    text = comparison.describe()
    return text if deciding.measure == "mcd" else text.replace(" dB", "")


def judged_change(decision: Decision, label: str) -> str:
    """`; judges: speaker 0.812 -> 0.809, phonetic 2.31 -> 1.95` for one part of the round's figures."""
    pairs = [
        f"{name} {decision.before[key]:.3f} -> {decision.after[key]:.3f}"
        for name, key in judge_keys(decision.before, label).items()
        if key in decision.after
    ]
    return f"; judges: {', '.join(pairs)}" if pairs else ""


def summary_text(
    round_name: str,
    decision: Decision,
    version: str | None,
    counts: dict,
    max_regression: float,
    listen_dir: Path,
    dropped: list[dict],
    undo_flags: str = "",
) -> str:
    """The readable report of a round; `undo_flags` are what the undo command needs besides --rollback
    (the versions folder when it is not the default)."""
    head = (
        f"Feedback {round_name}: "
        + (f"ACCEPTED as {version}" if decision.accepted else "REJECTED")
        + f" ({decision.reason})"
    )
    lines = [head, ""]

    def row(label: str, key: str, count: int, tolerance: str = "", part: str = "") -> str:
        before, after = decision.before[key], decision.after[key]
        unscored = int(decision.after.get(f"cut_short_{part}", 0))
        cut = f"; after: {count - unscored} of them, the deadline cut the rest" if unscored else ""
        return (
            f"{label} ({count} clips{cut}): MCD {before:.3f} -> {after:.3f} dB "
            f"({change_pct(before, after):+.1f}%{tolerance})"
        )

    if "held_out_mcd_db" in decision.before and "held_out_mcd_db" in decision.after:
        lines.append(
            row("Corrections held out of the training, as the voice says them", "held_out_mcd_db", counts["held_out"])
            + judged_change(decision, "held_out")
        )
    trained = counts["corrections"] - counts.get("held_out", 0)
    lines.append(
        row("Corrections it trained on, as the voice says them", "corrections_mcd_db", trained, part="said")
        + judged_change(decision, "corrections")
    )
    if "corrections_learnt_mcd_db" in decision.before and "corrections_learnt_mcd_db" in decision.after:
        lines.append(
            row(
                "Corrections, in their own speaker id (how well they were learnt)",
                "corrections_learnt_mcd_db",
                counts["corrections"],
                part="learnt",
            )
        )
    lines.append(
        row(
            "The voice's held-out originals", "originals_mcd_db", counts["originals"], f", tolerance +{max_regression}%"
        )
        + f"; length x{decision.after.get('originals_length_ratio', float('nan')):.2f} of the recordings"
        + judged_change(decision, "originals")
    )
    if decision.measure:
        lines.append(f"Decided by {decision.measure}: {decision.improvement}.")
    if decision.identity:
        lines.append(f"Identity checked by {decision.identity}.")
    lines.append(
        f"Candidate: the model at step {decision.candidate_step}. Trained on {trained} corrections "
        f"+ {counts['replay']} replayed original clips"
        + (f"; {counts['held_out']} corrections held out to decide on." if counts.get("held_out") else ".")
    )
    if dropped:
        lines.append(
            f"Corrections not used ({len(dropped)}): "
            + "; ".join(f"{d['id']}: {d['reason']} ({d['detail']})" for d in dropped[:10])
        )
    lines.append(f"Listen: {listen_dir}/ (for each correction: _0_recording, _1_before, _2_after)")
    if decision.accepted:
        lines.append(f"Undo: python train_feedback.py {undo_flags + ' ' if undo_flags else ''}--rollback previous")
    return "\n".join(lines) + "\n"
