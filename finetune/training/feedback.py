"""Feedback rounds: learn from corrected recordings without forgetting, keep only what helps, in versions.

A round trains on the corrections mixed with a replay sample of the original corpus, scores both the
corrections and held-out original clips, and keeps the result only when the corrections got better and
the originals got no worse than a tolerance. Accepted rounds become numbered versions:

    VOICES/current/          the voice in use: the default starting model of the next round
    VOICES/v000/             the model the first round started from (copied once)
    VOICES/v001/, v002/ ...  one per accepted round
    VOICES/history.json      every round (accepted or not) and every rollback, with scores
    VOICES/rounds/round_NNN/ a round's run folder: checkpoints, logs, listen/, feedback_report.*

Rolling back copies a version into current/ file by file, so current/ is then byte for byte that version.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from finetune.data.corrections import FeedbackError
from finetune.reporting.evaluation import EvalResult, Evaluator, describe_cut
from finetune.reporting.selection import NOISE_CONFIDENCE, paired
from finetune.system.atomic import recover, replace_dir, staging_dir, write_text_atomic

HISTORY = "history.json"


def listing(folder: Path) -> list[tuple[str, int, int]]:
    """(relative path, size, modification time) of every file: copies made with copytree keep the last two."""
    if not folder.is_dir():
        return []
    return sorted(
        (p.relative_to(folder).as_posix(), p.stat().st_size, p.stat().st_mtime_ns)
        for p in folder.rglob("*")
        if p.is_file()
    )


def change_pct(before: float, after: float) -> float:
    return 100.0 * (after - before) / before if before else 0.0


class FeedbackEvaluator:
    """Scores a round's model on what a correction is for, and on the voice it must not move:

        said       the voice speaking each corrected sentence, against its recording. The corrections of
                   --corrections_voice own are other people's recordings, at their own tempo and timbre:
                   they are compared as another speaker's (MCD across speakers, finetune/reporting/measures.py:
                   normalised cepstra at the best frequency warp, which a voice sounding more like the
                   corrector does not improve), and their length is reported, never judged. Recordings that
                   are the voice's own (--corrections_voice voice) are compared plainly, timing included.
                   The round's best model is the one that says them best (beyond the noise: selection.py).
        learnt     (own ids only) the corrections' own speaker id speaking them, plain MCD and length: how
                   well they were learnt in their own voice and tempo; reported.
        originals  the voice on its own held-out clips: its MCD may rise at most `max_regression_pct` over
                   the starting model's, and its length must pass the timing rule (the voice's tempo is the
                   one that is judged).

    The first evaluation (step 0, the starting model) is the baseline."""

    # The round's verdict compares its parts' means (decide), so one cut short never takes part in the choice.
    compares_cut_short = False

    @staticmethod
    def describe(result: EvalResult) -> str:
        x = result.extra
        eligible = "" if result.eligible else f"; not eligible: {result.ineligible_reason}"
        learnt = (
            f", in their own voice {x['corrections_learnt_mcd_db']:.3f} dB (length "
            f"x{x['corrections_learnt_length_ratio']:.2f})"
            if "corrections_learnt_mcd_db" in x
            else ""
        )
        return (
            f"corrections as the voice says them {x['corrections_mcd_db']:.3f} dB{learnt}; held-out originals "
            f"{x['originals_mcd_db']:.3f} dB ({x['originals_change_pct']:+.1f}%, length "
            f"x{x['originals_length_ratio']:.2f}){eligible}{describe_cut(result)}"
        )

    def __init__(
        self, said: Evaluator, originals: Evaluator, max_regression_pct: float, learnt: Evaluator | None = None
    ):
        self.said, self.originals, self.learnt, self.max_regression_pct = said, originals, learnt, max_regression_pct
        self.rule = originals.rule  # the voice's timing, on its own clips
        self.baseline: EvalResult | None = None

    @property
    def measure(self) -> str:
        """What decides, in words (the report says it)."""
        if self.said.across_speakers and self.said.focus_tokens:
            return (
                "the voice's MCD on the frames of the letters the corrections are about, compared as another "
                "speaker's recordings (normalised cepstra at the best frequency warp; their tempo not judged)"
            )
        return (
            "the voice's MCD on the corrected sentences, compared as another speaker's recordings (normalised "
            "cepstra at the best frequency warp; their tempo not judged)"
            if self.said.across_speakers
            else "the voice's MCD on the corrected sentences (its own recordings)"
        )

    @property
    def example_mels(self):
        return self.said.example_mels

    def fit_tempo(self, model):
        """The voice's tempo is fitted on its own held-out clips, not on the corrections (other voices)."""
        return self.originals.fit_tempo(model)

    def pay_once(self, stop=None) -> None:
        """What each part's first evaluation would pay once (finetune/reporting/evaluation.py), paid now."""
        for part in (self.said, self.learnt, self.originals):
            if part is not None:
                part.pay_once(stop)

    def evaluate(self, model, step: int, stop=None, limit=None) -> EvalResult:
        """Said, (learnt), then originals, inside one time limit; cut short if any was."""
        said = self.said.evaluate(model, step, stop, limit)
        learnt = self.learnt.evaluate(model, step, stop, limit) if self.learnt is not None else None
        originals = self.originals.evaluate(model, step, stop, limit)
        parts = [("corrections", said), ("originals", originals), *([("learnt", learnt)] if learnt else [])]
        extra = {
            "corrections_mcd_db": said.mcd_db,
            "corrections_length_ratio": said.length_ratio,
            "originals_mcd_db": originals.mcd_db,
            "originals_length_ratio": originals.length_ratio,
        }
        if learnt is not None:
            extra.update(corrections_learnt_mcd_db=learnt.mcd_db, corrections_learnt_length_ratio=learnt.length_ratio)
        baseline = self.baseline.extra["originals_mcd_db"] if self.baseline else originals.mcd_db
        extra["originals_change_pct"] = change_pct(baseline, originals.mcd_db)
        # A round's verdict compares its parts' means (the originals' change against the start's), so a part
        # cut short is never eligible here, unlike in a plain run's choice (clip by clip: selection.py).
        reasons = []
        for name, part in parts[:2]:
            if part.clips_scored < part.clips_planned:
                reasons.append(
                    f"{name}: cut short by the deadline after {part.clips_scored} of {part.clips_planned} clips "
                    "(a partial score is not compared)"
                )
            elif not part.eligible:
                reasons.append(f"{name}: {part.ineligible_reason}")
        if extra["originals_change_pct"] > self.max_regression_pct:
            reasons.append(
                f"originals {extra['originals_change_pct']:+.1f}%, past the {self.max_regression_pct}% tolerance"
            )
        per_clip = {
            **{f"correction/{k}": v for k, v in said.per_clip.items()},
            **{f"original/{k}": v for k, v in originals.per_clip.items()},
            **({f"learnt/{k}": v for k, v in learnt.per_clip.items()} if learnt else {}),
        }
        result = EvalResult(
            step=step,
            mcd_db=said.mcd_db,
            per_clip=per_clip,
            val_losses=originals.val_losses,
            seconds=sum(part.seconds for _, part in parts),
            length_ratio=originals.length_ratio,
            draw_spread=originals.draw_spread,
            duration_error=originals.duration_error,
            eligible=not reasons,
            ineligible_reason="; ".join(reasons),
            samples=said.samples,
            extra=extra,
            clips_planned=sum(part.clips_planned for _, part in parts),
            cut_short=next((part.cut_short for _, part in parts if part.cut_short), ""),
            sentences_planned=said.sentences_planned,
            mcd_se_db=said.mcd_se_db,
            choice_scores={f"correction/{k}": v for k, v in said.choice_scores.items()},
        )
        if self.baseline is None:
            self.baseline = result
        return result


