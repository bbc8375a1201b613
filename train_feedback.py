#!/usr/bin/env python3
"""Teach the voice what it still says wrong: a short fine-tune on corrected recordings.

    python train_feedback.py --review sentences.txt       # 1. speak sentences with the current voice -> review/
    # 2. listen; record the ones it says wrong, correctly, as pairs in training/feedback/: <id>.wav (any
    #    audio format) + <id>.txt (its text; review/<id>.txt has it), as a recording app saves them; or
    #    as wavs/<id>.wav + metadata.csv lines id|text (the LJSpeech layout)
    python train_feedback.py                              # 3. a feedback round (default 15 minutes)
    python train_feedback.py --rollback previous          # 4. undo the last accepted round

A round starts from the current voice (training/voices/current, else the best model of the last
training run) and its discriminator, trains on the corrections mixed with a replay sample of the
original corpus (against forgetting) with the training loop of train_vits.py, and scores the
corrections and held-out original clips before and after. The new model is kept, as the next version,
only when the corrections improved and the originals got no worse than --max_regression percent;
otherwise the current voice stays as it was. Either way the corrected sentences are rendered before and
after, for listening, and a report is written.

Exit status: 0 done (accepted or rejected: see the report), 1 bad data or model, 2 bad flags,
130/143 interrupted.
"""

from __future__ import annotations

import json
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from finetune.system.atomic import write_text_atomic
from finetune.cli import ConfigError, config_to_dict, flag, parse_config, run_script


@dataclass
class FeedbackConfig:
    feedback_dir: str | None = flag(None, "corrections: pairs <name>.wav + <name>.txt, or wavs/ + metadata.csv "
                                          "(id|text); any audio format and rate (default: training/feedback, else feedback)")
    base_model: str | None = flag(None, "model to start from (default: OUTPUT_DIR/current, else "
                                        "training/checkpoints/best_model); its discriminator.pt is used if present")
    data_dir: str = flag("training", "the original prepared corpus: replay clips and held-out clips come from it")
    output_dir: str = flag("training/voices", "versions folder: current/, v000/, v001/ ..., history.json, rounds/")
    replay_ratio: float = flag(2.0, "original clips replayed per correction (0: none, which risks forgetting)")
    learning_rate: float = flag(1e-5, "peak learning rate (smaller than training's 2e-5)")
    discriminator_learning_rate: float = flag(0.0, "peak learning rate of the discriminator (0: same)")
    target_minutes: float = flag(15.0, "time budget of the round, everything included (minutes)")
    target_hours: float = flag(0.0, "time budget in hours instead (0: use --target_minutes)")
    max_regression: float = flag(2.0, "accept only if the held-out originals' MCD rises by at most this (percent)")
    max_length_ratio: float = flag(1.25, "timing rule: a model whose median length ratio (synthesised / recorded) on "
                                          "the corrections or the originals lies outside [1/X, X] is never accepted")
    freeze: list[str] = flag([], "parts to keep fixed: text_encoder duration_predictor posterior_encoder flow decoder")
    batch_size: int = flag(8, "clips per micro-batch")
    gradient_accumulation_steps: int = flag(1, "micro-batches per optimizer step")
    warmup_steps: int = flag(50, "linear warmup in optimizer steps")
    lr_floor_ratio: float = flag(0.1, "learning rate at the end, as a fraction of the peak")
    val_samples: int = flag(16, "held-out original clips scored before, during and after")
    val_every: int = flag(0, "evaluate every N optimizer steps (0: planned)")
    max_epochs: int = flag(0, "stop after N passes over the mixed data (0: no limit)")
    benchmark_samples: int = flag(64, "clips of timed training steps before planning")
    discriminator_warmup_steps: int = flag(50, "steps a new discriminator trains alone, when the base model has none")
    discriminator_width: float = flag(1.0, "channel multiplier of a new discriminator (when the base model has none)")
    min_seconds: float = flag(0.5, "drop corrections shorter than this after trimming (seconds)")
    max_seconds: float = flag(15.0, "drop corrections longer than this after trimming (seconds)")
    rollback: str | None = flag(None, "instead of training: make a version current again ('previous' or e.g. v001)")
    review: str | None = flag(None, "instead of training: speak this file's sentences with the current voice")
    review_dir: str = flag("review", "output folder of --review")
    seed: int = flag(1234, "random seed (replay sample, order, segments)")
    fp16: bool | None = flag(None, "fp16 mixed precision (default: on with CUDA)")
    bf16: bool = flag(False, "bf16 autocast instead of fp16")
    log_every_seconds: float = flag(30.0, "seconds between progress lines")
    device: str = flag("auto", "cuda, cuda:N, cpu, or auto")

    def __post_init__(self):
        problems = []
        positive = {"learning_rate": self.learning_rate, "batch_size": self.batch_size, "val_samples": self.val_samples,
                    "gradient_accumulation_steps": self.gradient_accumulation_steps,
                    "log_every_seconds": self.log_every_seconds, "discriminator_width": self.discriminator_width}
        problems += [f"--{k} {v}: must be positive" for k, v in positive.items() if v <= 0]
        if self.target_hours <= 0 and self.target_minutes <= 0:
            problems.append("--target_minutes (or --target_hours) must be positive")
        for name in ("replay_ratio", "max_regression", "discriminator_learning_rate", "warmup_steps", "val_every",
                     "max_epochs", "benchmark_samples", "discriminator_warmup_steps", "target_hours"):
            if getattr(self, name) < 0:
                problems.append(f"--{name} {getattr(self, name)}: must be 0 or more")
        if self.max_length_ratio < 1:
            problems.append(f"--max_length_ratio {self.max_length_ratio}: must be 1 or more (1.25 accepts 0.8-1.25)")
        if self.rollback and self.review:
            problems.append("--rollback and --review are separate actions: give one")
        if self.review and not Path(self.review).is_file():
            problems.append(f"--review {self.review}: no such file")
        from finetune.vits.generator import FREEZABLE_PARTS

        unknown = [p for p in self.freeze if p not in FREEZABLE_PARTS]
        if unknown:
            problems.append(f"--freeze {' '.join(unknown)}: unknown part; choose from {', '.join(FREEZABLE_PARTS)}")
        if problems:
            raise ConfigError(problems)
        self.discriminator_learning_rate = self.discriminator_learning_rate or self.learning_rate  # 0: the same

    @property
    def budget_s(self) -> float:
        return 3600 * self.target_hours if self.target_hours > 0 else 60 * self.target_minutes


