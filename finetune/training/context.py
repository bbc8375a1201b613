"""The means every part of the training loop works with, handed to each part that needs them: the
budget and its clock, the processes of a data-parallel run, the stop request, the run's log, its folders.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from finetune.reporting.run_log import RunLog
from finetune.system.interrupt import StopRequest, StopRequested
from finetune.training.budget import Budget
from finetune.training.distributed import Distributed


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
class LoopContext:
    budget: Budget
    dist: Distributed
    stop: StopRequest
    run_log: RunLog
    paths: RunPaths
    resumed_from: Path | None = None  # the checkpoint this process resumed, if any

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
