"""The run's evaluations: scored on the main process inside a time limit, best_model kept by the
selection rule (finetune/training/selection.py; one cut short compared clip by clip), early stopping, and what an
evaluation costs, measured for the plan. Every process of a data-parallel run then shares the verdicts.
"""

from __future__ import annotations

from typing import Protocol

from finetune.reporting.evaluation import EvalResult
from finetune.reporting.measures import TimingRule
from finetune.training.context import Run
from finetune.training.finishing import FinishTimes
from finetune.training.model_folders import Exports
from finetune.training.pacing import Pacer
from finetune.training.selection import (
    NONE_YET,
    Standing,
    Verdict,
    chosen_as,
    compare,
    judge_candidate,
    judge_cut_short,
    judges_veto,
    standing,
)
from finetune.training.state import TrainingState
from finetune.vits.generator import train_mode


class RunEvaluator(Protocol):
    """What the loop asks of the evaluator a recipe brings (finetune/reporting/evaluation.py's Evaluator for a
    training run, finetune/feedback/round_evaluator.py's for a round): the loop names no feature."""

    rule: TimingRule  # the timing rule its eligibility applies (the selection rule's band)
    compares_cut_short: bool  # whether one cut short by the deadline may take part in the choice, clip by clip
    choice_in_db: bool  # whether the scores that choose (EvalResult.choice_scores) are decibels (MCD), not a ratio
    judges: object | None  # a finetune.reporting.judges.Panel, or None
    example_mels: tuple | None  # (clip id, synthesised, recorded) log-mels of the latest evaluation, for report.html

    def evaluate(self, model, step: int, stop=None, limit=None) -> EvalResult: ...

    def describe(self, result: EvalResult) -> str: ...

    def pay_one_time_costs(self, stop=None) -> None: ...

    def measure_costs_now(self, model, limit) -> None: ...

    def expected_s(self) -> float: ...

    def fit_tempo(self, model): ...

    def cost_estimates(self) -> tuple[float, float, int]: ...

    def restore_cost_estimates(self, group_s: float, sentence_s: float, batch_size: int) -> None: ...


