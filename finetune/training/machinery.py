"""What the training loop works with, built for it: the deadline (timer, costs, pacer), the data and the
windows a step draws from, the batch fitted to memory, saving and exports, evaluations, recovery, checkpoints
and the discriminator's warm-up. finetune/recipes/shared.py builds them (build_loop, one function top to bottom)
and passes them to the TrainingLoop, which only uses them; what a checkpoint holds (checkpoint_payload) is written
here too, from the same parts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from transformers import VitsTokenizer

from finetune.data.examples import Example
from finetune.data.sampler import BucketSampler
from finetune.reporting.model_card import CardFacts
from finetune.reporting.tracking import Tracker
from finetune.training.batch_fit import BatchFitter
from finetune.training.checkpoint_writer import Checkpoints
from finetune.training.context import RunPaths
from finetune.training.model_folders import Exports
from finetune.training.pacing import Pacer
from finetune.training.recovery import Divergence, LastGoodState
from finetune.training.run_evaluations import Evaluations, RunEvaluator
from finetune.training.run_settings import CheckpointSettings, LoopSettings
from finetune.training.state import TrainingState
from finetune.training.step import TrainStep
from finetune.training.warmup import DiscriminatorWarmup
from finetune.training.window import WindowRunner


@dataclass
class TrainingParts:
    """What a run trains and judges: the optimizer step (its generator and discriminator), the tokenizer
    saved with them, the clips and their sampler, the evaluator, the parts kept frozen."""

    step: TrainStep
    tokenizer: VitsTokenizer
    examples: list[Example]
    sampler: BucketSampler
    evaluator: RunEvaluator  # a training run's Evaluator, or a feedback round's (finetune/feedback/round_evaluator.py)
    frozen_parts: list[str] = field(default_factory=list)


@dataclass
class RunChoices:
    """What a recipe decides about its run beyond the shared flags, what its saves carry included."""

    title: str  # report.html's title
    paths: RunPaths
    checkpoints: CheckpointSettings
    num_workers: int
    early_stopping_patience: int = 0
    reserve_after_s: float = 0.0  # what the recipe does after the loop, kept out of the plan
    tracker: Tracker | None = None
    checkpoint_extras: dict = field(default_factory=dict)  # in every checkpoint: config, model config, tokenizer, data
    card: CardFacts | None = None  # what exported folders' model cards say (none: no card)


@dataclass
class Machinery:
    """What the loop works with: what it trains and judges (`parts`), and its collaborators (the pacer holds the
    step timer and the costs; the windows, the feed)."""

    parts: TrainingParts
    pacer: Pacer
    windows: WindowRunner
    fitter: BatchFitter
    exports: Exports  # and through it the saver
    evaluations: Evaluations
    divergence: Divergence
    last_good: LastGoodState
    checkpoints: Checkpoints
    warmup: DiscriminatorWarmup


def checkpoint_payload(
    parts: TrainingParts,
    settings: LoopSettings,
    state: TrainingState,
    pacer: Pacer,
    evaluations: Evaluations,
    choices: RunChoices,
    rng_by_rank: list,
) -> dict:
    """What a checkpoint holds (the state first takes what the run's estimates are now)."""
    estimates, timer, costs, step = state.estimates, pacer.timer, pacer.costs, parts.step
    estimates.micro_batch_s, estimates.update_s = timer.micro_batch_s, timer.update_s
    estimates.export_s, estimates.eval_s = costs.export_s, costs.eval_s
    estimates.checkpoint_s = costs.checkpoint_s
    evaluations.keep_estimates()
    return {
        "model": step.model.state_dict(),
        "discriminator": {
            "config": step.discriminator.config.to_dict(),
            "state": step.discriminator.state_dict(),
            "warmup_steps": settings.warmup.steps,
        },
        "train_step": step.state_dict(),
        "state": state.to_dict(),
        "sampler": parts.sampler.state_dict(),
        "rng": rng_by_rank[0],
        "rng_by_rank": rng_by_rank,
        "plan": pacer.plan.to_dict() if pacer.plan else None,
        **choices.checkpoint_extras,
    }
