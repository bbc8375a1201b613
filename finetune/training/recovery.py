"""Going back to the last good state when training keeps breaking.

A step whose loss is not finite is dropped before it reaches the weights (finetune/training/step.py). One such
step is noise; many in a row (a NaN storm) mean the weights sit where every batch overflows, and
dropping steps forever would spend the budget on nothing. So after `max_in_row` non-finite steps in a
row, and at once when an optimizer update itself failed half way (out of GPU memory inside it), the loop
goes back to the last good state (weights, discriminator, both optimizers) and lowers the learning rate
by `lr_factor`; after `max_rollbacks` such returns it stops, with the last good weights kept.

The last good state is the newest checkpoint this run wrote or resumed from; before there is one, a copy
in host RAM of the weights the run started with (optimizers then start empty, as they did). A phase that
changes what "good" means (the end of a new discriminator's warm-up) takes it again: a checkpoint, or a
new copy in RAM (`retake`) where none could be written. `after_failure` is what the loop asks after a step that
was not applied: go on, go back (and lower the rate), or stop, and why.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from finetune.training.batch_fit import OOM_WINDOWS_PER_REFIT, OUT_OF_MEMORY_ADVICE
from finetune.training.checkpoint_file import load_checkpoint

if TYPE_CHECKING:  # the loop calls after_failure; only its types are named here
    from finetune.training.loop import TrainingLoop
    from finetune.training.step import StepResult


@dataclass
class DivergencePolicy:
    max_in_row: int = 10  # non-finite steps in a row before going back
    max_rollbacks: int = 3  # going back this many times without recovering: stop
    lr_factor: float = 0.5  # the learning rate is multiplied by this at each return


class Divergence:
    """Counts dropped steps and says what to do: "ok", "rollback" or "give_up"."""

    def __init__(self, policy: DivergencePolicy = DivergencePolicy(), rollbacks: int = 0):
        self.policy, self.in_row, self.rollbacks = policy, 0, rollbacks

    def record(self, applied: bool, nonfinite: bool, update_failed: bool) -> str:
        if applied:
            self.in_row = 0
            return "ok"
        if update_failed:
            return self._return()
        if nonfinite:
            self.in_row += 1
            if self.in_row >= self.policy.max_in_row:
                return self._return()
        return "ok"

    def _return(self) -> str:
        self.in_row = 0
        if self.rollbacks >= self.policy.max_rollbacks:
            return "give_up"
        self.rollbacks += 1
        return "rollback"


def all_finite(module: torch.nn.Module) -> bool:
    return all(bool(torch.isfinite(p).all()) for p in module.parameters())


class LastGoodState:
    """Where to go back to: a checkpoint file, or the starting weights held in host RAM."""

    def __init__(self, model: torch.nn.Module, discriminator: torch.nn.Module, checkpoint: Path | None):
        self.checkpoint = checkpoint
        self.snapshot = None if checkpoint else self._copy(model, discriminator)
        self.what = "the weights the run started with"  # what the RAM copy holds

    @staticmethod
    def _copy(model, discriminator) -> dict:
        return {
            name: {k: v.detach().to("cpu", copy=True) for k, v in module.state_dict().items()}
            for name, module in (("model", model), ("discriminator", discriminator))
        }

    def saved(self, checkpoint: Path) -> None:
        """A checkpoint was written: it is the last good state from now on (the RAM copy is freed)."""
        self.checkpoint, self.snapshot = checkpoint, None

    def retake(self, model: torch.nn.Module, discriminator: torch.nn.Module) -> None:
        """The weights as they are now become the last good state (in RAM; optimizers restart empty)."""
        self.checkpoint, self.snapshot = None, self._copy(model, discriminator)
        self.what = "the weights at the end of the discriminator warm-up"

    def describe(self) -> str:
        return f"checkpoint {self.checkpoint.name}" if self.checkpoint else self.what

    def restore(self, model, discriminator, train_step) -> int | None:
        """Put the last good weights (and optimizer states, from a checkpoint) back; returns its step."""
        if self.checkpoint is not None:
            payload = load_checkpoint(self.checkpoint)
            model.load_state_dict(payload["model"])
            discriminator.load_state_dict(payload["discriminator"]["state"])
            train_step.load_optimizers(payload["train_step"])
            return int(payload["state"]["step"])
        model.load_state_dict(self.snapshot["model"])
        discriminator.load_state_dict(self.snapshot["discriminator"])
        train_step.reset_optimizers()
        return None


def after_failure(loop: TrainingLoop, result: StepResult, at: str = "") -> str | None:
    """A stop reason when training cannot go on, else None (after going back to the last good state
    if the failures call for it). `at` names the step for the log (default: the training step)."""
    at, setbacks, logger = at or f"step {loop.state.step}", loop.state.setbacks, loop.context.run_log.logger
    if result.update_failed and not result.first_update:
        loop.refit(result.reason, loop.state.step + 1)  # as the bound says; the torn update is rolled back below
    if (result.oom or result.update_failed) and loop.fitter.exhausted:  # the same on every process: no collective
        logger.error(
            f"error: out of GPU memory again at one clip a micro-batch ({result.reason or 'on another process'}; "
            f"{OOM_WINDOWS_PER_REFIT} windows since the last refit): stopped; best_model is what the run keeps. "
            f"{OUT_OF_MEMORY_ADVICE}"
        )
        return "out_of_memory"
    action = loop.divergence.record(result.applied, result.reason.startswith("non-finite"), result.update_failed)
    if action == "ok":
        return None
    if result.update_failed and result.first_update:
        go_back(loop)
        logger.error(
            "error: the optimizers' state does not fit in GPU memory (the first update ran out of it): "
            "freeze parts (--freeze posterior_encoder), use a narrower --discriminator_width, or a GPU "
            "with more memory; nothing was trained"
        )
        return "out_of_memory"
    went_back, restored = go_back(loop)
    if not went_back:
        return "out_of_memory"
    where = loop.last_good.describe() + (f" (step {restored})" if restored is not None else "")
    if action == "give_up":
        logger.error(
            f"error: training keeps failing ({result.reason}) after going back {loop.divergence.rollbacks} "
            f"times: stopped with the last good weights, {where}. Lower --learning_rate, or check the data"
        )
        return "diverged"
    setbacks.lr_scale *= loop.divergence.policy.lr_factor
    setbacks.rollbacks = loop.divergence.rollbacks
    what = (
        f"{result.reason} at {at}"
        if result.update_failed
        else f"{result.reason} in {loop.divergence.policy.max_in_row} steps in a row ({at})"
    )
    logger.warning(f"warning: {what}: went back to {where}; learning rate now x{setbacks.lr_scale:g} of the schedule")
    loop.context.run_log.event(
        "rollback", step=loop.state.step, at=at, to=where, lr_scale=setbacks.lr_scale, reason=result.reason
    )
    return None


def go_back(loop: TrainingLoop) -> tuple[bool, int | None]:
    """The last good state put back on every process: (whether it could be, its step). Loading it may
    itself run out of GPU memory (the card just did): then every process stops, said in one line."""
    restored, failed = None, ""
    try:
        restored = loop.last_good.restore(loop.parts.step.model, loop.parts.step.discriminator, loop.parts.step)
    except torch.OutOfMemoryError as error:  # torch.cuda.OutOfMemoryError is this type
        failed = str(error).strip().splitlines()[0] if str(error).strip() else "out of memory"
    if loop.context.dist.any(bool(failed)):
        where = failed or "on another process"
        loop.context.run_log.logger.error(
            f"error: going back to {loop.last_good.describe()} ran out of GPU memory "
            f"({where}): stopped; best_model is what the run keeps. {OUT_OF_MEMORY_ADVICE}"
        )
        return False, None
    return True, restored
