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
from pathlib import Path

from finetune.system.atomic import recover, replace_dir, staging_dir, write_text_atomic
from finetune.data.corrections import FeedbackError
from finetune.reporting.evaluation import EvalResult, Evaluator, describe_cut

HISTORY = "history.json"


def listing(folder: Path) -> list[tuple[str, int, int]]:
    """(relative path, size, modification time) of every file: copies made with copytree keep the last two."""
    if not folder.is_dir():
        return []
    return sorted((p.relative_to(folder).as_posix(), p.stat().st_size, p.stat().st_mtime_ns)
                  for p in folder.rglob("*") if p.is_file())


def change_pct(before: float, after: float) -> float:
    return 100.0 * (after - before) / before if before else 0.0


class FeedbackEvaluator:
    """Scores corrections and held-out originals together. Its measure is the corrections' MCD; an
    evaluation may become the round's best only when the originals got no worse than
    `max_regression_pct` over the baseline (the first evaluation: the starting model) and both the
    corrections and the originals pass the timing rule."""

    @staticmethod
    def describe(result: EvalResult) -> str:
        x = result.extra
        eligible = "" if result.eligible else f"; not eligible: {result.ineligible_reason}"
        return (f"corrections MCD {x['corrections_mcd_db']:.3f} dB (length x{x['corrections_length_ratio']:.2f}), "
                f"held-out originals {x['originals_mcd_db']:.3f} dB ({x['originals_change_pct']:+.1f}%, length "
                f"x{x['originals_length_ratio']:.2f}){eligible}{describe_cut(result)}")

    def __init__(self, corrections: Evaluator, originals: Evaluator, max_regression_pct: float):
        self.corrections, self.originals, self.max_regression_pct = corrections, originals, max_regression_pct
        self.rule = corrections.rule
        self.baseline: EvalResult | None = None

    @property
    def example_mels(self):
        return self.corrections.example_mels

    def fit_tempo(self, model):
        """The voice's tempo is fitted on its own held-out clips, not on the corrections (other voices)."""
        return self.originals.fit_tempo(model)

    def evaluate(self, model, step: int, stop=None, limit=None) -> EvalResult:
        """Corrections, then originals, inside one time limit; cut short if either was."""
        c = self.corrections.evaluate(model, step, stop, limit)
        o = self.originals.evaluate(model, step, stop, limit)
        extra = {"corrections_mcd_db": c.mcd_db, "originals_mcd_db": o.mcd_db, "corrections_length_ratio": c.length_ratio,
                 "originals_length_ratio": o.length_ratio}
        baseline = self.baseline.extra["originals_mcd_db"] if self.baseline else o.mcd_db
        extra["originals_change_pct"] = change_pct(baseline, o.mcd_db)
        reasons = [f"corrections: {c.ineligible_reason}"] if not c.eligible else []
        reasons += [f"originals: {o.ineligible_reason}"] if not o.eligible else []
        if extra["originals_change_pct"] > self.max_regression_pct:
            reasons.append(f"originals {extra['originals_change_pct']:+.1f}%, past the {self.max_regression_pct}% tolerance")
        result = EvalResult(step=step, mcd_db=c.mcd_db,
                            per_clip={**{f"correction/{k}": v for k, v in c.per_clip.items()},
                                      **{f"original/{k}": v for k, v in o.per_clip.items()}},
                            val_losses=o.val_losses, seconds=c.seconds + o.seconds, length_ratio=c.length_ratio,
                            duration_error=c.duration_error, eligible=not reasons, ineligible_reason="; ".join(reasons),
                            samples=c.samples, extra=extra, clips_planned=c.clips_planned + o.clips_planned,
                            cut_short=c.cut_short or o.cut_short, sentences_planned=c.sentences_planned,
                            mcd_se_db=c.mcd_se_db, choice_scores={f"correction/{k}": v for k, v in c.choice_scores.items()})
        if self.baseline is None:
            self.baseline = result
        return result


