"""The wiring train_vits.py and train_feedback.py share, written once: a run's place and means (open_run:
folder, log, metrics, budget, device, precision, in one Run the loop holds too), the spectrogram features a model
needs, and `build_loop`: from what a recipe brings (its starting point, its clips, its evaluator, its choices) to
the training loop.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import partial
from pathlib import Path

import torch
from transformers import VitsModel, VitsTokenizer

from finetune.cli import ConfigError
from finetune.data.features import FeatureConfig, Features
from finetune.data.feed import MicroBatchFeed
from finetune.data.sampler import BucketSampler
from finetune.reporting import judges as judging
from finetune.reporting.logs import Metrics
from finetune.reporting.model_card import licence_sentence
from finetune.reporting.run_log import RunLog
from finetune.reporting.tracking import Tracker
from finetune.settings import TrainingFlags
from finetune.system.cpu_threads import CpuThreads
from finetune.system.interrupt import StopRequest
from finetune.system.profile import StepProfile
from finetune.training.assembly import DiscriminatorChoice, pick_device
from finetune.training.batch_fit import BatchFitter
from finetune.training.budget import Budget, Plan, StepTimer
from finetune.training.checkpoint_writer import Checkpoints
from finetune.training.context import Run
from finetune.training.distributed import Distributed
from finetune.training.loop import TrainingLoop
from finetune.training.machinery import Machinery, RunChoices, TrainingParts, checkpoint_payload
from finetune.training.model_folders import Exports
from finetune.training.pacing import Costs, Pacer
from finetune.training.precision import precision_warning, resolve_precision
from finetune.training.recovery import Divergence, LastGoodState
from finetune.training.run_evaluations import Evaluations
from finetune.training.run_settings import LoopSettings
from finetune.training.saving import Saver
from finetune.training.state import TrainingState
from finetune.training.step import Regulariser, StepSettings, TrainStep
from finetune.training.warmup import DiscriminatorWarmup
from finetune.training.window import WindowRunner
from finetune.vits.generator import hop_length
from finetune.vits.losses import LossWeights

NOT_FLAGS = ("weight_decay",)  # StepSettings' fields no flag sets: AdamW's default


def open_run(
    folder: Path,
    logger,
    flags: TrainingFlags,
    budget: Budget,
    dist: Distributed,
    stop: StopRequest,
    payload: dict | None = None,
    resume_path: Path | None = None,
) -> Run:
    """The run's metrics, on the device its flags ask for (each process of a torchrun launch on the GPU of
    its local rank); `logger` is setup_logging's for the folder, opened first so that resuming can warn."""
    device = pick_device(flags.device, dist.local_rank if dist.active else None, training=True)
    precision = resolve_precision(device, flags.fp16, flags.bf16)
    if warning := precision_warning(device, precision):
        logger.warning(warning)  # CPU fp16/bf16: slow, for checking numerics
    return Run(
        folder,
        logger,
        Metrics(folder / "metrics.jsonl", enabled=dist.is_main),
        budget,
        device,
        precision,
        dist,
        stop,
        payload=payload,
        resume_path=resume_path,
    )


def features_for(model, device: torch.device) -> Features:
    """The spectrograms this model trains on: its rate and hop, n_fft 1024 (its spectrogram bins must match)."""
    features = Features(FeatureConfig(sample_rate=int(model.config.sampling_rate), hop_length=hop_length(model.config)))
    if features.config.linear_bins != model.config.spectrogram_bins:
        raise ConfigError(
            [
                f"the model expects {model.config.spectrogram_bins} spectrogram bins; n_fft 1024 "
                f"gives {features.config.linear_bins}"
            ]
        )
    return features.to(device)


def train_step(flags: TrainingFlags, run: Run, model, discriminator, features: Features) -> TrainStep:
    """The optimizer step, its settings and loss weights taken from the flags by name (a weight `mel` from
    --mel_loss_weight; a renamed flag fails here, never falls back to a default)."""
    weights = LossWeights(**{f.name: getattr(flags, f"{f.name}_loss_weight") for f in fields(LossWeights)})
    settings = StepSettings(**{f.name: getattr(flags, f.name) for f in fields(StepSettings) if f.name not in NOT_FLAGS})
    return TrainStep(model, discriminator, features, weights, settings, run.precision, run.device, run.dist)


