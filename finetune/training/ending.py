"""How a run ends: the final evaluation and saves in their order of worth, a clean stop after Ctrl-C or
SIGTERM (back to the last completed step, then a checkpoint), and the summary and result the recipes
report. A part of TrainingLoop (finetune/training/loop.py), kept apart so each file reads in one go.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from finetune.reporting.evaluation import EvalResult
from finetune.reporting.logs import peak_memory
from finetune.training.budget import Plan
from finetune.training.checkpoint import TrainingState, restore_rng
from finetune.vits.generator import train_mode


@dataclass
class LoopResult:
    stop_reason: str  # "deadline", "max_epochs", "early_stopping", "interrupted", "diverged", "out_of_memory"
    state: TrainingState
    plan: Plan | None
    last_eval: EvalResult | None
    last_lr: float
    data_wait_s: float
    train_s: float  # seconds inside optimizer steps, data included
    checkpoint: Path | None = None
    save_failures: int = 0
    final_saved: bool = False  # the final model was written


class RunEnding:
    """The end of a run for TrainingLoop (which holds the state it uses)."""

    def finish(self) -> None:
        """Final evaluation (unless the last one saw these weights), best_model copied to the output folder
        (the voice an app loads), a checkpoint, then the last weights' export. In that order of worth: on a
        full disk the final saves may free older checkpoints, and last_model/ (the checkpoint holds the same
        weights) is the one left out. A stop request meanwhile still publishes (stop_cleanly): the budget is
        spent, so no resume would."""
        self.finishing = True
        if self.last_eval_step != self.state.step:
            self.evaluate(final=True)
        saved = self.on_main(self.save_final)
        self.final_saved = self.dist.broadcast(saved)
        self.checkpoint(end_of_epoch=self.sampler.state.position == 0, final=True)
        self.on_main(lambda: self.export(self.paths.last_dir, {"training_summary.json": self.final_summary()}))

    def publish_best(self) -> None:
        """best_model copied to the output folder, when a trained one is there (a run stopped by a failure:
        its last weights are not worth publishing, and the starting model is no news to the app)."""
        trained_best = self.state.best_step > 0 and (self.paths.best_dir / "config.json").is_file()
        if self.dist.broadcast(trained_best):
            self.final_saved = self.dist.broadcast(self.on_main(self.save_final))

    def final_summary(self) -> dict:
        return {**self.summary("finished"), "final_model_holds": self.final_source}

    def save_final(self) -> bool:
        """OUTPUT_DIR: a copy of best_model, or the last weights when there is none; its
        training_summary.json says which."""
        best = self.paths.best_dir if (self.paths.best_dir / "config.json").is_file() else None
        self.final_source = f"best_model (step {self.state.best_step})" if best else "the last weights (no best_model)"
        summary = {"training_summary.json": self.final_summary()}
        if best is None:
            return self.export(self.paths.output_dir, summary, final=True)
        card = self.card_file(self.paths.output_dir, self._read_eval(best),
                              f"the final model of its run, a copy of {self.final_source}")
        return self.saver.publish(best, self.paths.output_dir, {**summary, **card})

    @staticmethod
    def _read_eval(folder: Path) -> dict | None:
        path = folder / "eval.json"
        if not path.is_file():
            return None
        evaluation = json.loads(path.read_text(encoding="utf-8"))
        evaluation.pop("per_clip", None)
        return evaluation

    def stop_cleanly(self) -> LoopResult:
        """After a stop request: back to the last completed step if it came mid-window, then a checkpoint."""
        if self.boundary is not None:
            self.sampler.state = self.boundary.sampler
            restore_rng(self.boundary.rng)
            self.feed.restart()
            self.boundary = None
        train_mode(self.model, self.frozen_parts)
        if self.finishing and not self.final_saved:  # stopped in the final evaluation: publish all the same
            self.final_saved = self.dist.broadcast(self.on_main(self.save_final))
        path = self.checkpoint(end_of_epoch=False, final=True)
        return self.result("interrupted", checkpoint=path)

    def summary(self, reason: str) -> dict:
        return {"stop_reason": reason, "steps": self.state.step, "epochs": self.state.epoch,
                "samples_seen": self.state.samples_seen, "best_mcd_db": self.state.best_score,
                "best_step": self.state.best_step,
                "best_within_timing_rule": self.state.best_eligible and self.state.best_step >= 0,
                "last_lr": self.last_lr, "time_used_s": round(self.budget.used_s(), 2),
                "budget_s": self.budget.target_s, "nonfinite_skips": self.step.nonfinite_skips,
                "fp16_overflow_skips": self.step.overflow_skips, "oom_skips": self.step.oom_skips,
                "rollbacks": self.state.rollbacks, "save_failures": self.saver.failures,
                "precision": self.step.precision.name, **self.step.scaler_figures(),
                "discriminator_warmup_steps": self.state.discriminator_warmup_done, **self.batch_fit_summary(),
                "last_evaluation": self.last_eval_summary(), "final_evaluation_skipped": self.final_eval_skipped,
                **peak_memory(self.device)}

    def last_eval_summary(self) -> dict | None:
        """The last evaluation's step and how much of it was done (a final one may be cut short)."""
        if self.last_eval is None:
            return None
        result = self.last_eval
        return {"step": result.step, "mcd_db": round(result.mcd_db, 4), "clips_scored": result.clips_scored,
                "clips_planned": result.clips_planned, "cut_short": result.cut_short or None}

    def result(self, reason: str, checkpoint: Path | None) -> LoopResult:
        return LoopResult(stop_reason=reason, state=self.state, plan=self.plan, last_eval=self.last_eval,
                          last_lr=self.last_lr, data_wait_s=self.feed.wait_s, train_s=self.train_s,
                          checkpoint=checkpoint, save_failures=self.saver.failures, final_saved=self.final_saved)