class FeedbackError(Exception):
    """The round cannot run as asked; the message says what to do."""


def base_model_dir(config: FeedbackConfig, versions) -> Path:
    if config.base_model:
        path = Path(config.base_model)
    elif versions.current.is_dir():
        path = versions.current
    else:
        path = Path("training/checkpoints/best_model")
    missing = [name for name in ("config.json", "vocab.json") if not (path / name).is_file()]
    if missing:
        raise FeedbackError(f"no model to start from at {path} (no {' or '.join(missing)}): train one first "
                            "(train_vits.py), or pass --base_model DIR with a model folder train_vits.py wrote")
    return path


def review(config: FeedbackConfig, base: Path) -> int:
    from finetune.training.session import pick_device
    from finetune.vits.synthesis import load_voice, numbered, prepare_lines, read_sentences, speak_for_review

    voice = load_voice(base, pick_device(config.device))
    lines = prepare_lines(voice, numbered(read_sentences(config.review)))
    out = Path(config.review_dir)
    sayable = speak_for_review(voice, lines, out)
    target = config.feedback_dir or FEEDBACK_DIRS[0]
    print(f"{len(sayable)} sentences spoken by {base} -> {out}/ (<id>.wav, <id>.txt, metadata.csv)\n"
          f"Listen; record each sentence it says wrong as {target}/<id>.wav and copy {out}/<id>.txt beside it "
          f"(or let your recording app save the pairs there); then run train_feedback.py")
    return 0


FEEDBACK_DIRS = ("training/feedback", "feedback")  # where corrections are looked for, in order


def feedback_folder(config: FeedbackConfig) -> Path:
    if config.feedback_dir:
        return Path(config.feedback_dir)
    for candidate in FEEDBACK_DIRS:
        if Path(candidate).is_dir():
            return Path(candidate)
    raise FeedbackError(f"no corrections: record them into {FEEDBACK_DIRS[0]}/ as pairs <name>.wav + <name>.txt "
                        "(or wavs/ + metadata.csv), or pass --feedback_dir")


