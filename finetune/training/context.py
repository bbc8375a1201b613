"""The means every part of a run works with, in one object from the recipe to the loop (Run): its folder and
log, the budget and its clock, the device, the processes of a data-parallel run, the stop request.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from finetune.reporting.logs import Metrics
from finetune.reporting.run_log import RunLog
from finetune.system.interrupt import StopRequest, StopRequested
from finetune.training.budget import Budget
from finetune.training.distributed import Distributed
from finetune.training.precision import Precision


@dataclass
class RunPaths:
    run_dir: Path  # checkpoints, logs, metrics, plan, samples
    output_dir: Path  # the final model: a copy of best_model, the voice an app should load

    @property
    def best_dir(self) -> Path:
        return self.run_dir / "best_model"

    @property
    def last_dir(self) -> Path:
        """The weights of the last step (output_dir holds the best model's)."""
        return self.run_dir / "last_model"

    @property
    def samples_dir(self) -> Path:
        return self.run_dir / "samples"


@dataclass
class Run:
    """A run's place and means, made once by its recipe (finetune/recipes/shared.py, open_run) and held by every
    part after it, the loop's included: its folder and log, the budget and its clock, the device and precision,
    the processes of a data-parallel run, the stop request, the checkpoint it resumes. train_vits.py opens one per
    run, train_feedback.py one per round. The run's log and the folders its loop writes are given once the recipe
    has made them (shared.build_loop), before the loop starts."""

    folder: Path
    logger: logging.Logger
    metrics: Metrics
    budget: Budget
    device: torch.device
    precision: Precision
    dist: Distributed
    stop: StopRequest
    payload: dict | None = None  # the checkpoint being resumed, if any
    resume_path: Path | None = None  # its file
    held: list = field(
        default_factory=list
    )  # locks besides the run folder's (the output folder's), released at the end
    run_log: RunLog | None = None  # train.log, metrics.jsonl, trackers and report.html, once the recipe opened them
    paths: RunPaths | None = None  # where the loop writes: checkpoints and models, the output folder

    def now(self) -> float:
        return self.budget.clock.now()

    def on_main(self, work: Callable):
        """`work` on the main process; the others wait. A stop request during it stops them all."""
        result, stopped = None, False
        if self.dist.is_main:
            try:
                result = work()
            except StopRequested:
                stopped = True
        if self.dist.any(stopped):
            raise StopRequested(self.stop.signal_name or "SIGTERM")
        return result