class Evaluations:
    def __init__(
        self,
        context: Run,
        evaluator: RunEvaluator,
        exports: Exports,
        state: TrainingState,
        pacer: Pacer,
        model,
        frozen_parts: list[str],
        patience: int,
    ):
        self.context, self.evaluator, self.exports, self.state, self.pacer = context, evaluator, exports, state, pacer
        self.model, self.frozen_parts, self.patience = model, frozen_parts, patience
        self.last: EvalResult | None = None  # the latest evaluation (main process)
        self.last_step = -1  # the step the latest one saw (known to every process)
        self.early_stop = False
        self.final_skipped = False  # the final evaluation had no time for a single clip
        self.restore_estimates()

    def restore_estimates(self) -> None:
        """A resumed run's evaluator starts from what its checkpoint's last evaluation cost, piece by piece
        (its first evaluation is then limited from its first clip on), at the group size that fit."""
        estimates = self.state.estimates
        self.evaluator.restore_cost_estimates(
            estimates.eval_group_s, estimates.eval_sentence_s, estimates.eval_batch_size
        )

    def keep_estimates(self) -> None:
        """What the evaluator learnt about its costs, into the state a checkpoint saves."""
        estimates = self.state.estimates
        estimates.eval_group_s, estimates.eval_sentence_s, estimates.eval_batch_size = self.evaluator.cost_estimates()

    def evaluate(self, final: bool = False) -> EvalResult | None:
        """Evaluate on the main process, inside its time limit (the final one leaves room for the final
        save only; one inside the run for the final save as well); every process then shares its verdicts
        (best model, early stopping, what it cost) and its stop, if one came during it."""
        result = self.context.on_main(lambda: self._evaluate(final))
        costs, best = self.pacer.costs, self.state.best
        shared = self.context.dist.broadcast(
            {
                "early_stop": self.early_stop,
                "costs": (costs.eval_s, costs.export_s, costs.report_s),
                "last_step": self.last_step,
                "best": vars(best).copy(),
            }
        )
        self.early_stop, self.last_step = shared["early_stop"], shared["last_step"]
        costs.eval_s, costs.export_s, costs.report_s = shared["costs"]
        self.pacer.costs_timed()  # the final save's estimates are as slow as the machine is now
        vars(best).update(shared["best"])
        return result

    def kept_standing(self) -> Standing:
        """The standing of the model in best_model (NONE_YET before any)."""
        best = self.state.best
        if best.step < 0:
            return NONE_YET
        return Standing(best.eligible, best.timing_error, best.score, dict(best.clips), best.step)

    def _evaluate(self, final: bool) -> EvalResult:
        """The main process's part: score (cut short at its time limit), keep the best model, log."""
        context, step = self.context, self.state.step
        started = context.now()
        result = self.evaluator.evaluate(self.model, step, context.stop, self.pacer.evaluation_limit(final))
        train_mode(self.model, self.frozen_parts)
        if result.skipped:
            self.report_skipped(result, final)
            return result
        improved, verdict, export_s = self.keep_if_best(result, final)
        self.early_stop = bool(self.patience and self.state.best.evals_since >= self.patience)
        self.last, self.last_step = result, result.step
        logged = context.now()
        redrawn = context.run_log.evaluation(
            result,
            self.evaluator.describe(result),
            improved,
            self.best_note(improved, verdict),
            self.state.best.score,
            self.evaluator.example_mels,
            report=not final,
        )
        redraw_s = context.now() - logged if redrawn else 0.0
        if redrawn:  # what report.html costs to draw now (the closing one is counted by it)
            self.pacer.costs.report_s = redraw_s
        # What an evaluation costs the budget: scoring and logging; a best model's export and a redraw of
        # report.html apart (each counted on its own). One cut short cost less than a whole one will: the
        # estimate only grows from it.
        spent = context.now() - started - export_s - redraw_s
        self.pacer.costs.eval_s = max(self.pacer.costs.eval_s, spent) if result.cut_short else spent
        context.run_log.eval_s += spent
        return result

    def tempo_fits(self, result: EvalResult) -> bool:
        """The final evaluation's: whether a best model's export with its tempo fit, its copy into the output folder
        and what must follow still fit in the time left, at the speed the evaluation scored its clips
        (finishing.py). A machine that got busy under the final evaluation of a 72 s run made the tempo fit after it
        5x slower than timed, and the run ended 5% over; without the fit best_model keeps the model's own inference
        settings (those the evaluation judged it with)."""
        if self.exports.fit_tempo is None:  # --inference_settings model: no fit to leave out
            return True
        times = FinishTimes.starting(self.pacer)
        times.evaluated(result.clips_scored, result.clips_planned, result.seconds)
        part_s = times.planned.export_s + times.planned.copy_s
        if times.room(part_s):
            return True
        times.left_out(self.context.run_log, "best_model's tempo fit", part_s)
        return False

    def keep_if_best(self, result: EvalResult, final: bool = False) -> tuple[bool, str, float]:
        """The selection rule on an evaluation (verdict); its model exported as best_model when it wins, with its
        inference settings fitted (the final evaluation's: where the time left allows, tempo_fits); the best so
        far and early stopping's count updated (record_best). (whether it was kept, what decided, export
        seconds)."""
        best = self.state.best
        candidate = standing(
            result.eligible,
            result.length_ratio,
            result.mcd_db,
            self.evaluator.rule.max_length_ratio,
            result.choice_scores,
            result.step,
        )
        if result.says_nothing:  # not even as the fallback nearest the timing rule
            best.evals_since += 1
            return False, "a voice that says nothing is never kept", 0.0
        kept, voting = self.kept_standing(), self.voting_scores(result)
        verdict = self.verdict(result, candidate, kept, voting)
        if not (verdict.replace and self.export_best(result, candidate, verdict, final)):
            best.evals_since += 1
            return False, verdict.why, 0.0
        self.record_best(result, candidate, kept, voting)
        return True, verdict.why, self.pacer.costs.export_s

    def verdict(self, result: EvalResult, candidate, kept: Standing, voting: dict) -> Verdict:
        """Whether `candidate` (result's standing) replaces the model kept (selection.py), and why: one cut short
        compared clip by clip where the evaluator allows; a tie in rank vetoed by a voting judge that heard it
        worse; said in the unit the evaluator's scores have."""
        if result.clips_scored < result.clips_planned:
            # Clip by clip where selection.py allows; never for an evaluator whose parts are judged by their means
            # (a feedback round's): there a mean over fewer clips would be compared with one over all of them.
            verdict = (
                judge_cut_short(candidate, kept)
                if self.evaluator.compares_cut_short
                else Verdict(False, "cut short: not compared")
            )
        else:
            verdict = judge_candidate(candidate, kept)
        if verdict.replace and kept.step >= 0 and candidate is not None and candidate.rank() == kept.rank():
            veto = judges_veto(self.state.best.judged, voting, self.higher_is_better(), kept.step)
            if veto:
                verdict = Verdict(False, veto)
        if not self.evaluator.choice_in_db:  # the selection rule speaks in MCD's unit; these scores have none
            verdict = Verdict(verdict.replace, verdict.why.replace(" dB", ""))
        return verdict

    def export_best(self, result: EvalResult, candidate, verdict: Verdict, final: bool) -> bool:
        """The winning evaluation's model written as best_model, with eval.json saying why (False: not written)."""
        result.chosen_as = chosen_as(candidate, result.length_ratio, result.ineligible_reason)
        summary = {**result.summary(), "chosen_as": result.chosen_as, "chosen_because": verdict.why}
        return self.exports.export(
            self.context.paths.best_dir,
            {"eval.json": {**summary, "per_clip": result.per_clip_dict()}},
            result.step,
            summary,
            tempo=not final or self.tempo_fits(result),
        )

    def record_best(self, result: EvalResult, candidate, kept: Standing, voting: dict) -> None:
        """The new best kept in the state. Early stopping counts evaluations without a lower MCD (or a better
        timing): a tie kept for its training is no progress. Lower on the clips both scored (one of them may have
        been cut short)."""
        best = self.state.best
        progress = kept.step < 0 or candidate.rank() != kept.rank() or compare(candidate, kept).advantage_db > 0
        best.score, best.step, best.clips, best.judged = result.mcd_db, result.step, dict(candidate.clips), voting
        best.eligible, best.timing_error = candidate.eligible, candidate.timing_error
        best.evals_since = 0 if progress else best.evals_since + 1

    def voting_scores(self, result: EvalResult) -> dict[str, dict[str, float]]:
        """Each voting judge's score of each clip of `result` (none without an evaluator's judges)."""
        panel = self.evaluator.judges
        return {name: result.judged_clips(name) for name in panel.voting} if panel else {}

    def higher_is_better(self) -> dict[str, bool]:
        panel = self.evaluator.judges
        return {name: panel.higher_is_better(name) for name in panel.judges} if panel else {}

    def best_note(self, improved: bool, why: str = "") -> str:
        """What the evaluation line says about best_model, and what decided."""
        best = self.state.best
        fallback = not best.eligible
        because = f"; {why}" if why and why != "the first model kept" else ""
        if improved:
            return (
                "nearest to the timing rule so far: saved best_model as a fallback" if fallback else "saved best_model"
            ) + because
        if best.step < 0:
            return "no model kept yet (none with a finite score that says something)" + because
        return (
            f"best {best.score:.3f} at step {best.step}"
            + (", a fallback: none within the timing rule yet" if fallback else "")
            + because
        )

    def report_skipped(self, result: EvalResult, final: bool) -> None:
        """An evaluation that had no time for a single clip: said, counted, and otherwise without effect."""
        context = self.context
        which = "final evaluation" if final else f"evaluation at step {result.step}"
        self.final_skipped = final
        kept = self.pacer.after_evaluation_s(final) + self.pacer.margin_s
        clip = self.evaluator.cost_estimates()[0]
        context.run_log.logger.warning(
            f"warning: {which} skipped: {max(0.0, context.budget.left_s()):.1f}s were left, "
            f"{kept:.1f}s of them kept for what follows (the final save"
            f"{'' if final else ' with its evaluation'}, the safety margin)"
            + (f", and a clip takes about {clip:.1f}s" if clip else "")
            + ": the deadline comes first"
        )
        context.run_log.event(
            "eval_skipped",
            step=result.step,
            final=final,
            time_left_s=round(context.budget.left_s(), 2),
            clips_planned=result.clips_planned,
        )

    def pay_one_time_costs(self) -> None:
        """A fresh process, before its baseline evaluation: what the first evaluation would pay once (librosa's
        DTW compiled, references made) paid now, so that the baseline measures what an evaluation costs. Else a
        short run whose final evaluation is its only other one kept that one-time cost as the final save's
        reserve and ended that much early (25 s of a 360 s demo in a fresh environment). On the main process,
        the only one that evaluates."""
        self.context.on_main(self._pay_one_time_costs)

    def _pay_one_time_costs(self) -> None:
        context = self.context
        started = context.now()
        self.evaluator.pay_one_time_costs(context.stop)
        took = context.now() - started
        if took >= 1.0:
            context.run_log.logger.info(
                f"evaluation's one-time costs paid in {took:.1f}s before the baseline evaluation is timed "
                "(librosa's DTW: compiled on a fresh environment's first run, loaded from its cache after; across "
                "speakers, the recordings' references)"
            )

    def measure_costs_now(self) -> None:
        """A process that does not start with the baseline evaluation (a resumed one) pays the first
        evaluation's one-time costs now and measures what a clip costs on this machine now, so that its
        first evaluation, often the final one, is neither a surprise nor planned at an older, faster
        machine's cost (on the main process; the others learn the estimate)."""
        self.context.on_main(self._measure_costs_now)
        self.pacer.costs.eval_s = self.context.dist.broadcast(self.pacer.costs.eval_s)

    def _measure_costs_now(self) -> None:
        context = self.context
        started, before = context.now(), self.evaluator.expected_s()
        self.evaluator.measure_costs_now(
            self.model, self.pacer.evaluation_limit(final=False)
        )  # room kept for the final save
        train_mode(self.model, self.frozen_parts)
        # The last evaluation's cost with its clips and sentences re-priced at what they cost now.
        self.pacer.costs.eval_s = max(
            self.pacer.costs.eval_s, self.pacer.costs.eval_s + self.evaluator.expected_s() - before
        )
        context.run_log.logger.info(
            f"evaluation primed in {context.now() - started:.1f}s: a whole one is expected to "
            f"take {self.pacer.costs.eval_s:.1f}s"
        )

    def last_summary(self) -> dict | None:
        """The last evaluation's step and how much of it was done (a final one may be cut short)."""
        if self.last is None:
            return None
        result = self.last
        return {
            "step": result.step,
            "mcd_db": round(result.mcd_db, 4),
            "clips_scored": result.clips_scored,
            "clips_planned": result.clips_planned,
            "cut_short": result.cut_short or None,
        }