def corrections_source(folder: Path):
    """The corrections in either layout: LJSpeech (metadata.csv + wavs/) or audio + .txt pairs."""
    from finetune.data.sources import SourceError, ljspeech_source, looks_like_pairs, pairs_source

    try:
        if (folder / "metadata.csv").is_file() or not folder.is_dir():
            source = ljspeech_source(folder, flag="--feedback_dir")
        elif looks_like_pairs(folder):
            source = pairs_source(folder, flag="--feedback_dir")
        else:
            raise FeedbackError(f"{folder} holds no corrections: expected pairs <name>.wav + <name>.txt, or wavs/ + "
                                "metadata.csv (see train_feedback.py --review)")
    except SourceError as error:
        raise FeedbackError(str(error)) from error
    if source.count == 0:
        raise FeedbackError(f"{folder}/metadata.csv lists no corrections: record some first "
                            "(see train_feedback.py --review)")
    return source


def prepare_corrections(config: FeedbackConfig, round_dir: Path, base: Path, logger) -> tuple[Path, dict]:
    """The feedback folder prepared like the corpus (the base model's vocabulary and rate), into the round."""
    from finetune.system.model_source import model_sample_rate, model_vocabulary, resolve_model
    from finetune.data.prepare import ClipSettings, Preparer, write_outputs
    from finetune.data.text import TextNormalizer

    folder = feedback_folder(config)
    source = corrections_source(folder)
    model = resolve_model(str(base))
    settings = ClipSettings(sample_rate=model_sample_rate(model), trim_db=40.0, trim_margin_s=0.05, peak=0.95,
                            min_seconds=config.min_seconds, max_seconds=config.max_seconds)
    out = round_dir / "corrections"
    preparer = Preparer(out, TextNormalizer(model_vocabulary(model)), settings, num_workers=1)
    report = write_outputs(out, preparer.run(source), 0.0, {"source": source.description})
    logger.info(f"corrections: {report['counts']['kept']} of {report['counts']['items']} usable"
                + "".join(f"; {d['id']} dropped: {d['reason']} ({d['detail']})" for d in report["dropped"]))
    if not report["counts"]["kept"]:
        raise FeedbackError(f"none of the corrections in {folder} can be used; reasons are in "
                            f"{out}/prepare_report.json")
    return out, report


@dataclass
class Round:
    """One feedback round's place and means: its folder, log, metrics, budget, device and stop request."""

    folder: Path
    logger: object
    metrics: object
    budget: object
    device: object
    stop: object
    dist: object  # finetune.training.distributed.Distributed: which process of a torchrun launch this is


@dataclass
class RoundData:
    model: object  # the generator, ready for training
    tokenizer: object
    features: object
    corrections: object  # Corpus
    originals: object  # Corpus: held-out clips of the original
    replay: list  # Examples of the original corpus
    prepare_report: dict
    hop: int
    rate: int


def start_round(config: FeedbackConfig, versions, base: Path, clock, stop, dist) -> Round:
    """The round's folder (made by the main process; every process learns it), log, budget, device."""
    from finetune.training.budget import Budget, safety_margin_s
    from finetune.reporting.logs import Metrics, setup_logging
    from finetune.training.session import pick_device, seed_everything

    budget = Budget(config.budget_s, clock, safety_s=safety_margin_s(config.budget_s))
    folder = None
    if dist.is_main:
        versions.ensure_base(base)
        folder = versions.new_round_dir()
    folder = dist.broadcast(folder)
    logger = setup_logging(folder, rank=dist.rank)
    logger.info(f"train_feedback {folder.name}: starting from {base}; budget {config.budget_s:.0f}s"
                + (f"; data parallel over {dist.world_size} processes ({dist.backend})" if dist.active else ""))
    seed_everything(config.seed)
    device = pick_device(config.device, dist.local_rank if dist.active else None)
    return Round(folder, logger, Metrics(folder / "metrics.jsonl", enabled=dist.is_main), budget, device, stop, dist)


