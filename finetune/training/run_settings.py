"""What the training loop runs with, in named groups, read from a recipe's flags by name.

Each recipe's config (finetune/settings.py TrainingFlags and the recipe's own flags) is the source; the
loop never reads flags itself. `LoopSettings.from_flags` takes every field by its name and fails at once
when a recipe lacks one (a renamed flag must not fall back to a default in silence); what a recipe
decides beyond its flags (the warm-up a discriminator needs, the workers its device wants, whether it
writes checkpoints) is given to it explicitly.
"""

from __future__ import annotations

from dataclasses import dataclass

from finetune.training.schedule import ScheduleSettings


@dataclass(frozen=True)
class BatchSettings:
    batch_size: int  # clips a batch, as asked (the micro-batch fitted to memory is in the training state)
    accumulation: int  # micro-batches an optimizer step, as asked
    fit_batch: str  # try the longest clips before training: auto (with CUDA), on, off
    num_workers: int  # DataLoader workers, as resolved for the device
    seed: int  # the sampler's order


@dataclass(frozen=True)
class WarmupSettings:
    """A new discriminator's warm-up, alone, before its gradients reach a pretrained generator."""

    steps: int  # at most this many steps (0: none)
    learning_rate: float  # constant: a new discriminator must learn fast
    margin: float  # it ends once real minus generated scores reach this
    share: float = 0.2  # of the time left when it first starts, at most


@dataclass(frozen=True)
class EvaluationSettings:
    every: int  # optimizer steps between evaluations (0: planned, about 20 a run)
    early_stopping_patience: int  # evaluations without a better model before stopping (0: never)
    fit_tempo: bool = True  # exported folders get inference settings fitted to the held-out recordings


@dataclass(frozen=True)
class CheckpointSettings:
    enabled: bool  # False: none at all (feedback rounds, which are never resumed)
    keep: int = 1  # the newest this many are kept
    every_minutes: float = 30.0  # also this often inside an epoch
    min_minutes: float = 0.0  # an epoch's end closer than this to the last checkpoint writes none

    @property
    def every_s(self) -> float:
        return 60 * self.every_minutes

    @property
    def min_s(self) -> float:
        return 60 * self.min_minutes


@dataclass(frozen=True)
class LoopSettings:
    batch: BatchSettings
    schedule: ScheduleSettings
    warmup: WarmupSettings
    evaluation: EvaluationSettings
    checkpoints: CheckpointSettings
    benchmark_samples: int  # clips of the timed first steps the plan is made from
    max_epochs: int  # 0: no limit
    log_every_seconds: float  # between progress lines
    reserve_after_s: float = 0.0  # what the recipe does after the loop returns, kept out of the plan

    @classmethod
    def from_flags(
        cls,
        flags,
        *,
        warmup_steps: int,
        num_workers: int,
        checkpoints: CheckpointSettings,
        early_stopping_patience: int = 0,
        reserve_after_s: float = 0.0,
    ) -> "LoopSettings":
        """The loop's settings from a recipe's config (every field read by name: a missing one is an
        AttributeError, not a default) and what the recipe decided: the warm-up the discriminator it built
        needs, the workers its device wants, its checkpoints, its early stopping."""
        return cls(
            batch=BatchSettings(
                flags.batch_size, flags.gradient_accumulation_steps, flags.fit_batch, num_workers, flags.seed
            ),
            schedule=ScheduleSettings(
                flags.learning_rate,
                flags.discriminator_learning_rate,
                flags.lr_floor_ratio,
                flags.lr_decay_share,
                flags.warmup_steps,
            ),
            warmup=WarmupSettings(
                warmup_steps, flags.discriminator_warmup_learning_rate, flags.discriminator_warmup_margin
            ),
            evaluation=EvaluationSettings(
                flags.val_every, early_stopping_patience, flags.inference_settings == "fitted"
            ),
            checkpoints=checkpoints,
            benchmark_samples=flags.benchmark_samples,
            max_epochs=flags.max_epochs,
            log_every_seconds=flags.log_every_seconds,
            reserve_after_s=reserve_after_s,
        )
