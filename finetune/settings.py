"""The training flags that train_vits.py and train_feedback.py share, defined once.

They are declared in groups by what they govern (data, model, schedule, objective, evaluation, reporting), each a
dataclass whose docstring titles its part of `--help` (finetune/cli.py), each flag with what a resume does with it;
TrainingFlags is all of them. Each recipe's config dataclass inherits TrainingFlags and adds its own flags (a recipe
may give a shared flag another default by declaring the field again). The training loop, the optimizer step and the
evaluation read these fields by name from whichever config the recipe passes on, so no recipe copies
them field by field. Light on purpose: it is imported before the flags are parsed (`--help` stays fast).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from finetune.cli import ConfigError, flag


@dataclass
class DataFlags:
    """Data: the clips each step trains on, in what order and how many at once."""

    batch_size: int = flag(8, "clips per micro-batch")
    gradient_accumulation_steps: int = flag(4, "micro-batches per optimizer step")
    fit_batch: str = flag(
        "auto",
        "try the longest clips once before training; on out-of-memory halve the micro-batch "
        "and double the accumulation (same clips a step): auto (with CUDA), on, off",
        choices=["auto", "on", "off"],
        on_resume="may_change",
    )
    length_pool_batches: int = flag(
        32,
        "batches whose clips are sorted by length together, once an epoch's clips are shuffled: 32 makes batches "
        "of similar lengths (little padding); 1 makes batches of clips drawn at random, as finetune-hf-vits",
    )
    seed: int = flag(1234, "random seed (sampler order, segments, initial weights of new parts)")


@dataclass
class ModelFlags:
    """Model: which parts train, the discriminator, the number format and the device."""

    freeze: list[str] = flag([], "parts to keep fixed: text_encoder duration_predictor posterior_encoder flow decoder")
    dropout: str = flag(
        "auto",
        "dropout while training: on (the rates in the model's config, as VITS trains from scratch), off (none, as "
        "finetune-hf-vits fine-tunes), auto (off from a pretrained voice, on from scratch)",
        choices=["auto", "on", "off"],
    )
    discriminator_width: float = flag(
        1.0, "channel multiplier of a new discriminator (1: standard VITS, 46.7M parameters)"
    )
    discriminator_warmup_steps: int = flag(
        1000,
        "most steps a new discriminator trains alone (the generator untouched) "
        "before joint training, when the generator is pretrained",
    )
    discriminator_warmup_learning_rate: float = flag(
        2e-4, "constant learning rate of that warm-up (original VITS: 2e-4)"
    )
    discriminator_warmup_margin: float = flag(
        0.5,
        "the warm-up ends once the discriminator's mean score on real minus "
        "generated audio reaches this (1: perfect separation)",
    )
    fp16: bool | None = flag(
        None,
        "fp16 mixed precision (default: on with CUDA, off on CPU, where it is slow and meant for checking numerics)",
        on_resume="may_change",
    )
    bf16: bool = flag(
        False,
        "bf16 autocast instead of fp16 (CUDA with bf16 support; on CPU for checking numerics)",
        on_resume="may_change",
    )
    device: str = flag("auto", "cuda, cuda:N, cpu, or auto", on_resume="may_change")


@dataclass
class ScheduleFlags:
    """Schedule: the learning-rate curve (finetune/training/schedule.py) and how the plan is timed."""

    learning_rate: float = flag(2e-5, "peak learning rate of the generator")
    discriminator_learning_rate: float = flag(
        0.0, "peak learning rate of the discriminator (0: same as --learning_rate)"
    )
    lr_floor_ratio: float = flag(0.1, "learning rate at the end of the cosine, as a fraction of the peak")
    lr_decay_share: float = flag(
        1.0,
        "the cosine's share of the steps after the warmup; the rate holds at its peak before it (1: the cosine spans "
        "them all)",
    )
    warmup_steps: int = flag(500, "linear warmup in optimizer steps (shortened to 10%% of a short plan)")
    max_epochs: int = flag(
        0,
        "stop after N epochs of training even if time is left (a new discriminator's warm-up does not count; 0: no "
        "limit)",
        on_resume="may_change",
    )
    benchmark_samples: int = flag(
        200, "clips of real training steps timed at the start to plan the run", on_resume="may_change"
    )


@dataclass
class ObjectiveFlags:
    """Objective: the losses, their weights and the optimizers."""

    mel_loss_weight: float = flag(45.0, "weight of the mel L1 loss (VITS c_mel)")
    kl_loss_weight: float = flag(1.0, "weight of the KL loss (VITS c_kl)")
    duration_loss_weight: float = flag(1.0, "weight of the duration loss")
    adversarial_loss_weight: float = flag(1.0, "weight of the generator's adversarial loss")
    feature_matching_loss_weight: float = flag(1.0, "weight of the feature-matching loss")
    max_grad_norm: float = flag(10.0, "clip each model's gradient norm to this (0: no clipping)")
    segment_frames: int = flag(
        32,
        "spectrogram frames of each clip that the decoder and the discriminators train on in a step "
        "(x the hop: 32 x 256 = 8192 samples, as in VITS); fewer make a step faster and show it less audio",
    )
    discriminator_loss_weight: float = flag(1.0, "weight of the discriminator's own loss (finetune-hf-vits: 3)")
    discriminator_every: int = flag(
        1,
        "the discriminator learns in every Nth optimizer step (1: each, as VITS); in the others it only scores the "
        "audio for the generator's losses, which saves its own forward and backward",
    )
    duration_every: int = flag(
        1,
        "the duration predictor learns in every Nth optimizer step (1: each, as VITS); in the others its loss is "
        "not computed, which saves its flows' forward and backward",
    )
    adam_eps: float = flag(1e-9, "AdamW's epsilon, both optimizers (original VITS: 1e-9; finetune-hf-vits: 1e-8)")
    anchor_weight: float = flag(
        0.0,
        "pull the generator's trained weights toward where they started, by this times "
        "the learning rate at each step, in place of AdamW's decay toward zero (L2-SP; "
        "0: off). Keeps what the start already knew while a few things change",
    )


@dataclass
class EvaluationFlags:
    """Evaluation: how often, on what, which model is kept and what the exported voice speaks with."""

    val_every: int = flag(
        0, "evaluate at every N-th optimizer step (0: planned, about 20 evaluations a run, the final one included)"
    )
    val_samples: int = flag(16, "held-out clips synthesised and scored per evaluation")
    max_length_ratio: float = flag(
        1.25,
        "timing rule: a model whose median length ratio (synthesised / recorded) "
        "lies outside [1/X, X] is kept as best_model only while none is inside "
        "(the nearest, as a fallback)",
    )
    inference_settings: str = flag(
        "fitted",
        "what the exported config.json speaks with: fitted (speaking_rate and "
        "noise_scale_duration fitted on the held-out recordings, so that one "
        "request speaks at their tempo) or model (the model's own)",
        choices=["fitted", "model"],
    )
    judges: list[str] = flag(
        ["auto"],
        "judges scoring each evaluated clip beside MCD (finetune/reporting/judges.py): speaker (is it the voice), "
        "phonetic and phone_errors (does it say the words), asr (with --asr_model), none; auto: speaker and "
        "phonetic where requirements-judges.txt is installed, on a GPU, or on a CPU where one of them votes (on a "
        "CPU they double a small voice's evaluation, which buys nothing while they only report), and any other "
        "judge --judges_validation found voting. Which judges vote: bench/RESULTS.md",
        on_resume="may_change",
    )
    judges_validation: str | None = flag(
        None,
        "a results.json of bench/bench_judges.py run on your voice: the judges it found ranking every ladder right "
        "vote in this run (decide what is kept, and a feedback round); without it, those finetune/reporting/judges.py "
        "names (today none beside MCD), and in a feedback round those it validates on its voice by itself",
        on_resume="may_change",
    )
    asr_model: str | None = flag(
        None,
        "a transformers CTC model (hub id or folder, e.g. an MMS ASR with its language adapter) for the asr judge: "
        "its character error rate on each evaluated clip's text",
        on_resume="may_change",
    )


@dataclass
class ReportingFlags:
    """Reporting: the progress lines and the step profile."""

    log_every_seconds: float = flag(30.0, "seconds between progress lines", on_resume="may_change")
    profile: bool = flag(
        False, "exact step profile: synchronise the GPU at each section (slower steps)", on_resume="may_change"
    )


@dataclass
class TrainingFlags(ReportingFlags, EvaluationFlags, ObjectiveFlags, ScheduleFlags, ModelFlags, DataFlags):
    """The shared training flags, every group (their fields come data first: a dataclass collects its bases'
    fields from the last base to the first)."""

    def __post_init__(self):
        problems = self.problems()
        if problems:
            raise ConfigError(problems)
        self.discriminator_learning_rate = self.discriminator_learning_rate or self.learning_rate  # 0: the same

    def problems(self) -> list[str]:
        """Every problem with the shared flags, each naming its flag; a recipe adds its own to the list."""
        positive = {
            name: getattr(self, name)
            for name in (
                "batch_size",
                "gradient_accumulation_steps",
                "learning_rate",
                "val_samples",
                "discriminator_width",
                "log_every_seconds",
                "discriminator_warmup_learning_rate",
                "discriminator_loss_weight",
                "discriminator_every",
                "duration_every",
                "adam_eps",
                "segment_frames",
                "length_pool_batches",
            )
        }
        problems = [f"--{k} {v}: must be positive" for k, v in positive.items() if v <= 0]
        non_negative = {
            name: getattr(self, name)
            for name in (
                "warmup_steps",
                "val_every",
                "max_epochs",
                "discriminator_learning_rate",
                "benchmark_samples",
                "max_grad_norm",
                "discriminator_warmup_steps",
                "anchor_weight",
            )
        }
        problems += [f"--{k} {v}: must be 0 or more" for k, v in non_negative.items() if v < 0]
        if self.max_length_ratio < 1:
            problems.append(f"--max_length_ratio {self.max_length_ratio}: must be 1 or more (1.25 accepts 0.8-1.25)")
        if not 0 <= self.lr_floor_ratio <= 1:
            problems.append(f"--lr_floor_ratio {self.lr_floor_ratio}: use a value from 0 to 1")
        if not 0 < self.lr_decay_share <= 1:
            problems.append(f"--lr_decay_share {self.lr_decay_share}: use a value above 0, at most 1")
        from finetune.reporting.judges import CAN_VOTE  # numpy only: --help stays light

        known = ("auto", "none", *CAN_VOTE)
        if any(name not in known for name in self.judges):
            problems.append(f"--judges {' '.join(self.judges)}: choose from {', '.join(known)}")
        if self.judges_validation and not Path(self.judges_validation).is_file():
            problems.append(
                f"--judges_validation {self.judges_validation}: no such file (bench/bench_judges.py writes it)"
            )
        if "asr" in self.judges and not self.asr_model:
            problems.append("--judges asr needs --asr_model (a transformers CTC model: hub id or folder)")
        if self.fp16 and self.bf16:
            problems.append("--fp16 and --bf16 exclude each other: pick one")
        from finetune.vits.generator import FREEZABLE_PARTS  # after parsing: torch is not needed for --help

        unknown = [p for p in self.freeze if p not in FREEZABLE_PARTS]
        if unknown:
            problems.append(f"--freeze {' '.join(unknown)}: unknown part; choose from {', '.join(FREEZABLE_PARTS)}")
        return problems