def load_round_data(config: FeedbackConfig, round_: Round, base: Path) -> RoundData:
    """Corrections prepared like the corpus; held-out clips and a replay sample of the original."""
    from finetune.data.corpus import load_corpus, read_metadata
    from finetune.data.features import FeatureConfig, Features
    from finetune.vits.generator import hop_length, load_generator, ready_for_training
    from finetune.system.model_source import resolve_model

    prepared = prepare_corrections(config, round_.folder, base, round_.logger) if round_.dist.is_main else None
    corrections_dir, prepare_report = round_.dist.broadcast(prepared)  # the others wait for the main one's
    loaded = load_generator(resolve_model(str(base)), [], 16_000)
    model, tokenizer = ready_for_training(loaded.model), loaded.tokenizer
    hop, rate = hop_length(model.config), int(model.config.sampling_rate)
    features = Features(FeatureConfig(sample_rate=rate, hop_length=hop)).to(round_.device)
    corrections = load_corpus(corrections_dir, "metadata.csv", tokenizer, features, rate, 0, False, round_.device,
                              round_.stop)
    data_dir = Path(config.data_dir)
    if not (data_dir / "metadata_val.csv").is_file() or not read_metadata(data_dir / "metadata_val.csv"):
        raise FeedbackError(f"{data_dir}/metadata_val.csv is missing or empty: held-out original clips are needed to "
                            "check that nothing else got worse (prepare the corpus with --val_fraction > 0)")
    originals = load_corpus(data_dir, "metadata_val.csv", tokenizer, features, rate, config.val_samples, False,
                            round_.device, round_.stop)
    replay = _replay(data_dir, len(corrections.examples), config, tokenizer, features, rate, round_.logger)
    round_.logger.info(f"training data: {len(corrections.examples)} corrections + {len(replay)} replayed original "
                       f"clips; {len(originals.examples)} held-out originals scored")
    return RoundData(model, tokenizer, features, corrections, originals, replay, prepare_report, hop, rate)


def build_trainer(config: FeedbackConfig, round_: Round, data: RoundData, base: Path):
    """The base model's discriminator (or a new one, warmed up first) and the optimizer step."""
    from finetune.vits.generator import freeze
    from finetune.vits.losses import LossWeights
    from finetune.training.session import build_discriminator
    from finetune.training.step import StepSettings, TrainStep, resolve_precision

    frozen_parts = freeze(data.model, config.freeze)
    saved = base / "discriminator.pt"
    choice = build_discriminator(str(saved) if saved.is_file() else None, config.discriminator_width,
                                 [2, 3, 5, 7, 11], None, True, config.discriminator_warmup_steps)
    round_.logger.info(choice.description)
    data.model.to(round_.device)
    discriminator = choice.discriminator.to(round_.device)
    step = TrainStep(data.model, discriminator, data.features, LossWeights(),
                     StepSettings(learning_rate=config.learning_rate,
                                  discriminator_learning_rate=config.discriminator_learning_rate),
                     resolve_precision(round_.device, config.fp16, config.bf16), round_.device, round_.dist)
    return step, choice.warmup_steps, frozen_parts


def render_before(round_: Round, data: RoundData, base: Path) -> list:
    """listen/<id>_0_recording.wav and <id>_1_before.wav (the starting model) for each correction."""
    from finetune.data.audio import write_pcm16
    from finetune.vits.synthesis import Line, load_voice, speak_to_folder

    lines = [Line(e.item_id, "", e.token_ids) for e in data.corrections.examples]
    speak_to_folder(load_voice(base, round_.device), lines, round_.folder / "listen", suffix="_1_before")
    for example in data.corrections.examples:
        write_pcm16(round_.folder / "listen" / f"{example.item_id}_0_recording.wav", example.audio / 32768.0, data.rate)
    return lines


