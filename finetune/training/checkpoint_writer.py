"""When and how the loop writes checkpoints: every process's random state gathered to the main one, which
writes (finetune/training/saving.py: timed, atomic, safe on a full disk); every process learns where it
went. Also the disk check before any work.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from finetune.system.disk import DiskTooSmall
from finetune.training.checkpoint_file import capture_rng, checkpoint_name
from finetune.training.context import Run
from finetune.training.saving import Saver
from finetune.training.state import TrainingState


class Checkpoints:
    def __init__(
        self,
        context: Run,
        saver: Saver,
        state: TrainingState,
        payload: Callable[[list], dict],
        saved: Callable[[Path], None],
    ):
        """`payload(rng_by_rank)`: what a checkpoint holds; `saved(path)`: told of each written (the last good
        state to go back to)."""
        self.context, self.saver, self.state, self.payload, self.saved = context, saver, state, payload, saved
        self.last: Path | None = context.resume_path
        self.last_at = context.now()

    def since_last_s(self) -> float:
        return self.context.now() - self.last_at

    def write(self, end_of_epoch: bool, final: bool = False) -> Path | None:
        """Every process's random state to the main process, which writes the checkpoint; all learn where.
        A `final` one (the run's last, or on a stop request) may delete older checkpoints to find room."""
        dist = self.context.dist
        rng_by_rank = dist.gather(capture_rng())
        path = self._write(end_of_epoch, final, rng_by_rank) if dist.is_main else None
        costs = self.saver.costs
        path, costs.checkpoint_s = dist.broadcast((path, costs.checkpoint_s))
        if path is not None:
            self.last, self.last_at = path, self.context.now()
            self.saved(path)
        return path

    def _write(self, end_of_epoch: bool, final: bool, rng_by_rank: list) -> Path | None:
        state = self.state
        state.time_used_s = self.context.budget.used_s()
        epoch = state.epoch if end_of_epoch else state.epoch + 1
        path = self.saver.checkpoint(
            self.context.paths.run_dir,
            checkpoint_name(epoch, state.step, end_of_epoch),
            lambda: self.payload(rng_by_rank),
            final,
        )
        if path is not None:
            self.context.run_log.checkpoint_s += self.saver.costs.checkpoint_s
        return path

    def check_room(self) -> None:
        """Free space against what the run will write: a warning, or DiskTooSmall on every process when not
        even one checkpoint fits."""
        context, refusal, warning = self.context, None, None
        if context.dist.is_main:
            try:
                warning = self.saver.check_room(context.paths.run_dir, context.paths.output_dir)
            except DiskTooSmall as error:
                refusal = str(error)
        if warning:
            context.run_log.logger.warning(warning)
        refusal = context.dist.broadcast(refusal)
        if refusal:
            raise DiskTooSmall(refusal)