@dataclass
class Decision:
    accepted: bool
    reason: str
    before: dict  # the scores of the starting model (SCORES, and the learnt ones when there are)
    after: dict  # the same for the candidate: the best evaluation, else the last one
    candidate_step: int
    measure: str = ""  # what decided whether the corrections improved
    improvement: str = ""  # that comparison, in words (advantage, noise bound, clips)


SCORES = ("corrections_mcd_db", "originals_mcd_db")
LEARNT = (
    "corrections_learnt_mcd_db",
    "corrections_learnt_length_ratio",
    "corrections_length_ratio",
    "originals_length_ratio",
)


def clip_scores(per_clip: dict, prefix: str = "correction/") -> dict[str, float]:
    """Clip id -> MCD of one part of an evaluation's per-clip figures (ClipScores or their dicts)."""
    return {
        name: (score["mcd_db"] if isinstance(score, dict) else score.mcd_db)
        for name, score in per_clip.items()
        if name.startswith(prefix)
    }


def decide(
    baseline: EvalResult,
    best: dict | None,
    last: EvalResult,
    max_regression_pct: float,
    measure: str = "the corrections' MCD",
    confidence: float = NOISE_CONFIDENCE,
) -> Decision:
    """Accept the round's best model when the voice says the corrected sentences better than the starting
    model beyond the noise (paired clip by clip, selection.py), its own held-out clips within the
    tolerance and the timing rule. Without a best model beyond the start, the last evaluation is the
    candidate, so the report always shows what the round produced."""
    before = {k: baseline.extra[k] for k in (*SCORES, *LEARNT) if k in baseline.extra}
    if best is not None and best["step"] > 0:  # the round's best_model: eligible, or the nearest (a fallback)
        after, step, after_clips = (
            {k: best[k] for k in before if k in best},
            int(best["step"]),
            clip_scores(best["per_clip"]),
        )
        timing_problem = best.get("ineligible_reason", "not eligible") if not best.get("eligible", True) else ""
    else:
        after, step, after_clips = {k: last.extra[k] for k in before}, last.step, clip_scores(last.per_clip)
        timing_problem = last.ineligible_reason if not last.eligible else ""
        if last.cut_short and step > 0:  # its means are over fewer clips than the start's: nothing to compare
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
    improvement = paired(clip_scores(baseline.per_clip), after_clips, confidence)
    decision = partial(
        Decision, before=before, after=after, candidate_step=step, measure=measure, improvement=improvement.describe()
    )
    if not all(math.isfinite(after[k]) and math.isfinite(before[k]) for k in SCORES):
        return decision(False, "a score is not a finite number (the model produced no usable speech)")
    regression = change_pct(before["originals_mcd_db"], after["originals_mcd_db"])
    if regression > max_regression_pct:
        return decision(
            False, f"the voice moved: its held-out clips got {regression:.1f}% worse (tolerance {max_regression_pct}%)"
        )
    if timing_problem:
        return decision(False, f"the voice's timing drifted ({timing_problem})")
    if step == 0 or not improvement.beyond_noise:
        return decision(False, f"the corrections did not improve beyond the noise ({improvement.describe()})")
    return decision(
        True,
        f"the corrections improved beyond the noise ({improvement.describe()}), the voice's own "
        "held-out clips within tolerance",
    )


