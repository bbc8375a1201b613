#!/usr/bin/env python3
"""Fine-tune a VITS model on a prepared corpus inside a time budget, keeping the best model.

    python train_vits.py --target_hours 9.5          # the whole run, final save included, fits 9.5 h
    python train_vits.py --max_samples 1000          # a smoke run on a subset
    python train_vits.py --resume auto               # continue an interrupted run with the same budget

The clock starts when the process starts. The first steps are timed and the run is planned to end
inside the budget; the learning rate warms up, then follows a cosine that reaches its floor at the
last step. Held-out clips are synthesised and scored (mel-cepstral distortion) at each evaluation;
CHECKPOINT_DIR/best_model is the best so far, OUTPUT_DIR the final model (both load with
VitsModel.from_pretrained and pipeline("text-to-speech"), with the discriminator beside them).
Ctrl-C or SIGTERM saves a checkpoint and exits; --resume auto continues.

Exit status: 0 finished, 1 bad data or model, 2 bad flags, 130/143 interrupted (checkpoint saved).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from finetune.cli import ConfigError, config_to_dict, flag, given_flags, parse_config, run_script

if TYPE_CHECKING:  # torch and the loop are imported once the flags are known (--help stays fast)
    from finetune.training.loop import TrainingLoop


@dataclass
class TrainConfig:
    data_dir: str = flag("training", "prepared corpus: wavs/, metadata.csv, metadata_val.csv (prepare_data.py)")
    checkpoint_dir: str = flag("training/checkpoints", "run folder: checkpoints, best_model/, samples/, logs, metrics")
    output_dir: str = flag("training/final_model", "final model (Hugging Face format + discriminator.pt)")
    model_name: str = flag("facebook/mms-tts-kmr-script_latin",
                           "starting model: hub id, local folder, or scratch[:tiny|small|mms] (new weights)")
    target_hours: float = flag(9.5, "time budget for the whole run, start-up and final save included (hours)")
    batch_size: int = flag(8, "clips per micro-batch")
    gradient_accumulation_steps: int = flag(4, "micro-batches per optimizer step")
    learning_rate: float = flag(2e-5, "peak learning rate of the generator")
    discriminator_learning_rate: float = flag(0.0, "peak learning rate of the discriminator (0: same as --learning_rate)")
    lr_floor_ratio: float = flag(0.1, "learning rate at the end of the cosine, as a fraction of the peak")
    warmup_steps: int = flag(500, "linear warmup in optimizer steps (shortened to 10%% of a short plan)")
    fp16: bool | None = flag(None, "fp16 mixed precision (default: on with CUDA, off on CPU)")
    bf16: bool = flag(False, "bf16 autocast instead of fp16 (CUDA with bf16 support)")
    max_samples: int = flag(0, "train on the first N clips of metadata.csv only (0: all)")
    benchmark_samples: int = flag(200, "clips of real training steps timed at the start to plan the run")
    resume: str = flag("none", "auto: newest checkpoint in --checkpoint_dir if any; none: a new run; or a checkpoint path")
    seed: int = flag(1234, "random seed (sampler order, segments, initial weights of new parts)")
    num_workers: int = flag(-1, "DataLoader worker processes (-1: 2 with CUDA, 0 on CPU)")
    precompute_mels: bool | None = flag(None, "precompute spectrograms into RAM (default: on CPU yes, with CUDA no; "
                                              "falls back when RAM is short)")
    val_every: int = flag(0, "evaluate every N optimizer steps (0: planned, about 20 evaluations a run)")
    val_samples: int = flag(16, "held-out clips synthesised and scored per evaluation")
    early_stopping_patience: int = flag(0, "stop after N evaluations without a better score (0: never)")
    max_epochs: int = flag(0, "stop after N epochs even if time is left (0: no limit)")
    freeze: list[str] = flag([], "parts to keep fixed: text_encoder duration_predictor posterior_encoder flow decoder")
    discriminator: str | None = flag(None, "discriminator to start from: this tool's discriminator.pt or an original VITS D_*.pth")
    discriminator_width: float = flag(1.0, "channel multiplier of a new discriminator (1: standard VITS, 46.7M parameters)")
    discriminator_periods: list[int] = flag([2, 3, 5, 7, 11], "periods of a new discriminator's period discriminators")
    discriminator_warmup_steps: int = flag(1000, "most steps a new discriminator trains alone (the generator untouched) "
                                                 "before joint training, when the generator is pretrained")
    discriminator_warmup_learning_rate: float = flag(2e-4, "constant learning rate of that warm-up (original VITS: 2e-4)")
    discriminator_warmup_margin: float = flag(0.5, "the warm-up ends once the discriminator's mean score on real minus "
                                                   "generated audio reaches this (1: perfect separation)")
    max_length_ratio: float = flag(1.25, "timing rule: a model whose median length ratio (synthesised / recorded) "
                                          "lies outside [1/X, X] is never kept as best_model")
    mel_loss_weight: float = flag(45.0, "weight of the mel L1 loss (VITS c_mel)")
    kl_loss_weight: float = flag(1.0, "weight of the KL loss (VITS c_kl)")
    duration_loss_weight: float = flag(1.0, "weight of the duration loss")
    adversarial_loss_weight: float = flag(1.0, "weight of the generator's adversarial loss")
    feature_matching_loss_weight: float = flag(1.0, "weight of the feature-matching loss")
    max_grad_norm: float = flag(10.0, "clip each model's gradient norm to this (0: no clipping)")
    keep_checkpoints: int = flag(3, "checkpoints kept in --checkpoint_dir (older ones are deleted)")
    checkpoint_every_minutes: float = flag(30.0, "also checkpoint this often inside an epoch (minutes)")
    test_sentences: str | None = flag(None, "text file, one sentence a line, synthesised at each evaluation "
                                            "(default: three built-in Kurmanji sentences)")
    log_every_seconds: float = flag(30.0, "seconds between progress lines")
    report_to: list[str] = flag(["auto"], "trackers besides train.log and metrics.jsonl: auto (TensorBoard when "
                                          "installed), tensorboard, wandb, none")
    profile: bool = flag(False, "exact step profile: synchronise the GPU at each section (slower steps)")
    device: str = flag("auto", "cuda, cuda:N, cpu, or auto")

    def __post_init__(self):
        problems = []
        positive = {"target_hours": self.target_hours, "batch_size": self.batch_size, "learning_rate": self.learning_rate,
                    "gradient_accumulation_steps": self.gradient_accumulation_steps, "val_samples": self.val_samples,
                    "discriminator_width": self.discriminator_width, "log_every_seconds": self.log_every_seconds,
                    "checkpoint_every_minutes": self.checkpoint_every_minutes,
                    "discriminator_warmup_learning_rate": self.discriminator_warmup_learning_rate}
        problems += [f"--{k} {v}: must be positive" for k, v in positive.items() if v <= 0]
        non_negative = {"max_samples": self.max_samples, "warmup_steps": self.warmup_steps, "val_every": self.val_every,
                        "early_stopping_patience": self.early_stopping_patience, "max_epochs": self.max_epochs,
                        "discriminator_learning_rate": self.discriminator_learning_rate,
                        "benchmark_samples": self.benchmark_samples, "max_grad_norm": self.max_grad_norm,
                        "discriminator_warmup_steps": self.discriminator_warmup_steps}
        problems += [f"--{k} {v}: must be 0 or more" for k, v in non_negative.items() if v < 0]
        if self.max_length_ratio < 1:
            problems.append(f"--max_length_ratio {self.max_length_ratio}: must be 1 or more (1.25 accepts 0.8-1.25)")
        if not 0 <= self.lr_floor_ratio <= 1:
            problems.append(f"--lr_floor_ratio {self.lr_floor_ratio}: use a value from 0 to 1")
        if self.fp16 and self.bf16:
            problems.append("--fp16 and --bf16 exclude each other: pick one")
        if self.keep_checkpoints < 1:
            problems.append(f"--keep_checkpoints {self.keep_checkpoints}: keep at least 1")
        from finetune.vits.generator import FREEZABLE_PARTS

        unknown = [p for p in self.freeze if p not in FREEZABLE_PARTS]
        if unknown:
            problems.append(f"--freeze {' '.join(unknown)}: unknown part; choose from {', '.join(FREEZABLE_PARTS)}")
        from finetune.reporting.tracking import check_trackers

        problems += check_trackers(self.report_to)
        if self.discriminator and not Path(self.discriminator).is_file():
            problems.append(f"--discriminator {self.discriminator}: no such file")
        if self.test_sentences and not Path(self.test_sentences).is_file():
            problems.append(f"--test_sentences {self.test_sentences}: no such file")
        if problems:
            raise ConfigError(problems)
        self.discriminator_learning_rate = self.discriminator_learning_rate or self.learning_rate  # 0: the same


# A resumed run continues with its checkpoint's settings. These may be changed by giving them again
# (budget, where it runs, what it writes and how often); the first group always comes from this command.
RESUME_FROM_COMMAND_LINE = ("resume", "checkpoint_dir", "discriminator")
RESUME_MAY_CHANGE = ("target_hours", "data_dir", "output_dir", "device", "fp16", "bf16", "num_workers", "benchmark_samples",
                     "report_to", "profile",
                     "precompute_mels", "early_stopping_patience", "max_epochs", "keep_checkpoints",
                     "checkpoint_every_minutes", "log_every_seconds", "test_sentences")

@dataclass
class Run:
    """Where this run writes, what it resumes, its budget, its device, and its stop request."""

    folder: Path
    logger: object
    metrics: object
    budget: object
    payload: dict | None  # the checkpoint being resumed, if any
    resume_path: Path | None
    device: object
    precision: object
    num_workers: int
    dist: object
    stop: object


def open_run(config: TrainConfig, given: set[str], clock, stop) -> tuple[Run, TrainConfig]:
    """Run folder and log (leftovers of a killed process cleared); the checkpoint to resume (never silently
    mixing two runs; an unreadable newest one skipped) and the settings it continues with; budget; device."""
    from finetune.system.atomic import recover
    from finetune.training.budget import Budget, safety_margin_s
    from finetune.training.checkpoint import list_checkpoints, resolve_resume, resumed_settings
    from finetune.training.distributed import from_environment
    from finetune.reporting.logs import Metrics, setup_logging
    from finetune.training.session import pick_device
    from finetune.training.step import resolve_precision

    dist = from_environment(config.device)
    folder = Path(config.checkpoint_dir)
    folder.mkdir(parents=True, exist_ok=True)
    logger = setup_logging(folder, rank=dist.rank)
    output = Path(config.output_dir)
    if dist.is_main:
        for note in recover(folder) + recover(output.parent, only=output.name):
            logger.info(f"{note} (left by a process that was killed while saving)")
    dist.any(False)  # the others wait until the main process has tidied the folder
    resume_path, payload = resolve_resume(config.resume, folder, warn=logger.warning)
    if resume_path is None and list_checkpoints(folder):
        raise ConfigError([f"{folder} holds checkpoints of an earlier run: continue it with --resume auto, or start "
                           "a new run with another --checkpoint_dir (or delete those checkpoints)"])
    if payload:
        settings, changed = resumed_settings(payload["config"], config_to_dict(config), given, RESUME_MAY_CHANGE,
                                             RESUME_FROM_COMMAND_LINE)
        config = TrainConfig(**settings)
        logger.info("resuming with the checkpoint's settings" + ("; changed on this command line: "
                    + ", ".join(f"--{k} {settings[k]}" for k in changed) if changed else ""))
    used_before = payload["state"]["time_used_s"] if payload else 0.0
    target_s = config.target_hours * 3600
    budget = Budget(target_s, clock, used_before_s=used_before, safety_s=safety_margin_s(target_s))
    logger.info(f"train_vits: budget {config.target_hours} h ({target_s:.0f}s), {budget.used_s():.1f}s used "
                f"({used_before:.1f}s by earlier processes of this run)" + (f"; resuming {resume_path}" if payload else ""))
    device = pick_device(config.device, dist.local_rank if dist.active else None)
    if dist.active:
        logger.info(f"data parallel: {dist.world_size} processes ({dist.backend}); this is rank {dist.rank} on {device}")
    workers = config.num_workers if config.num_workers >= 0 else (2 if device.type == "cuda" else 0)
    return Run(folder, logger, Metrics(folder / "metrics.jsonl", enabled=dist.is_main), budget, payload, resume_path, device,
               resolve_precision(device, config.fp16, config.bf16), workers, dist, stop), config


def build_model(config: TrainConfig, run: Run):
    """The generator (pretrained, scratch, or from the checkpoint), its tokenizer, and the features."""
    from finetune.training import session
    from finetune.data.features import FeatureConfig, Features
    from finetune.vits.generator import freeze, hop_length

    session.seed_everything(config.seed)  # before any weights are made (a resume restores its own state later)
    texts = session.corpus_texts(Path(config.data_dir))
    loaded = session.build_generator(config.model_name, run.payload, texts, 16_000)
    session.check_vocabulary(loaded.tokenizer, texts)
    frozen_parts = freeze(loaded.model, config.freeze)
    hop, rate = hop_length(loaded.model.config), int(loaded.model.config.sampling_rate)
    features = Features(FeatureConfig(sample_rate=rate, hop_length=hop)).to(run.device)
    if features.config.linear_bins != loaded.model.config.spectrogram_bins:
        raise ConfigError([f"the model expects {loaded.model.config.spectrogram_bins} spectrogram bins; n_fft 1024 "
                           f"gives {features.config.linear_bins}"])
    run.logger.info(f"generator: {loaded.description}; device {run.device}, {run.precision.name}"
                    + (f"; frozen: {', '.join(frozen_parts)}" if frozen_parts else ""))
    return loaded, frozen_parts, features


def load_data(config: TrainConfig, run: Run, tokenizer, features):
    """Training and held-out clips into RAM (after the memory check) and the bucketed sampler."""
    from finetune.data.corpus import decide_precompute, estimate_memory, load_corpus, read_metadata
    from finetune.data.sampler import BucketSampler, padding_fraction

    data_dir, hop, rate = Path(config.data_dir), features.config.hop_length, features.config.sample_rate
    rows = read_metadata(data_dir / "metadata.csv")[: config.max_samples or None]
    wanted = config.precompute_mels if config.precompute_mels is not None else run.device.type == "cpu"
    estimate = estimate_memory(data_dir, rows, features.config.linear_bins, features.config.n_mels, hop)
    precompute, memory_note = decide_precompute(estimate, wanted)
    run.logger.info(memory_note)
    train = load_corpus(data_dir, "metadata.csv", tokenizer, features, rate, config.max_samples, precompute, run.device,
                        run.stop)
    val = load_corpus(data_dir, "metadata_val.csv", tokenizer, features, rate, 0, False, run.device, run.stop) \
        if (data_dir / "metadata_val.csv").is_file() else None
    if not train.examples:
        raise ConfigError([f"no usable training clips in {data_dir}/metadata.csv ({dict(train.report.skipped)})"])
    sampler = BucketSampler(train.lengths(hop), config.batch_size, config.seed, run.dist.rank, run.dist.world_size)
    padding = padding_fraction(sampler.epoch_batches(0), train.lengths(hop))
    run.logger.info(f"data: {len(train.examples)} clips, {train.hours(rate):.2f} h, loaded in {train.load_s:.1f}s, "
                    f"{train.ram_bytes / 2**30:.2f} GiB in RAM; {sampler.batches_per_epoch} batches an epoch, padding "
                    f"{100 * padding:.1f}% of frames" + (f"; skipped {dict(train.report.skipped)}" if train.report.skipped else ""))
    run.metrics.write("data", clips=len(train.examples), hours=round(train.hours(rate), 4), load_s=round(train.load_s, 3),
                      ram_bytes=train.ram_bytes, precomputed=precompute, padding_fraction=round(padding, 4),
                      skipped=dict(train.report.skipped))
    return train, val, sampler, precompute


def build_loop(config: TrainConfig, run: Run, loaded, frozen_parts, features, train, val, sampler,
               step_callback) -> TrainingLoop:
    """Discriminator, optimizer step, evaluator and state (fresh or restored) around the training loop."""
    from finetune.training import session
    from finetune.training.checkpoint import TrainingState, check_same_data, data_fingerprint
    from finetune.reporting.evaluation import Evaluator
    from finetune.training.loop import RunPaths, TrainingLoop
    from finetune.reporting.measures import TimingRule

    choice = session.build_discriminator(config.discriminator, config.discriminator_width, config.discriminator_periods,
                                         run.payload, loaded.pretrained, config.discriminator_warmup_steps)
    run.logger.info(choice.description)
    loaded.model.to(run.device)
    discriminator = choice.discriminator.to(run.device)
    step = _train_step(config, run, loaded.model, discriminator, features)
    evaluator = Evaluator(session.held_out(val, train, config.val_samples, run.logger), features, run.device,
                          features.config.sample_rate, run.folder / "samples",
                          session.test_sentences(config.test_sentences, loaded.tokenizer, run.logger), seed=config.seed,
                          batch_size=session.eval_batch_size(run.device), rule=TimingRule(config.max_length_ratio))
    fingerprint = data_fingerprint([e.item_id for e in train.examples])
    resolved = config_to_dict(config)
    state, plan = TrainingState(), None
    if run.payload:
        check_same_data(run.payload, fingerprint)
        step.load_state_dict(run.payload["train_step"])
        sampler.load_state_dict(run.payload["sampler"])
        state, plan = TrainingState(**run.payload["state"]), _plan_from(run.payload.get("plan"))
    return TrainingLoop(
        model=loaded.model, tokenizer=loaded.tokenizer, discriminator=discriminator, step=step,
        examples=train.examples, evaluator=evaluator, budget=run.budget, sampler=sampler, state=state,
        config=_loop_config(config, run, choice.warmup_steps), plan=plan, dist=run.dist, step_callback=step_callback,
        paths=RunPaths(run_dir=run.folder, output_dir=Path(config.output_dir)), logger=run.logger,
        run_log=_run_log(config, run, resolved, features.config.sample_rate),
        device=run.device, hop=features.config.hop_length, frozen_parts=frozen_parts,
        checkpoint_extra={"config": resolved, "model_config": loaded.model.config.to_dict(),
                          "tokenizer_files": session.tokenizer_files(loaded.tokenizer), "data_fingerprint": fingerprint},
        stop=run.stop, export_extra=lambda: {"training_args.json": resolved}, resumed_from=run.resume_path)


def _run_log(config: TrainConfig, run: Run, resolved: dict, sample_rate: int):
    from finetune.system.profile import StepProfile
    from finetune.reporting.run_log import RunLog
    from finetune.reporting.tracking import open_tracker

    tracker = open_tracker(config.report_to, run.folder, resolved, run.dist.is_main)
    if tracker.sinks:
        run.logger.info(f"tracking: {', '.join(tracker.names)} in {run.folder}")
    return RunLog(run.logger, run.metrics, tracker, StepProfile(run.device, exact=config.profile), run.folder,
                  run.device, run.dist.is_main, report_title=f"train_vits: {run.folder}",
                  max_length_ratio=config.max_length_ratio, sample_rate=sample_rate)


def _train_step(config: TrainConfig, run: Run, model, discriminator, features):
    from finetune.vits.losses import LossWeights
    from finetune.training.step import StepSettings, TrainStep

    weights = LossWeights(mel=config.mel_loss_weight, kl=config.kl_loss_weight, duration=config.duration_loss_weight,
                          adversarial=config.adversarial_loss_weight, feature_matching=config.feature_matching_loss_weight)
    settings = StepSettings(learning_rate=config.learning_rate,
                            discriminator_learning_rate=config.discriminator_learning_rate,
                            max_grad_norm=config.max_grad_norm)
    return TrainStep(model, discriminator, features, weights, settings, run.precision, run.device, run.dist)


def _loop_config(config: TrainConfig, run: Run, discriminator_warmup_steps: int):
    from finetune.training.loop import LoopConfig

    return LoopConfig(batch_size=config.batch_size, accumulation=config.gradient_accumulation_steps,
                      learning_rate=config.learning_rate,
                      discriminator_learning_rate=config.discriminator_learning_rate,
                      lr_floor_ratio=config.lr_floor_ratio, warmup_steps=config.warmup_steps,
                      benchmark_samples=config.benchmark_samples, eval_every=config.val_every,
                      max_epochs=config.max_epochs, early_stopping_patience=config.early_stopping_patience,
                      keep_checkpoints=config.keep_checkpoints, checkpoint_every_s=60 * config.checkpoint_every_minutes,
                      log_every_s=config.log_every_seconds, discriminator_warmup_steps=discriminator_warmup_steps,
                      discriminator_warmup_lr=config.discriminator_warmup_learning_rate,
                      discriminator_warmup_margin=config.discriminator_warmup_margin,
                      num_workers=run.num_workers, seed=config.seed)


def report_end(config: TrainConfig, run: Run, loop, result) -> int:
    """The closing lines and the exit status: 0 finished, 1 stopped by a failure, 130/143 interrupted."""
    summary = loop.summary(result.stop_reason)
    summary.update(data_wait_share=round(result.data_wait_s / max(result.train_s, 1e-9), 4),
                   train_s=round(result.train_s, 3))
    summary = loop.run_log.end(summary)
    state = result.state
    if result.stop_reason == "interrupted":
        saved = (f"saved {result.checkpoint}; continue with the same command and --resume auto" if result.checkpoint
                 else "no checkpoint could be written (see the errors above)")
        run.logger.info(f"interrupted ({loop.stop.signal_name}) at step {state.step}: {saved}")
        return loop.stop.exit_status
    best = (f"best MCD {state.best_score:.3f} dB at step {state.best_step} -> {run.folder / 'best_model'}"
            if state.best_step >= 0 else f"no evaluation was within the timing rule ({loop.evaluator.rule.describe()}): "
                                         "no best_model written")
    run.logger.info(f"done ({result.stop_reason}) after {state.step} steps, {state.epoch} epochs, "
                    f"{run.budget.used_s():.1f}s of {run.budget.target_s:.0f}s; last learning rate {result.last_lr:.3e}; "
                    f"{best}; final model -> {config.output_dir}; report -> {run.folder / 'report.html'}")
    run.logger.info(f"time: steps {result.train_s:.0f}s ({loop.run_log.profile.describe()}), evaluations "
                    f"{summary['evaluation_s']:.0f}s, checkpoints {summary['checkpoint_s']:.0f}s, exports "
                    f"{summary['export_s']:.0f}s; data wait {100 * summary['data_wait_share']:.2f}% of step time")
    if result.save_failures:
        run.logger.error(f"error: {result.save_failures} save(s) could not be written (see above)")
    if not result.final_saved:
        run.logger.error(f"error: the final model could not be written to {config.output_dir}")
    return 1 if result.stop_reason in ("diverged", "out_of_memory") or not result.final_saved else 0


def train(config: TrainConfig, given: set[str], clock, step_callback, stop) -> int:
    run, config = open_run(config, given, clock, stop)
    try:
        return train_run(config, run, step_callback)
    finally:
        run.dist.close()


def train_run(config: TrainConfig, run: "Run", step_callback) -> int:
    import torch

    from finetune.training.checkpoint import restore_rng
    from finetune.vits.generator import train_mode
    from finetune.training.loop import BudgetTooSmall, run_with_signals

    loaded, frozen_parts, features = build_model(config, run)
    train, val, sampler, precompute = load_data(config, run, loaded.tokenizer, features)
    loop = build_loop(config, run, loaded, frozen_parts, features, train, val, sampler, step_callback)
    train_mode(loaded.model, frozen_parts)
    if run.dist.is_main:
        _write_args(run.folder, config_to_dict(config), run.device, run.precision.name, precompute, run.num_workers,
                    run.resume_path, run.dist.world_size)
    if run.payload:  # last: after everything that draws random numbers while being built
        by_rank = run.payload.get("rng_by_rank") or [run.payload["rng"]]
        restore_rng(by_rank[run.dist.rank] if len(by_rank) == run.dist.world_size else run.payload["rng"])
    elif run.dist.active:
        torch.manual_seed(config.seed + 7919 * run.dist.rank)  # each process its own segments and noise
    if run.budget.left_s() <= 2 * run.budget.safety_s:
        run.logger.error(f"error: the budget of {run.budget.target_s:.0f}s is spent ({run.budget.used_s():.0f}s used by "
                         "start-up, loading and earlier processes) before training could start: raise --target_hours")
        return 1
    try:
        result = run_with_signals(loop)
    except BudgetTooSmall as error:
        run.logger.error(f"error: {error}")
        return 1
    return report_end(config, run, loop, result)


def main(argv: list[str] | None = None, clock=None, step_callback=None) -> int:
    from finetune.training.budget import Clock
    from finetune.system.interrupt import StopRequest, StopRequested

    config = parse_config(TrainConfig, argv, __doc__)
    stop = StopRequest()
    with stop.installed():  # from the start: Ctrl-C while loading stops within seconds too
        try:
            return train(config, given_flags(TrainConfig, argv), clock or Clock(), step_callback, stop)
        except StopRequested as request:
            resumed = "the checkpoints in --checkpoint_dir are as they were; " if config.resume != "none" else ""
            print(f"interrupted ({request.signal_name}) before training started: nothing was trained; {resumed}"
                  "run the command again to start", file=sys.stderr)
            return stop.exit_status


def _plan_from(saved: dict | None):
    from finetune.training.budget import Plan

    return Plan(**saved) if saved else None


def _write_args(run_dir: Path, resolved: dict, device, precision: str, precompute: bool, num_workers: int, resumed,
                processes: int) -> None:
    from finetune.system.atomic import write_text_atomic

    extra = {"resolved": {"device": str(device), "precision": precision, "precompute_mels": precompute,
                          "num_workers": num_workers, "resumed_from": str(resumed) if resumed else None,
                          "processes": processes}}
    write_text_atomic(run_dir / "training_args.json", json.dumps({**resolved, **extra}, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(run_script(main))
