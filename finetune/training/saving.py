"""What a run keeps on disk, and what keeping it costs: model exports (best and final) and checkpoints.

Every save is timed (the budget counts it before it is due) and atomic (finetune/system/atomic.py). Weights that
are not finite are never written: a NaN model is neither the best nor the final one.

A save the disk refuses (full, or any failed write: the exception types differ by library, see
finetune/system/disk.py) leaves no partial file, is logged in one line ("disk full in DIR: N MB free, a
checkpoint needs M MB; kept ..."), keeps the previous file or folder as it was, and the run goes on; the
caller learns of it from the return value. An ordinary save deletes nothing to make room (older
checkpoints are rotated out only after a new one is safely written). The final save (the final model,
the last checkpoint, the one written on a stop request) matters more than old checkpoints: when the disk
is full it deletes the oldest checkpoints on that disk, one at a time, never the newest, and tries again.

At the start, `check_room` compares the free space with what the run will write: (keep_checkpoints + 1)
checkpoints (rotation deletes the oldest only after the new one is written) and two exports (best and
final), sized from the parameter counts and the optimizer states. Short of that: a warning with the
figures; short of one checkpoint: a refusal (DiskTooSmall) before anything is trained.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from finetune.system.disk import (
    FREE_SPACE_FIX,
    DiskTooSmall,
    describe_failure,
    detached,
    free_bytes,
    is_write_failure,
    looks_full,
    mb,
)
from finetune.training.checkpoint_file import list_checkpoints, newest_first, save_checkpoint
from finetune.training.pacing import Costs
from finetune.training.recovery import all_finite
from finetune.vits.voice_on_disk import copy_model, export_model


@dataclass
class SaveSizes:
    """Bytes one save takes: estimated from the parameters at first, then as measured after each write."""

    checkpoint: int
    export: int


def parameter_bytes(module, trainable_only: bool = False) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters() if p.requires_grad or not trainable_only)


def estimate_sizes(model, discriminator) -> SaveSizes:
    """A checkpoint: both models' weights and buffers plus AdamW's two fp32 moments per trainable weight
    (so about 3x the weights; MMS with the standard discriminator: about 1 GB). An export: the generator's
    weights (safetensors) and the discriminator's (discriminator.pt)."""
    buffers = sum(b.numel() * b.element_size() for m in (model, discriminator) for b in m.buffers())
    weights = parameter_bytes(model) + parameter_bytes(discriminator)
    moments = 2 * sum(p.numel() * 4 for m in (model, discriminator) for p in m.parameters() if p.requires_grad)
    return SaveSizes(checkpoint=weights + buffers + moments, export=weights + buffers)


def folder_bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else 0


def same_disk(a: Path, b: Path) -> bool:
    def device(path: Path) -> int:
        path = path.absolute()
        while not path.exists():
            path = path.parent
        return os.stat(path).st_dev

    return device(a) == device(b)