def fit_round(config: FeedbackConfig, round_: Round, data: RoundData, step, warmup_steps: int, frozen_parts):
    """The training loop of train_vits.py on corrections + replay, judged on corrections and originals."""
    from finetune.training.checkpoint import TrainingState
    from finetune.reporting.evaluation import Evaluator
    from finetune.training.feedback import FeedbackEvaluator
    from finetune.vits.generator import train_mode
    from finetune.training.loop import LoopConfig, RunPaths, TrainingLoop, run_with_signals
    from finetune.reporting.measures import TimingRule
    from finetune.data.sampler import BucketSampler
    from finetune.training.session import eval_batch_size, tokenizer_files

    corrections = data.corrections.examples
    common = dict(seed=config.seed, batch_size=eval_batch_size(round_.device), rule=TimingRule(config.max_length_ratio))
    evaluator = FeedbackEvaluator(
        Evaluator(corrections, data.features, round_.device, data.rate, round_.folder / "samples",
                  [(e.item_id, e.token_ids) for e in corrections[:5]], **common),
        Evaluator(data.originals.examples, data.features, round_.device, data.rate, None, [], **common),
        config.max_regression)
    examples = corrections + data.replay
    resolved = config_to_dict(config)
    train_mode(data.model, frozen_parts)
    loop = TrainingLoop(
        model=data.model, tokenizer=data.tokenizer, discriminator=step.discriminator, step=step, examples=examples,
        evaluator=evaluator, budget=round_.budget, state=TrainingState(),
        sampler=BucketSampler([e.frame_count(data.hop) for e in examples], config.batch_size, config.seed,
                              round_.dist.rank, round_.dist.world_size), dist=round_.dist,
        config=LoopConfig(batch_size=config.batch_size, accumulation=config.gradient_accumulation_steps,
                          learning_rate=config.learning_rate,
                          discriminator_learning_rate=config.discriminator_learning_rate,
                          lr_floor_ratio=config.lr_floor_ratio, warmup_steps=config.warmup_steps,
                          benchmark_samples=config.benchmark_samples, eval_every=config.val_every,
                          max_epochs=config.max_epochs, early_stopping_patience=0, keep_checkpoints=1,
                          checkpoint_every_s=1e9, log_every_s=config.log_every_seconds,
                          discriminator_warmup_steps=warmup_steps, num_workers=0, seed=config.seed,
                          reserve_after_s=_after_reserve(len(corrections)), checkpoints=False),
        paths=RunPaths(run_dir=round_.folder / "checkpoints", output_dir=round_.folder / "final_model"),
        logger=round_.logger, run_log=_run_log(round_, data), device=round_.device, hop=data.hop, frozen_parts=frozen_parts,
        checkpoint_extra={"config": resolved, "model_config": data.model.config.to_dict(),
                          "tokenizer_files": tokenizer_files(data.tokenizer), "data_fingerprint": ""},
        stop=round_.stop, export_extra=lambda: {"feedback_args.json": resolved})
    loop.paths.run_dir.mkdir(parents=True, exist_ok=True)
    return loop, evaluator, run_with_signals(loop)


