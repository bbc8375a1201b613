"""What a run keeps on disk, and what keeping it costs: model exports (best and final) and checkpoints.

Every save is timed (the budget counts it before it is due) and atomic (finetune/atomic.py). Weights that
are not finite are never written: a NaN model is neither the best nor the final one. A save that fails
for want of space (or any other OSError) is logged with what to do, the previous file or folder stays as
it was (nothing is deleted to make room: older checkpoints are rotated out only after a new one is
safely written), and the run goes on; the caller learns of it from the return value.
"""

from __future__ import annotations

import errno
import shutil
from pathlib import Path
from typing import Callable

from .checkpoint import save_checkpoint
from .generator import export_model
from .pacing import Costs
from .recovery import all_finite


def describe_os_error(error: OSError) -> str:
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return "no space left on the disk (free some, or point --checkpoint_dir/--output_dir at another disk)"
    return f"{error.strerror or error} ({errno.errorcode.get(error.errno or 0, 'error')})"


class Saver:
    def __init__(self, model, tokenizer, discriminator, costs: Costs, now: Callable[[], float], logger,
                 keep_checkpoints: int, is_main: bool = True):
        self.model, self.tokenizer, self.discriminator, self.costs = model, tokenizer, discriminator, costs
        self.now, self.logger, self.keep_checkpoints, self.is_main = now, logger, keep_checkpoints, is_main
        self.failures = 0  # saves that could not be written

    def export(self, folder: Path, extra_json: dict) -> bool:
        """Write a model folder (Hugging Face format + discriminator); False when it could not be."""
        if not self.is_main:
            return True
        if not all_finite(self.model):
            self.logger.error(f"error: not writing {folder}: the weights are not finite numbers")
            self.failures += 1
            return False
        started = self.now()
        try:
            export_model(self.model, self.tokenizer, folder, self.discriminator, extra_json)
        except OSError as error:
            self.logger.error(f"error: could not write {folder}: {describe_os_error(error)}; the previous one, if "
                              "any, is intact")
            self.failures += 1
            return False
        self.costs.export_s = self.now() - started
        return True

    def measure_export(self, run_dir: Path) -> None:
        """Time an export into a scratch folder (removed after): the final save must be counted from the
        start, even when no evaluation has exported a best model yet."""
        probe = run_dir / ".export_probe"
        if self.export(probe, {}):
            shutil.rmtree(probe, ignore_errors=True)

    def checkpoint(self, run_dir: Path, name: str, payload: Callable[[], dict]) -> Path | None:
        """Write a checkpoint (the newest `keep_checkpoints` kept); None when it could not be written."""
        if not self.is_main or not self.costs.checkpoints:
            return None
        if not all_finite(self.model) or not all_finite(self.discriminator):
            self.logger.error(f"error: not writing checkpoint {name}: the weights are not finite numbers")
            self.failures += 1
            return None
        started = self.now()
        try:
            path = save_checkpoint(run_dir, name, payload(), self.keep_checkpoints)
        except OSError as error:
            self.logger.error(f"error: could not write checkpoint {name}: {describe_os_error(error)}; the last good "
                              "checkpoint is kept and training goes on")
            self.failures += 1
            return None
        self.costs.checkpoint_s = self.now() - started
        return path