class Saver:
    def __init__(
        self,
        model,
        tokenizer,
        discriminator,
        costs: Costs,
        now: Callable[[], float],
        logger,
        keep_checkpoints: int,
        is_main: bool = True,
    ):
        self.model, self.tokenizer, self.discriminator, self.costs = model, tokenizer, discriminator, costs
        self.now, self.logger, self.keep_checkpoints, self.is_main = now, logger, keep_checkpoints, is_main
        self.failures = 0  # saves that could not be written
        self.sizes = estimate_sizes(model, discriminator)
        self.run_dir: Path | None = None  # where checkpoints are (the final save may free room there)

    def export(self, folder: Path, extra_json: dict, final: bool = False, inference: dict | None = None) -> bool:
        """Write a model folder (Hugging Face format + discriminator; `inference`: settings its config.json
        speaks with instead of the model's own); False when it could not be."""
        if not self.is_main:
            return True
        written = self._write(
            folder,
            "the model",
            self.sizes.export,
            [self.model],
            "the previous one, if any, is intact",
            final,
            lambda: export_model(self.model, self.tokenizer, folder, self.discriminator, extra_json, inference),
        )
        if written is None:
            return False
        self.costs.export_s = written[1]
        self.sizes.export = folder_bytes(folder) or self.sizes.export
        return True

    def publish(self, source: Path, folder: Path, extra_json: dict, final: bool = True) -> bool:
        """Copy a written model folder (best_model) to `folder` (the output folder; last_model, not `final`:
        it frees no room), with `extra_json` beside it; atomic like an export. False when it could not be
        written."""
        if not self.is_main:
            return True
        return (
            self._write(
                folder,
                "the model",
                self.sizes.export,
                [],
                "the previous one, if any, is intact",
                final,
                lambda: copy_model(source, folder, extra_json),
            )
            is not None
        )

    def measure_export(self, run_dir: Path) -> None:
        """Time an export into a scratch folder (removed after): the final save must be counted from the
        start, even when no evaluation has exported a best model yet."""
        probe = run_dir / ".export_probe"
        if self.export(probe, {}):
            shutil.rmtree(probe, ignore_errors=True)

    def checkpoint(self, run_dir: Path, name: str, payload: Callable[[], dict], final: bool = False) -> Path | None:
        """Write a checkpoint (the newest `keep_checkpoints` kept); None when it could not be written."""
        self.run_dir = run_dir
        if not self.is_main or not self.costs.checkpoints:
            return None
        written = self._write(
            run_dir / name,
            "a checkpoint",
            self.sizes.checkpoint,
            [self.model, self.discriminator],
            "training goes on",
            final,
            lambda: save_checkpoint(run_dir, name, payload(), self.keep_checkpoints),
        )
        if written is None:
            return None
        path, self.costs.checkpoint_s = written
        self.sizes.checkpoint = path.stat().st_size
        return path

    def _write(self, target: Path, noun: str, needed: int, parts: list, kept: str, final: bool, write: Callable):
        """(what `write` returned, seconds it took); None, counted as a failure and logged in one line,
        when a part's weights are not finite or the disk refused the write. A `final` save frees room by
        deleting the oldest checkpoints, never the newest, and tries again."""
        what = f"checkpoint {target.name}" if noun == "a checkpoint" else str(target)
        if not all(all_finite(part) for part in parts):
            self.logger.error(f"error: not writing {what}: the weights are not finite numbers")
            self.failures += 1
            return None
        freed: list[str] = []
        while True:
            started = self.now()
            try:
                return write(), self.now() - started
            except Exception as error:  # only failed writes are handled; anything else is a bug and surfaces
                if not is_write_failure(error):
                    raise
                failure = error.with_traceback(None)
            failure = detached(failure)  # frees the failed file's blocks (see detached)
            if not (final and looks_full(failure, target.parent, needed) and self._free_one(target, needed, freed)):
                break
        self.failures += 1
        freed_note = f"; freed {', '.join(freed)}" if freed else ""
        self.logger.error(
            f"error: could not write {what}: {describe_failure(failure, target.parent, noun, needed)}"
            f"{freed_note}; {self._kept_note()}, {kept}. {FREE_SPACE_FIX[0].upper()}{FREE_SPACE_FIX[1:]}"
        )
        return None

    def _free_one(self, target: Path, needed: int, freed: list[str]) -> bool:
        """Delete the oldest checkpoint on the target's disk, never the newest; False when none is left to
        delete, or when deleting all of them would still not make room for `needed` bytes (then they stay)."""
        if self.run_dir is None or not self.run_dir.is_dir() or not same_disk(self.run_dir, target.parent):
            return False
        candidates = newest_first(self.run_dir)[1:]
        if not candidates or free_bytes(target.parent) + sum(p.stat().st_size for p in candidates) < needed:
            return False
        oldest = candidates[-1]
        size = oldest.stat().st_size
        oldest.unlink()
        freed.append(f"{oldest.name} ({mb(size)})")
        self.logger.warning(
            f"warning: disk full: deleted the older checkpoint {oldest.name} to make room for the final save"
        )
        return True

    def _kept_note(self) -> str:
        if self.run_dir is None or not self.run_dir.is_dir():
            return "nothing was deleted"
        existing = newest_first(self.run_dir)
        if not existing:
            return "no checkpoint is on disk"
        return f"kept {existing[0].name}" + (f" and {len(existing) - 1} older" if len(existing) > 1 else "")

    def check_room(self, run_dir: Path, output_dir: Path) -> str | None:
        """Before training: a warning (returned) when the disk cannot hold what the run will write, or
        DiskTooSmall when it cannot hold one checkpoint (one export when the run writes none)."""
        self.run_dir = run_dir
        if not self.is_main:
            return None
        checkpoints = self.keep_checkpoints + 1 if self.costs.checkpoints else 0
        existing = list_checkpoints(run_dir) if run_dir.is_dir() else []
        reclaimable = sum(p.stat().st_size for p in existing) + folder_bytes(run_dir / "best_model")
        needed = checkpoints * self.sizes.checkpoint + self.sizes.export
        free = free_bytes(run_dir)
        if same_disk(run_dir, output_dir):
            needed += self.sizes.export
            reclaimable += folder_bytes(output_dir)
        elif free_bytes(output_dir) < self.sizes.export:
            raise DiskTooSmall(
                f"disk full in {output_dir.parent}: {mb(free_bytes(output_dir))} free, the final model "
                f"needs about {mb(self.sizes.export)}: {FREE_SPACE_FIX}"
            )
        one = self.sizes.checkpoint if self.costs.checkpoints else self.sizes.export
        newest = max((p.stat().st_size for p in existing), default=0)
        if free + reclaimable - newest < one:
            raise DiskTooSmall(
                f"disk full in {run_dir}: {mb(free)} free, a checkpoint needs about {mb(one)}; nothing "
                f"was trained: {FREE_SPACE_FIX}"
            )
        if free + reclaimable < needed:
            return (
                f"warning: {run_dir} has {mb(free)} free; this run writes up to {mb(needed)} ({checkpoints} "
                f"checkpoints of about {mb(self.sizes.checkpoint)} and two models of {mb(self.sizes.export)}): "
                f"later saves may fail for want of space (each keeps the previous one). Lower --keep_checkpoints, "
                f"or {FREE_SPACE_FIX}"
            )
        return None
