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
from finetune.training.step import TrainStep

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


@dataclass
class RunFigures:
    """What the summary is made of, handed over by the loop (finetune/training/loop.py) as values."""

    state: TrainingState
    step: TrainStep  # its precision, skip counters and gradient scalers
    last_lr: float
    time_used_s: float
    budget_s: float
    save_failures: int
    batch_fit: dict  # the micro-batch fitted to memory, and each refit (batch_fit.py BatchFitter.summary)
    last_evaluation: dict | None
    final_evaluation_skipped: bool


def summary(figures: RunFigures, reason: str) -> dict:
    """The run in figures, for its end record and the exported folders' training_summary.json."""
    state, step, best = figures.state, figures.step, figures.state.best
    return {
        "stop_reason": reason,
        "steps": state.step,
        "epochs": state.epoch,
        "samples_seen": state.samples_seen,
        "best_mcd_db": best.score,
        "best_step": best.step,
        "best_within_timing_rule": best.eligible and best.step >= 0,
        "last_lr": figures.last_lr,
        "time_used_s": round(figures.time_used_s, 2),
        "budget_s": figures.budget_s,
        "nonfinite_skips": step.skips.nonfinite,
        "fp16_overflow_skips": step.skips.overflow,
        "oom_skips": step.skips.oom,
        "rollbacks": state.setbacks.rollbacks,
        "save_failures": figures.save_failures,
        "precision": step.precision.name,
        **step.scaler_figures(),
        "discriminator_warmup_steps": state.warmup.done,
        **figures.batch_fit,
        "last_evaluation": figures.last_evaluation,
        "final_evaluation_skipped": figures.final_evaluation_skipped,
        **peak_memory(step.device),
    }