@dataclass
class Decision:
    accepted: bool
    reason: str
    before: dict  # corrections_mcd_db, originals_mcd_db of the starting model
    after: dict  # the same for the candidate: the best evaluation, else the last one
    candidate_step: int


SCORES = ("corrections_mcd_db", "originals_mcd_db")


def decide(baseline: EvalResult, best: dict | None, last: EvalResult, max_regression_pct: float) -> Decision:
    """Accept the round's best model when it improves the corrections without regressing the originals
    past the tolerance. Without a best model beyond the start, the last evaluation is the candidate,
    so the report always shows what the round produced."""
    before = {k: baseline.extra[k] for k in SCORES}
    if best is not None and best["step"] > 0:  # the round's best_model: eligible, or the nearest (a fallback)
        after, step = {k: best[k] for k in SCORES}, int(best["step"])
        timing_problem = best.get("ineligible_reason", "not eligible") if not best.get("eligible", True) else ""
    else:
        after, step = {k: last.extra[k] for k in SCORES}, last.step
        timing_problem = last.ineligible_reason if not last.eligible else ""
    if not all(math.isfinite(v) for v in (*before.values(), *after.values())):
        return Decision(False, "a score is not a finite number (the model produced no usable speech)", before, after, step)
    regression = change_pct(before["originals_mcd_db"], after["originals_mcd_db"])
    if regression > max_regression_pct:
        reason = f"held-out originals got {regression:.1f}% worse (tolerance {max_regression_pct}%)"
        return Decision(False, reason, before, after, step)
    if timing_problem:
        return Decision(False, f"the model's timing drifted ({timing_problem})", before, after, step)
    if after["corrections_mcd_db"] >= before["corrections_mcd_db"] or step == 0:
        return Decision(False, "the corrections did not improve", before, after, step)
    return Decision(True, "corrections improved, held-out originals within tolerance", before, after, step)


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
        self._record({"event": "accepted", "round": round_name, "version": name,
                      "base_version": self.history().get("current"), **report}, current=name)
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
                raise FeedbackError(f"no version before {current or 'nothing'} to roll back to; versions: "
                                 f"{', '.join(versions) or 'none'}")
            target = parent
        if target not in versions:
            raise FeedbackError(f"--rollback {target}: no such version; versions: {', '.join(versions) or 'none'}")
        self._copy_model(self.root / target, self.current)
        self._record({"event": "rollback", "from": current, "to": target}, current=target)
        return str(current), target


def summary_text(round_name: str, decision: Decision, version: str | None, counts: dict, max_regression: float,
                 listen_dir: Path, dropped: list[dict], undo_flags: str = "") -> str:
    """The readable report of a round; `undo_flags` are what the undo command needs besides --rollback
    (the versions folder when it is not the default)."""
    head = f"Feedback {round_name}: " + (f"ACCEPTED as {version}" if decision.accepted else "REJECTED") + f" ({decision.reason})"
    lines = [head, ""]

    def row(label: str, key: str, count: int, tolerance: str = "") -> str:
        before, after = decision.before[key], decision.after[key]
        return (f"{label} ({count} clips): MCD {before:.3f} -> {after:.3f} dB "
                f"({change_pct(before, after):+.1f}%{tolerance})")

    lines.append(row("Corrections", "corrections_mcd_db", counts["corrections"]))
    lines.append(row("Held-out originals", "originals_mcd_db", counts["originals"], f", tolerance +{max_regression}%"))
    lines.append(f"Candidate: the model at step {decision.candidate_step}. Trained on {counts['corrections']} corrections "
                 f"+ {counts['replay']} replayed original clips.")
    if dropped:
        lines.append(f"Corrections not used ({len(dropped)}): " + "; ".join(f"{d['id']}: {d['reason']} ({d['detail']})"
                                                                         for d in dropped[:10]))
    lines.append(f"Listen: {listen_dir}/ (for each correction: _0_recording, _1_before, _2_after)")
    if decision.accepted:
        lines.append(f"Undo: python train_feedback.py {undo_flags + ' ' if undo_flags else ''}--rollback previous")
    return "\n".join(lines) + "\n"
