"""The training loop's milestones, shared by every process of a data-parallel run: evaluating (on the
main process, its verdicts then shared), exporting, checkpointing (every process's random state gathered
to the main one, which writes) and planning (the main process's plan, broadcast, so the learning-rate
schedule is one). A part of TrainingLoop (finetune/training/loop.py), kept apart so each file reads in one go.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from finetune.training.budget import Plan
from finetune.training.checkpoint import capture_rng, checkpoint_name
from finetune.system.disk import DiskTooSmall
from finetune.reporting.evaluation import EvalResult
from finetune.reporting.selection import NONE_YET, Standing, better, chosen_as, standing
from finetune.vits.generator import train_mode
from finetune.system.interrupt import StopRequested


class Milestones:
    """Evaluation, export, checkpoint and plan for TrainingLoop (which holds the state they use)."""

    def evaluate(self, final: bool = False) -> EvalResult | None:
        """Evaluate on the main process, inside its time limit (the final one leaves room for the final
        save only; one inside the run for the final save as well); every process then shares its verdicts
        (best model, early stopping, what it cost) and its stop, if one came during it."""
        result = self.on_main(lambda: self._evaluate(final))
        shared = self.dist.broadcast({"early_stop": self.early_stop, "eval_s": self.costs.eval_s,
                                      "export_s": self.costs.export_s, "report_s": self.costs.report_s,
                                      "last_eval_step": self.last_eval_step, "best": self.best_fields()})
        self.early_stop, self.costs.eval_s, self.costs.export_s = shared["early_stop"], shared["eval_s"], shared["export_s"]
        self.costs.report_s = shared["report_s"]
        self.last_eval_step = shared["last_eval_step"]
        for name, value in shared["best"].items():
            setattr(self.state, name, value)
        return result

    BEST_FIELDS = ("best_score", "best_step", "evals_since_best", "best_eligible", "best_timing_error")

    def best_fields(self) -> dict:
        return {name: getattr(self.state, name) for name in self.BEST_FIELDS}

    def kept_standing(self) -> Standing:
        """The standing of the model in best_model (NONE_YET before any)."""
        if self.state.best_step < 0:
            return NONE_YET
        return Standing(self.state.best_eligible, self.state.best_timing_error, self.state.best_score)

    def on_main(self, work: Callable):
        """Run `work` on the main process; the others wait. A stop request during it stops them all."""
        result, stopped = None, False
        if self.dist.is_main:
            try:
                result = work()
            except StopRequested:
                stopped = True
        if self.dist.any(stopped):
            raise StopRequested(self.stop.signal_name or "SIGTERM")
        return result

    def _evaluate(self, final: bool) -> EvalResult:
        """The main process's part of an evaluation: score (cut short at its time limit), keep the best
        model (finetune/reporting/selection.py; never a partial score), log."""
        started = self.budget.clock.now()
        result = self.evaluator.evaluate(self.model, self.state.step, self.stop, self.pacer.evaluation_limit(final))
        train_mode(self.model, self.frozen_parts)
        if result.skipped:
            self.report_skipped(result, final)
            return result
        candidate = standing(result.eligible, result.length_ratio, result.mcd_db, self.evaluator.rule.max_length_ratio)
        partial = result.clips_scored < result.clips_planned  # a mean over fewer clips is not comparable
        improved, export_s = not partial and better(candidate, self.kept_standing()), 0.0
        if improved:
            result.chosen_as = chosen_as(candidate, result.length_ratio, result.ineligible_reason)
            improved = self.export(self.paths.best_dir, {"eval.json": {**result.summary(), "chosen_as": result.chosen_as,
                                                                        "per_clip": result.per_clip_dict()}})
            export_s = self.costs.export_s if improved else 0.0
        if improved:
            self.state.best_score, self.state.best_step, self.state.evals_since_best = result.mcd_db, self.state.step, 0
            self.state.best_eligible, self.state.best_timing_error = candidate.eligible, candidate.timing_error
        else:
            self.state.evals_since_best += 1
        patience = self.config.early_stopping_patience
        self.early_stop = bool(patience and self.state.evals_since_best >= patience)
        self.last_eval, self.last_eval_step = result, result.step
        scored = self.budget.clock.now()
        self.run_log.evaluation(result, self.evaluator.describe(result), improved, self.best_note(improved),
                                self.state.best_score, getattr(self.evaluator, "example_mels", None))
        self.costs.report_s = self.budget.clock.now() - scored
        # What an evaluation costs the budget: scoring, logging and the report; a best model's export apart.
        # One cut short cost less than a whole one will: the estimate only grows from it.
        spent = self.budget.clock.now() - started - export_s
        self.costs.eval_s = max(self.costs.eval_s, spent) if result.cut_short else spent
        self.run_log.eval_s += spent
        return result

    def best_note(self, improved: bool) -> str:
        """What the evaluation line says about best_model."""
        fallback = not self.state.best_eligible
        if improved:
            return ("nearest to the timing rule so far: saved best_model as a fallback" if fallback
                    else "best so far: saved best_model")
        if self.state.best_step < 0:
            return "no model kept yet (no finite score)"
        return (f"best {self.state.best_score:.3f} at step {self.state.best_step}"
                + (", a fallback: none within the timing rule yet" if fallback else ""))

    def report_skipped(self, result: EvalResult, final: bool) -> None:
        """An evaluation that had no time for a single clip: said, counted, and otherwise without effect."""
        which = "final evaluation" if final else f"evaluation at step {result.step}"
        self.final_eval_skipped = final
        kept = self.pacer.after_evaluation_s(final) + self.budget.safety_s
        clip = getattr(self.evaluator, "group_s", None)
        self.logger.warning(f"warning: {which} skipped: {max(0.0, self.budget.left_s()):.1f}s were left, "
                            f"{kept:.1f}s of them kept for what follows (the final save"
                            f"{'' if final else ' with its evaluation'}, the safety margin)"
                            + (f", and a clip takes about {clip:.1f}s" if clip else "")
                            + ": the deadline comes first")
        self.run_log.event("eval_skipped", step=result.step, final=final, time_left_s=round(self.budget.left_s(), 2),
                           clips_planned=result.clips_planned)

    def prime_evaluation(self) -> None:
        """A process that does not start with the baseline evaluation (a resumed one) pays the first
        evaluation's one-time costs now and measures what a clip costs on this machine now, so that its
        first evaluation, often the final one, is neither a surprise nor planned at an older, faster
        machine's cost."""
        prime = getattr(self.evaluator, "prime", None)
        if prime is None:
            return
        started, before = self.budget.clock.now(), self.evaluator.expected_s()
        prime(self.model, self.pacer.evaluation_limit(final=False))  # room kept for the final save after it
        train_mode(self.model, self.frozen_parts)
        # The last evaluation's cost with its clips and sentences re-priced at what they cost now.
        self.costs.eval_s = max(self.costs.eval_s, self.costs.eval_s + self.evaluator.expected_s() - before)
        self.logger.info(f"evaluation primed in {self.budget.clock.now() - started:.1f}s: a whole one is expected to "
                         f"take {self.costs.eval_s:.1f}s")

    def measure_report(self) -> None:
        """Write report.html once before anything is timed: its imports (matplotlib) are paid here, in
        every process, and what it costs is known before the first evaluation is limited by it."""
        started = self.budget.clock.now()
        self.run_log.write_report()
        self.costs.report_s = max(self.costs.report_s, self.budget.clock.now() - started)

    def export(self, folder: Path, extra_json: dict, final: bool = False) -> bool:
        saved = self.saver.export(folder, {**extra_json, **self.card_file(folder, extra_json.get("eval.json"))}, final)
        self.run_log.export_s += self.costs.export_s if saved else 0.0
        return saved

    def card_file(self, folder: Path, evaluation: dict | None, role: str = "") -> dict[str, str]:
        """{"README.md": the model card} for an exported folder (none when the recipe gave no card facts).
        Without `evaluation`, the last evaluation's figures when it saw these weights."""
        if self.card is None:
            return {}
        from finetune.reporting.model_card import card_text

        if evaluation is None and self.last_eval is not None and self.last_eval.step == self.state.step:
            evaluation = self.last_eval.summary()
        roles = {self.paths.best_dir: f"the best model of its run (step {self.state.step})",
                 self.paths.last_dir: f"the last weights of its run (step {self.state.step})"}
        steps = int(evaluation.get("step", self.state.step)) if evaluation else self.state.step
        return {"README.md": card_text(self.card, role or roles.get(folder, folder.name), steps, evaluation)}

    def checkpoint(self, end_of_epoch: bool, final: bool = False) -> Path | None:
        """Every process's random state to the main process, which writes the checkpoint; all learn where.
        A `final` one (the run's last, or on a stop request) may delete older checkpoints to find room."""
        self.rng_by_rank = self.dist.gather(capture_rng())
        path = self._checkpoint(end_of_epoch, final) if self.dist.is_main else None
        path, self.costs.checkpoint_s = self.dist.broadcast((path, self.costs.checkpoint_s))
        if path is not None:
            self.last_checkpoint, self.last_checkpoint_at = path, self.budget.clock.now()
            self.last_good.saved(path)
        return path

    def _checkpoint(self, end_of_epoch: bool, final: bool = False) -> Path | None:
        self.state.time_used_s = self.budget.used_s()
        self.state.micro_batch_s_estimate = self.timer.micro_batch_s
        self.state.update_s_estimate = self.timer.update_s
        self.state.export_s_estimate, self.state.eval_s_estimate = self.costs.export_s, self.costs.eval_s
        self.state.checkpoint_s_estimate = self.costs.checkpoint_s
        self.state.eval_group_s_estimate = getattr(self.evaluator, "group_s", None) or 0.0
        self.state.eval_batch_size = getattr(self.evaluator, "batch_size", 0)  # as halved after running out of memory
        self.state.eval_sentence_s_estimate = getattr(self.evaluator, "sentence_s", None) or 0.0
        epoch = self.state.epoch if end_of_epoch else self.state.epoch + 1
        path = self.saver.checkpoint(self.paths.run_dir, checkpoint_name(epoch, self.state.step, end_of_epoch),
                                     self.checkpoint_payload, final)
        if path is not None:
            self.run_log.checkpoint_s += self.costs.checkpoint_s
        return path

    def checkpoint_payload(self) -> dict:
        return {"model": self.model.state_dict(),
                "discriminator": {"config": self.discriminator.config.to_dict(), "state": self.discriminator.state_dict(),
                                  "warmup_steps": self.config.discriminator_warmup_steps},
                "train_step": self.step.state_dict(), "state": self.state.to_dict(),
                "sampler": self.sampler.state_dict(), "rng": self.rng_by_rank[0], "rng_by_rank": self.rng_by_rank,
                "plan": self.plan.to_dict() if self.plan else None, **self.checkpoint_extra}

    def check_room(self) -> None:
        """Free space against what the run will write (finetune/training/saving.py): a warning, or DiskTooSmall
        on every process when not even one checkpoint fits."""
        refusal, warning = None, None
        if self.dist.is_main:
            try:
                warning = self.saver.check_room(self.paths.run_dir, self.paths.output_dir)
            except DiskTooSmall as error:
                refusal = str(error)
        if warning:
            self.logger.warning(warning)
        refusal = self.dist.broadcast(refusal)
        if refusal:
            raise DiskTooSmall(refusal)

    def replan(self) -> Plan:
        eval_every = self.plan.eval_every if self.plan else self.config.val_every
        plan = self.dist.broadcast(self.pacer.replan(self.steps_per_epoch, self.state.step, eval_every))
        self.pacer.plan = plan  # one plan (and learning-rate schedule) for every process
        self.run_log.set_total(plan.total_steps)
        return plan

    def write_plan(self) -> None:
        plan = self.plan.to_dict()
        plan.update(budget_target_s=self.budget.target_s, time_used_s=round(self.budget.used_s(), 2),
                    batches_per_epoch=self.sampler.batches_per_epoch,
                    micro_batch_s=round(self.timer.micro_batches.mean_s, 4), update_s=round(self.timer.updates.mean_s, 4))
        plan.update(self.batch_fit_summary())  # the micro-batch the run fitted to memory, and each refit
        p = self.plan
        self.run_log.plan(plan, f"plan: {p.total_steps} optimizer steps ({p.epochs:.2f} epochs of {p.steps_per_epoch} "
                          f"steps) in the {self.budget.left_s():.0f}s left; {p.step_s:.3f}s a step, evaluation every "
                          f"{p.eval_every} steps ({p.eval_s:.1f}s each), checkpoint {p.checkpoint_s:.1f}s, final save "
                          f"{p.final_s:.1f}s; warmup {p.warmup_steps} steps; limited by {p.limited_by}")