class Versions:
    """The versions folder: numbered model versions, the current voice, the history, round folders."""

    def __init__(self, root: Path):
        self.root = Path(root)

    @property
    def current(self) -> Path:
        return self.root / "current"

    def history(self) -> dict:
        path = self.root / HISTORY
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {"current": None, "events": []}

    def versions(self) -> list[str]:
        return sorted(p.name for p in self.root.glob("v[0-9][0-9][0-9]") if p.is_dir())

    def _record(self, event: dict, current: str | None = None) -> None:
        history = self.history()
        history["events"].append({"time": time.strftime("%Y-%m-%d %H:%M:%S"), **event})
        if current is not None:
            history["current"] = current
        self.root.mkdir(parents=True, exist_ok=True)
        write_text_atomic(self.root / HISTORY, json.dumps(history, indent=2, ensure_ascii=False) + "\n")

    def repair(self) -> list[str]:
        """Undo what a round killed while making a version left (run before anything else): an unfinished
        folder swap is rolled back, a version folder the history never recorded is removed, and current/
        is made the version the history names again. Returns what was done."""
        if not self.root.is_dir():
            return []
        notes = recover(self.root)
        history = self.history()
        recorded = {e.get("version") for e in history["events"] if e.get("event") in ("base", "accepted")}
        for name in self.versions():
            if name not in recorded:
                shutil.rmtree(self.root / name)
                notes.append(f"removed {name}, a version whose round did not finish making it")
        named = history.get("current")
        if named in self.versions() and listing(self.current) != listing(self.root / named):
            self._copy_model(self.root / named, self.current)
            notes.append(f"current/ restored to {named}, the version the history names")
        return notes

    def new_round_dir(self) -> Path:
        rounds = self.root / "rounds"
        rounds.mkdir(parents=True, exist_ok=True)
        number = 1 + max([int(p.name.split("_")[1]) for p in rounds.glob("round_[0-9]*")] or [0])
        folder = rounds / f"round_{number:03d}"
        folder.mkdir()
        return folder

    def _copy_model(self, source: Path, target: Path) -> None:
        staging = staging_dir(target)
        shutil.rmtree(staging)
        shutil.copytree(source, staging)
        replace_dir(staging, target)

    def ensure_base(self, base_dir: Path) -> None:
        """Before the first round: the starting model becomes v000 and current/."""
        if not self.versions():
            self._copy_model(base_dir, self.root / "v000")
            self._copy_model(base_dir, self.current)
            self._record({"event": "base", "version": "v000", "from": str(base_dir)}, current="v000")

    def accept(self, model_dir: Path, round_name: str, report: dict) -> str:
        name = f"v{len(self.versions()):03d}"
        self._copy_model(model_dir, self.root / name)
        self._copy_model(self.root / name, self.current)
        self._record(
            {
                "event": "accepted",
                "round": round_name,
                "version": name,
                "base_version": self.history().get("current"),
                **report,
            },
            current=name,
        )
        return name

    def parent(self, version: str) -> str | None:
        """The version the round that made `version` started from (v000 has none)."""
        for event in reversed(self.history()["events"]):
            if event.get("event") == "accepted" and event.get("version") == version and event.get("base_version"):
                return event["base_version"]
        versions = self.versions()  # histories written before base_version was recorded: number order
        return versions[versions.index(version) - 1] if version in versions and versions.index(version) > 0 else None

    def reject(self, round_name: str, report: dict) -> None:
        self._record({"event": "rejected", "round": round_name, **report})

    def rollback(self, target: str) -> tuple[str, str]:
        """Make `target` current: a version name, or "previous": the version the current one was trained
        from (so repeated "previous" walks back along the accepted rounds). Returns (from, to)."""
        history, versions = self.history(), self.versions()
        current = history.get("current")
        if target == "previous":
            parent = self.parent(current) if current in versions else None
            if parent is None:
                raise FeedbackError(
                    f"no version before {current or 'nothing'} to roll back to; versions: "
                    f"{', '.join(versions) or 'none'}"
                )
            target = parent
        if target not in versions:
            raise FeedbackError(f"--rollback {target}: no such version; versions: {', '.join(versions) or 'none'}")
        self._copy_model(self.root / target, self.current)
        self._record({"event": "rollback", "from": current, "to": target}, current=target)
        return str(current), target


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

    def row(label: str, key: str, count: int, tolerance: str = "") -> str:
        before, after = decision.before[key], decision.after[key]
        return (
            f"{label} ({count} clips): MCD {before:.3f} -> {after:.3f} dB "
            f"({change_pct(before, after):+.1f}%{tolerance})"
        )

    lines.append(row("Corrections, as the voice says them", "corrections_mcd_db", counts["corrections"]))
    if "corrections_learnt_mcd_db" in decision.before and "corrections_learnt_mcd_db" in decision.after:
        lines.append(
            row(
                "Corrections, in their own speaker id (how well they were learnt)",
                "corrections_learnt_mcd_db",
                counts["corrections"],
            )
        )
    lines.append(
        row(
            "The voice's held-out originals", "originals_mcd_db", counts["originals"], f", tolerance +{max_regression}%"
        )
        + f"; length x{decision.after.get('originals_length_ratio', float('nan')):.2f} of the recordings"
    )
    if decision.measure:
        lines.append(f"Decided by {decision.measure}: {decision.improvement}.")
    lines.append(
        f"Candidate: the model at step {decision.candidate_step}. Trained on {counts['corrections']} corrections "
        f"+ {counts['replay']} replayed original clips."
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