def conclude_round(config: FeedbackConfig, round_: Round, data: RoundData, versions, base: Path, loop, evaluator,
                   result, lines) -> int:
    """Decide, render the candidate, make a version (or not), write the report."""
    from finetune.training.feedback import decide, summary_text
    from finetune.vits.synthesis import load_voice, speak_to_folder

    best_dir = loop.paths.best_dir
    best = json.loads((best_dir / "eval.json").read_text(encoding="utf-8")) if (best_dir / "eval.json").is_file() else None
    decision = decide(evaluator.baseline, best, result.last_eval, config.max_regression)
    candidate = best_dir if best and best["step"] > 0 else loop.paths.output_dir
    if not (candidate / "config.json").is_file():
        raise FeedbackError(f"the round's model could not be written to {candidate} (see {round_.folder}/train.log); "
                            "the current voice is unchanged")
    listen = round_.folder / "listen"
    speak_to_folder(load_voice(candidate, round_.device), lines, listen, suffix="_2_after")
    counts = {"corrections": len(data.corrections.examples), "originals": len(data.originals.examples),
              "replay": len(data.replay)}
    record = {"base_model": str(base), "accepted": decision.accepted, "reason": decision.reason,
              "before": decision.before, "after": decision.after, "candidate_step": decision.candidate_step,
              "counts": counts, "max_regression_pct": config.max_regression, "steps": result.state.step,
              "stop_reason": result.stop_reason, "time_used_s": round(round_.budget.used_s(), 1)}
    version = versions.accept(candidate, round_.folder.name, record) if decision.accepted else None
    if not decision.accepted:
        versions.reject(round_.folder.name, record)
    report = {"round": round_.folder.name, "version": version, **record, "listen_dir": str(listen),
              "corrections_dropped": data.prepare_report["dropped"], "per_clip_before": evaluator.baseline.per_clip_dict(),
              "per_clip_after": best["per_clip"] if best else None}
    write_text_atomic(round_.folder / "feedback_report.json", json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    default_voices = FeedbackConfig.output_dir
    undo = "" if config.output_dir == default_voices else f"--output_dir {shlex.quote(config.output_dir)}"
    text = summary_text(round_.folder.name, decision, version, counts, config.max_regression, listen,
                        data.prepare_report["dropped"], undo)
    write_text_atomic(round_.folder / "feedback_report.txt", text)
    round_.metrics.write("feedback", **{k: v for k, v in report.items() if not k.startswith("per_clip")})
    round_.logger.info("\n" + text.rstrip())
    return 0


def main(argv: list[str] | None = None, clock=None) -> int:
    from finetune.training.budget import Clock
    from finetune.training.distributed import launched_by_torchrun, from_environment
    from finetune.training.feedback import Versions
    from finetune.system.interrupt import StopRequest, StopRequested

    config = parse_config(FeedbackConfig, argv, __doc__)
    versions = Versions(Path(config.output_dir))
    if (config.rollback or config.review) and launched_by_torchrun():
        raise FeedbackError("--rollback and --review run as one process: start them without torchrun")
    main_process = int(__import__("os").environ.get("RANK", "0")) == 0
    for note in versions.repair() if main_process else []:
        print(f"{versions.root}: {note} (left by a round that was killed)", file=sys.stderr)

    # Actions that do not train: roll back, or speak sentences for review.
    if config.rollback:
        previous, now = versions.rollback(config.rollback)
        print(f"rolled back: current voice is now {now} (was {previous}); {versions.current} holds it")
        return 0
    base = base_model_dir(config, versions)
    if config.review:
        return review(config, base)
    stop = StopRequest()
    dist = from_environment(config.device)
    with stop.installed():  # from the start: Ctrl-C while preparing or loading stops within seconds too
        try:
            return feedback_round(config, versions, base, clock or Clock(), stop, dist)
        except StopRequested as request:
            print(f"interrupted ({request.signal_name}): the current voice is unchanged; run again to start a new "
                  "round", file=sys.stderr)
            return stop.exit_status
        finally:
            dist.close()


def feedback_round(config: FeedbackConfig, versions, base: Path, clock, stop, dist) -> int:
    """A round: data, model, "before" renders, the training loop, then the decision and the report. In a
    data-parallel launch every process trains; the main one renders, decides and makes the version."""
    round_ = start_round(config, versions, base, clock, stop, dist)
    data = load_round_data(config, round_, base)
    step, warmup_steps, frozen_parts = build_trainer(config, round_, data, base)
    lines = render_before(round_, data, base) if dist.is_main else []
    loop, evaluator, result = fit_round(config, round_, data, step, warmup_steps, frozen_parts)
    loop.run_log.end(loop.summary(result.stop_reason))
    if result.stop_reason == "interrupted":
        round_.logger.info(f"interrupted: the current voice is unchanged; {round_.folder} keeps what was done. "
                           "Run again to start a new round")
        return stop.exit_status
    if not dist.is_main:
        return 0
    return conclude_round(config, round_, data, versions, base, loop, evaluator, result, lines)


def _run_log(round_: Round, data: RoundData):
    """The round's log: train.log, metrics.jsonl, the step profile and report.html in the round folder."""
    from finetune.system.profile import StepProfile
    from finetune.reporting.run_log import RunLog
    from finetune.reporting.tracking import Tracker

    return RunLog(round_.logger, round_.metrics, Tracker(), StepProfile(round_.device), round_.folder, round_.device,
                  round_.dist.is_main, report_title=f"train_feedback: {round_.folder.name}", sample_rate=data.rate,
                  best_dir=round_.folder / "checkpoints" / "best_model")


def _after_reserve(corrections: int) -> float:
    """Seconds kept for after the loop: rendering each correction once more and copying a version."""
    return 5.0 + 0.5 * corrections


def _replay(data_dir: Path, corrections: int, config: FeedbackConfig, tokenizer, features, rate, logger):
    from finetune.data.corpus import load_examples, read_metadata
    from finetune.training.feedback import replay_sample

    if config.replay_ratio == 0:
        logger.warning("warning: --replay_ratio 0: training on the corrections alone risks forgetting the rest")
        return []
    if not (data_dir / "metadata.csv").is_file():
        raise FeedbackError(f"{data_dir}/metadata.csv not found: the original corpus is needed for replay "
                            "(--data_dir), or pass --replay_ratio 0")
    rows = read_metadata(data_dir / "metadata.csv")
    chosen = set(replay_sample([i for i, _ in rows], corrections, config.replay_ratio, config.seed))
    examples, _ = load_examples(data_dir, "metadata.csv", tokenizer, features.config.hop_length, rate, only_ids=chosen)
    return examples


if __name__ == "__main__":
    sys.exit(run_script(main, extra_errors=(FeedbackError,)))
