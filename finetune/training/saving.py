"""What a run keeps on disk, and what keeping it costs: model exports (best and final) and checkpoints.

Every save is timed (the budget counts it before it is due) and atomic (finetune/system/atomic.py). Weights that
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

from finetune.training.checkpoint import save_checkpoint
from finetune.vits.generator import copy_model, export_model
from finetune.training.pacing import Costs
from finetune.training.recovery import all_finite


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
        written = self._write(str(folder), [self.model], "the previous one, if any, is intact",
                              lambda: export_model(self.model, self.tokenizer, folder, self.discriminator, extra_json))
        if written is None:
            return False
        self.costs.export_s = written[1]
        return True

    def publish(self, source: Path, folder: Path, extra_json: dict) -> bool:
        """Copy a written model folder (best_model) to `folder` (the output folder), with `extra_json`
        beside it; atomic like an export. False when it could not be written."""
        if not self.is_main:
            return True
        return self._write(str(folder), [], "the previous one, if any, is intact",
                           lambda: copy_model(source, folder, extra_json)) is not None

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
        written = self._write(f"checkpoint {name}", [self.model, self.discriminator],
                              "the last good checkpoint is kept and training goes on",
                              lambda: save_checkpoint(run_dir, name, payload(), self.keep_checkpoints))
        if written is None:
            return None
        path, self.costs.checkpoint_s = written
        return path

    def _write(self, what: str, parts: list, kept: str, write: Callable):
        """(what `write` returned, seconds it took); None, counted as a failure and logged with what was
        `kept`, when a part's weights are not finite or the write raised an OSError."""
        if not all(all_finite(part) for part in parts):
            self.logger.error(f"error: not writing {what}: the weights are not finite numbers")
            self.failures += 1
            return None
        started = self.now()
        try:
            result = write()
        except OSError as error:
            self.logger.error(f"error: could not write {what}: {describe_os_error(error)}; {kept}")
            self.failures += 1
            return None
        return result, self.now() - started