def run_log(
    flags: TrainingFlags,
    run: Run,
    title: str,
    sample_rate: int,
    tracker: Tracker | None = None,
    best_dir: Path | None = None,
) -> RunLog:
    """train.log, metrics.jsonl, the step profile, trackers and report.html, in the run's folder."""
    return RunLog(
        run.logger,
        run.metrics,
        tracker or Tracker(),
        StepProfile(run.device, exact=flags.profile),
        run.folder,
        run.device,
        run.dist.is_main,
        report_title=title,
        max_length_ratio=flags.max_length_ratio,
        sample_rate=sample_rate,
        best_dir=best_dir,
    )


def judges_panel(flags: TrainingFlags, run: Run, clips: list, texts: dict[str, str], sample_rate: int, validation=None):
    """The judges each evaluation asks (finetune/reporting/judges.py), with `clips` (Examples: the voice's own
    recordings) as the speaker judge's reference; None when off. --judges auto: speaker and phonetic where their
    extra is installed, on a GPU, or on a CPU where one of them votes (validated: judges.VOTES, --judges_validation
    or `validation`), and any other judge validated to vote; on a CPU they double a small voice's evaluation (a
    6-minute round's took 60 s), which buys nothing while they only report. `validation` (a feedback round's
    finetune/feedback/judge_check.VoiceValidation): its known() votes, and each judge that can vote validated on
    the voice by it, where no --judges_validation file says. On the main process only, the one that evaluates."""
    validation = None if flags.judges_validation else validation
    votes = {**judging.VOTES, **(judging.validated_votes(flags.judges_validation) if flags.judges_validation else {})}
    votes.update(validation.known() if validation else {})
    names = [name for name in flags.judges if name not in ("auto", "none")]
    if "auto" in flags.judges and (run.device.type == "cuda" or any(votes.get(n) for n in judging.DEFAULT)):
        names += [name for name in judging.DEFAULT if name not in names]
    if "auto" in flags.judges:  # every judge validated to vote on this voice takes part (the phone error rate too)
        names += [name for name in judging.CAN_VOTE if votes.get(name) and name not in names]
    if flags.asr_model and "asr" not in names and "none" not in flags.judges:
        names.append("asr")
    if not names or not run.dist.is_main:
        return None
    made = judging.load_judges(names, flags.asr_model)
    missing = [name for name in names if name not in made]
    if missing:
        run.logger.info(f"judges not measured: {', '.join(missing)} ({judging.INSTALL_HINT} to have them)")
    if not made:
        return None
    found = validation({n: j for n, j in made.items() if n in judging.CAN_VOTE}) if validation else {}
    votes.update({name: bool(entry["votes"]) for name, entry in found.items()})
    panel = judging.Panel(made, texts, votes, {n: e["why"] for n, e in found.items() if e.get("why")})
    try:
        panel.set_voice({e.item_id: (e.audio / 32768.0, sample_rate) for e in clips})  # int16 at the model's rate
    except judging.NoSpeech as error:
        run.logger.warning(f"judges not measured: speaker ({error})")
        del made["speaker"]  # the panel's own dict: the others judge on
        if not made:
            return None
    run.logger.info(
        "judges: "
        + "; ".join(describe_vote(panel, name, name in found) for name in made)
        + f"; the voice's {len(clips)} held-out recordings are the speaker judge's reference"
    )
    return panel


def describe_vote(panel, name: str, validated_here: bool) -> str:
    """`phonetic (votes: validated on this voice)`, `speaker (reported: its pitch ladder ranked wrong ...)`."""
    if name in panel.voting:
        return f"{name} (votes{': validated on this voice' if validated_here else ''})"
    return f"{name} (reported: {panel.why_not(name)})"


@dataclass
class StartingPoint:
    """The weights a recipe trains from: the generator (ready for training) and its tokenizer, the parts kept
    frozen, its spectrogram features, the discriminator chosen for it (finetune/training/assembly.py)."""

    model: VitsModel
    tokenizer: VitsTokenizer
    frozen_parts: list[str]
    features: Features
    discriminator: DiscriminatorChoice
    regulariser: Regulariser | None = None  # a loss on the generator alone beside the objective (a round's anchor)


