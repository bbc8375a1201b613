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
new copy in RAM (`retake`) where none could be written.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from finetune.training.checkpoint_file import load_checkpoint


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
