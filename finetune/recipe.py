"""The wiring train_vits.py and train_feedback.py share, written once: a run's place and means (folder,
log, metrics, budget, device, precision), the spectrogram features a model needs, the optimizer step and
the run's log built from the shared training flags (finetune/settings.py), and the training loop.

The recipes import this module lazily (finetune.cli.lazy_modules), once their flags are parsed: it pulls
in torch and transformers, which `--help` does not need.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from finetune.cli import ConfigError
from finetune.data.features import FeatureConfig, Features
from finetune.reporting.logs import Metrics
from finetune.reporting.run_log import RunLog
from finetune.reporting.tracking import Tracker
from finetune.settings import TrainingFlags
from finetune.system.interrupt import StopRequest
from finetune.system.profile import StepProfile
from finetune.training.budget import Budget
from finetune.training.distributed import Distributed
from finetune.training.loop import LoopConfig, TrainingLoop
from finetune.training.session import pick_device
from finetune.training.step import Precision, StepSettings, TrainStep, precision_warning, resolve_precision
from finetune.vits.generator import hop_length
from finetune.vits.losses import LossWeights


@dataclass
class Run:
    """Where a run writes and what it runs with. train_vits.py opens one per run (resuming a checkpoint,
    `payload`), train_feedback.py one per round."""

    folder: Path
    logger: object
    metrics: Metrics
    budget: Budget
    device: torch.device
    precision: Precision
    dist: Distributed
    stop: StopRequest
    payload: dict | None = None  # the checkpoint being resumed, if any
    resume_path: Path | None = None
    held: list = field(default_factory=list)  # locks besides the run folder's (the output folder's), released at the end


def open_run(folder: Path, logger, flags: TrainingFlags, budget: Budget, dist: Distributed, stop: StopRequest,
             payload: dict | None = None, resume_path: Path | None = None) -> Run:
    """The run's metrics, on the device its flags ask for (each process of a torchrun launch on the GPU of
    its local rank); `logger` is setup_logging's for the folder, opened first so that resuming can warn."""
    device = pick_device(flags.device, dist.local_rank if dist.active else None)
    precision = resolve_precision(device, flags.fp16, flags.bf16)
    if warning := precision_warning(device, precision):
        logger.warning(warning)  # CPU fp16/bf16: slow, for checking numerics
    return Run(folder, logger, Metrics(folder / "metrics.jsonl", enabled=dist.is_main), budget, device,
               precision, dist, stop, payload, resume_path)


def features_for(model, device: torch.device) -> Features:
    """The spectrograms this model trains on: its rate and hop, n_fft 1024 (its spectrogram bins must match)."""
    features = Features(FeatureConfig(sample_rate=int(model.config.sampling_rate), hop_length=hop_length(model.config)))
    if features.config.linear_bins != model.config.spectrogram_bins:
        raise ConfigError([f"the model expects {model.config.spectrogram_bins} spectrogram bins; n_fft 1024 "
                           f"gives {features.config.linear_bins}"])
    return features.to(device)


def train_step(flags: TrainingFlags, run: Run, model, discriminator, features: Features) -> TrainStep:
    """The optimizer step: loss weights, learning rates and clipping from the flags."""
    weights = LossWeights(mel=flags.mel_loss_weight, kl=flags.kl_loss_weight, duration=flags.duration_loss_weight,
                          adversarial=flags.adversarial_loss_weight, feature_matching=flags.feature_matching_loss_weight)
    settings = StepSettings(learning_rate=flags.learning_rate, discriminator_learning_rate=flags.discriminator_learning_rate,
                            max_grad_norm=flags.max_grad_norm)
    return TrainStep(model, discriminator, features, weights, settings, run.precision, run.device, run.dist)


def run_log(flags: TrainingFlags, run: Run, title: str, sample_rate: int, tracker: Tracker | None = None,
            best_dir: Path | None = None) -> RunLog:
    """train.log, metrics.jsonl, the step profile, trackers and report.html, in the run's folder."""
    return RunLog(run.logger, run.metrics, tracker or Tracker(), StepProfile(run.device, exact=flags.profile), run.folder,
                  run.device, run.dist.is_main, report_title=title, max_length_ratio=flags.max_length_ratio,
                  sample_rate=sample_rate, best_dir=best_dir)


def training_loop(flags: TrainingFlags, run: Run, *, loop_settings: dict, **parts) -> TrainingLoop:
    """The training loop over the run's budget, device, processes and stop request; `loop_settings` is what the
    recipe decided beyond its flags (finetune/training/loop.py LoopConfig), `parts` the models, data and paths."""
    return TrainingLoop(config=LoopConfig.from_flags(flags, **loop_settings), budget=run.budget, dist=run.dist,
                        logger=run.logger, device=run.device, stop=run.stop, **parts)