def build_loop(
    flags: TrainingFlags,
    run: Run,
    start: StartingPoint,
    examples: list,
    sampler: BucketSampler,
    evaluator,
    choices: RunChoices,
    step_callback=None,
) -> TrainingLoop:
    """A run assembled, top to bottom, from what its recipe brings (its starting point, clips, evaluator and
    choices): the models on the device, the optimizer step and the state (a resumed checkpoint's, or new), the
    run's log, the deadline's parts, the data's, the saves', and the loop over them. The budget stays in `run`
    (the pacer decides against it); a stop asked for meanwhile is honoured."""
    model, discriminator = start.model.to(run.device), start.discriminator.discriminator.to(run.device)
    run.stop.check()  # building and moving the models takes seconds
    step = train_step(flags, run, model, discriminator, start.features)
    step.generator_objective.regulariser = start.regulariser
    state, plan = restored_state(run.payload, step, sampler)
    settings = LoopSettings.from_flags(
        flags,
        warmup_steps=start.discriminator.warmup_steps,
        num_workers=choices.num_workers,
        checkpoints=choices.checkpoints,
        early_stopping_patience=choices.early_stopping_patience,
        reserve_after_s=choices.reserve_after_s,
    )
    sample_rate = start.features.config.sample_rate
    run.run_log = run_log(flags, run, choices.title, sample_rate, choices.tracker, best_dir=choices.paths.best_dir)
    run.paths = choices.paths
    say_licence(run, choices.card)
    parts = TrainingParts(step, start.tokenizer, examples, sampler, evaluator, start.frozen_parts)

    # The deadline: what a step costs, what the run spends besides steps, and the pacer deciding against the budget.
    estimates = state.estimates
    prior = {"prior_micro_batch_s": estimates.micro_batch_s or None, "prior_update_s": estimates.update_s or None}
    timer = StepTimer(settings.batch.accumulation, **prior)  # a resumed run's estimates until its own are timed
    costs = Costs.from_estimates(estimates, settings, cut_short_usable=evaluator.compares_cut_short)
    cpu_threads = cpu_threads_for(step.device, run)  # a CPU run's threads, fewer while others take the cores
    pacer = Pacer.for_run(run.budget, timer, costs, settings, plan, cpu_threads.get_threads if cpu_threads else None)

    # The data: micro-batches fed from the sampler, run in windows against the deadline, fitted to memory.
    hop, batch = step.features.config.hop_length, settings.batch
    feed = MicroBatchFeed(examples, sampler, hop, batch.num_workers, batch.seed, step.device)
    windows = WindowRunner(
        step,
        feed,
        sampler,
        run.budget.clock,
        run.stop,
        cpu_threads,
        pacer.one_more_fits,
        pacer.must_end_in_s,
        lambda: timer.micro_batch_s,
    )
    fitter = BatchFitter(batch, state.batch, step, sampler, feed, timer, run.run_log)
    timer.clips = fitter.micro_batch  # the last micro-batch may be cut a clip at a time

    # Saves and judgements: model folders, evaluations, the last good state, checkpoints.
    keep, is_main = settings.checkpoints.keep, run.dist.is_main
    saver = Saver(step.model, start.tokenizer, step.discriminator, costs, run.now, run.logger, keep, is_main)
    fit_tempo = evaluator.fit_tempo if settings.evaluation.fit_tempo else None
    exports = Exports(saver, choices.card, run.paths, run.run_log, fit_tempo)
    patience = settings.evaluation.early_stopping_patience
    evaluations = Evaluations(run, evaluator, exports, state, pacer, step.model, start.frozen_parts, patience)
    last_good = LastGoodState(step.model, step.discriminator, run.resume_path)
    payload = partial(checkpoint_payload, parts, settings, state, pacer, evaluations, choices)

    machinery = Machinery(
        parts,
        pacer,
        windows,
        fitter,
        exports,
        evaluations,
        Divergence(rollbacks=state.setbacks.rollbacks),
        last_good,
        Checkpoints(run, saver, state, payload, last_good.saved),
        DiscriminatorWarmup(settings.warmup, state.warmup, run),
    )
    return TrainingLoop(run, settings, state, machinery, step_callback)


def restored_state(payload: dict | None, step: TrainStep, sampler: BucketSampler) -> tuple[TrainingState, Plan | None]:
    """The optimizer step's, the sampler's and the loop's state from the checkpoint being resumed (a new state
    and no plan without one); the plan it had made."""
    if not payload:
        return TrainingState(), None
    step.load_state_dict(payload["train_step"])
    sampler.load_state_dict(payload["sampler"])
    plan = Plan(**payload["plan"]) if payload.get("plan") else None
    return TrainingState.from_dict(payload["state"]), plan


def say_licence(run: Run, card) -> None:
    """The base model's licence, which every voice made from it inherits: said at the start."""
    if card is not None:
        run.run_log.event("licence", licence=card.licence, note=card.licence_note, base_model=card.base_model)
        run.logger.info(licence_sentence(card))


def cpu_threads_for(device: torch.device, run: Run) -> CpuThreads | None:
    """On CPU, fewer torch threads while other processes take the cores (finetune/system/cpu_threads.py)."""
    if device.type != "cpu":
        return None
    return CpuThreads(run.run_log.logger, torch.get_num_threads, torch.set_num_threads)
