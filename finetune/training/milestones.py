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
from finetune.vits.generator import train_mode
from finetune.system.interrupt import StopRequested


class Milestones:
    """Evaluation, export, checkpoint and plan for TrainingLoop (which holds the state they use)."""

    def evaluate(self) -> EvalResult | None:
        """Evaluate on the main process; every process then shares its verdicts (best model, early
        stopping, what it cost) and its stop, if one came during it."""
        result = self.on_main(self._evaluate)
        shared = self.dist.broadcast({"early_stop": self.early_stop, "eval_s": self.costs.eval_s,
                                      "export_s": self.costs.export_s, "last_eval_step": self.last_eval_step,
                                      "best": (self.state.best_score, self.state.best_step, self.state.evals_since_best)})
        self.early_stop, self.costs.eval_s, self.costs.export_s = shared["early_stop"], shared["eval_s"], shared["export_s"]
        self.last_eval_step = shared["last_eval_step"]
        self.state.best_score, self.state.best_step, self.state.evals_since_best = shared["best"]
        return result

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

    def _evaluate(self) -> EvalResult:
        """The main process's part of an evaluation: score, keep the best model, log."""
        started = self.budget.clock.now()
        result = self.evaluator.evaluate(self.model, self.state.step, self.stop)
        train_mode(self.model, self.frozen_parts)
        improved = result.eligible and result.mcd_db < self.state.best_score
        export_s = 0.0
        if improved:
            improved = self.export(self.paths.best_dir, {"eval.json": {**result.summary(),
                                                                        "per_clip": result.per_clip_dict()}})
            export_s = self.costs.export_s if improved else 0.0
        if improved:
            self.state.best_score, self.state.best_step, self.state.evals_since_best = result.mcd_db, self.state.step, 0
        else:
            self.state.evals_since_best += 1
        patience = self.config.early_stopping_patience
        self.early_stop = bool(patience and self.state.evals_since_best >= patience)
        self.last_eval, self.last_eval_step = result, result.step
        best = ("best so far: saved best_model" if improved
                else f"best {self.state.best_score:.3f} at step {self.state.best_step}" if self.state.best_step >= 0
                else "no model within the timing tolerance yet")
        self.run_log.evaluation(result, self.evaluator.describe(result), improved, best, self.state.best_score,
                                getattr(self.evaluator, "example_mels", None))
        # What an evaluation costs the budget: scoring, logging and the report; a best model's export apart.
        self.costs.eval_s = self.budget.clock.now() - started - export_s
        self.run_log.eval_s += self.costs.eval_s
        return result

    def export(self, folder: Path, extra_json: dict, final: bool = False) -> bool:
        saved = self.saver.export(folder, extra_json, final)
        self.run_log.export_s += self.costs.export_s if saved else 0.0
        return saved

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
        p = self.plan
        self.run_log.plan(plan, f"plan: {p.total_steps} optimizer steps ({p.epochs:.2f} epochs of {p.steps_per_epoch} "
                          f"steps) in the {self.budget.left_s():.0f}s left; {p.step_s:.3f}s a step, evaluation every "
                          f"{p.eval_every} steps ({p.eval_s:.1f}s each), checkpoint {p.checkpoint_s:.1f}s, final save "
                          f"{p.final_s:.1f}s; warmup {p.warmup_steps} steps; limited by {p.limited_by}")
