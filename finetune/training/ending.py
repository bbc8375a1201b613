"""What a finished (or stopped) run hands back to its recipe: the result, and the summary its closing
lines, metrics.jsonl's end record and training_summary.json are made of.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from finetune.reporting.evaluation import EvalResult
from finetune.reporting.logs import peak_memory
from finetune.training.budget import Plan
from finetune.training.state import TrainingState

STOP_REASONS = ("deadline", "max_epochs", "early_stopping", "interrupted", "diverged", "out_of_memory")


@dataclass
class LoopResult:
    stop_reason: str  # one of STOP_REASONS
    state: TrainingState
    plan: Plan | None
    last_eval: EvalResult | None
    last_lr: float
    data_wait_s: float
    train_s: float  # seconds inside optimizer steps, data included
    checkpoint: Path | None = None
    save_failures: int = 0
    final_saved: bool = False  # the output folder was written


def summary(loop, reason: str) -> dict:
    """The run in figures, for its end record and the exported folders' training_summary.json. `loop` is
    the finetune/training/loop.py TrainingLoop that ran."""
    state, step, best = loop.state, loop.step, loop.state.best
    return {"stop_reason": reason, "steps": state.step, "epochs": state.epoch, "samples_seen": state.samples_seen,
            "best_mcd_db": best.score, "best_step": best.step, "best_within_timing_rule": best.eligible and best.step >= 0,
            "last_lr": loop.last_lr, "time_used_s": round(loop.context.budget.used_s(), 2),
            "budget_s": loop.context.budget.target_s, "nonfinite_skips": step.nonfinite_skips,
            "fp16_overflow_skips": step.overflow_skips, "oom_skips": step.oom_skips,
            "rollbacks": state.setbacks.rollbacks, "save_failures": loop.saver.failures,
            "precision": step.precision.name, **step.scaler_figures(), "discriminator_warmup_steps": state.warmup.done,
            **loop.fitter.summary(), "last_evaluation": loop.evaluations.last_summary(),
            "final_evaluation_skipped": loop.evaluations.final_skipped, **peak_memory(step.device)}
