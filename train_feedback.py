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
import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from finetune.cli import config_to_dict, flag, lazy_modules, parse_config, run_script
from finetune.settings import TrainingFlags
from finetune.system.run_lock import hold_for_launch

# The parts below need torch and transformers: they load on first use, once the flags are parsed (--help stays fast).
(atomic, audio, budgeting, checkpoints, corpus, distributed, evaluation, feedback, generator, interrupt, logs, loop,
 measures, model_card, model_source, prepare, recipe, sampler, session, sources, synthesis, text) = lazy_modules(
    "finetune.system.atomic", "finetune.data.audio", "finetune.training.budget", "finetune.training.checkpoint",
    "finetune.data.corpus", "finetune.training.distributed", "finetune.reporting.evaluation",
    "finetune.training.feedback", "finetune.vits.generator", "finetune.system.interrupt", "finetune.reporting.logs",
    "finetune.training.loop", "finetune.reporting.measures", "finetune.reporting.model_card",
    "finetune.system.model_source", "finetune.data.prepare",
    "finetune.recipe", "finetune.data.sampler", "finetune.training.session", "finetune.data.sources",
    "finetune.vits.synthesis", "finetune.data.text")


@dataclass
class FeedbackConfig(TrainingFlags):
    """train_feedback.py's flags: the shared training flags (finetune/settings.py; some with a round's defaults,
    declared again below) and these."""

    feedback_dir: str | None = flag(None, "corrections: pairs <name>.wav + <name>.txt, or wavs/ + metadata.csv "
                                          "(id|text); any audio format and rate (default: training/feedback, else feedback)")
    base_model: str | None = flag(None, "model to start from (default: OUTPUT_DIR/current, else "
                                        "training/checkpoints/best_model); its discriminator.pt is used if present")
    data_dir: str = flag("training", "the original prepared corpus: replay clips and held-out clips come from it")
    output_dir: str = flag("training/voices", "versions folder: current/, v000/, v001/ ..., history.json, rounds/")
    replay_ratio: float = flag(2.0, "original clips replayed per correction (0: none, which risks forgetting)")
    target_minutes: float = flag(15.0, "time budget of the round, everything included (minutes)")
    target_hours: float = flag(0.0, "time budget in hours instead (0: use --target_minutes)")
    max_regression: float = flag(2.0, "accept only if the held-out originals' MCD rises by at most this (percent)")
    min_seconds: float = flag(0.5, "drop corrections shorter than this after trimming (seconds)")
    max_seconds: float = flag(15.0, "drop corrections longer than this after trimming (seconds)")
    rollback: str | None = flag(None, "instead of training: make a version current again ('previous' or e.g. v001)")
    review: str | None = flag(None, "instead of training: speak this file's sentences with the current voice")
    review_dir: str = flag("review", "output folder of --review")
    # Shared flags with a round's defaults: a short, gentle fine-tune.
    learning_rate: float = flag(1e-5, "peak learning rate (smaller than training's 2e-5)")
    gradient_accumulation_steps: int = flag(1, "micro-batches per optimizer step")
    warmup_steps: int = flag(50, "linear warmup in optimizer steps")
    benchmark_samples: int = flag(64, "clips of timed training steps before planning")
    val_samples: int = flag(16, "held-out original clips scored before, during and after")
    max_epochs: int = flag(0, "stop after N passes over the mixed data (0: no limit)")
    discriminator_warmup_steps: int = flag(50, "steps a new discriminator trains alone, when the base model has none")
    max_length_ratio: float = flag(1.25, "timing rule: a model whose median length ratio (synthesised / recorded) on "
                                          "the corrections or the originals lies outside [1/X, X] is never accepted")

    def problems(self) -> list[str]:
        problems = super().problems()
        if self.target_hours <= 0 and self.target_minutes <= 0:
            problems.append("--target_minutes (or --target_hours) must be positive")
        for name in ("replay_ratio", "max_regression", "target_hours"):
            if getattr(self, name) < 0:
                problems.append(f"--{name} {getattr(self, name)}: must be 0 or more")
        if self.rollback and self.review:
            problems.append("--rollback and --review are separate actions: give one")
        if self.review and not Path(self.review).is_file():
            problems.append(f"--review {self.review}: no such file")
        return problems

    @property
    def budget_s(self) -> float:
        return 3600 * self.target_hours if self.target_hours > 0 else 60 * self.target_minutes


def main(argv: list[str] | None = None, clock=None) -> int:
    config = parse_config(FeedbackConfig, argv, __doc__)
    lock = hold_for_launch(config.output_dir, "--output_dir")  # one round (or rollback) per voices folder at a time
    try:
        return act(config, clock)
    finally:
        if lock is not None:
            lock.release()


def act(config: "FeedbackConfig", clock) -> int:
    """Roll back, review, or run a round, in the voices folder this process holds."""
    versions = feedback.Versions(Path(config.output_dir))
    if (config.rollback or config.review) and distributed.launched_by_torchrun():
        raise feedback.FeedbackError("--rollback and --review run as one process: start them without torchrun")
    main_process = int(os.environ.get("RANK", "0")) == 0
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
    stop = interrupt.StopRequest()
    dist = distributed.from_environment(config.device)
    with stop.installed():  # from the start: Ctrl-C while preparing or loading stops within seconds too
        finished = False
        try:
            code = feedback_round(config, versions, base, clock or budgeting.Clock(), stop, dist)
            finished = True
            return code
        except interrupt.StopRequested as request:
            print(f"interrupted ({request.signal_name}): the current voice is unchanged; run again to start a new "
                  "round", file=sys.stderr)
            return stop.exit_status
        finally:
            dist.close(finished)


def feedback_round(config: FeedbackConfig, versions, base: Path, clock, stop, dist) -> int:
    """A round: data, model, "before" renders, the training loop, then the decision and the report. In a
    data-parallel launch every process trains; the main one renders, decides and makes the version."""
    round_ = start_round(config, versions, base, clock, stop, dist)
    data = load_round_data(config, round_, base)
    step, warmup_steps, frozen_parts = build_trainer(config, round_, data, base)
    lines = render_before(round_, data, base) if dist.is_main else []
    trainer, evaluator, result = fit_round(config, round_, data, step, warmup_steps, frozen_parts, base)
    trainer.run_log.end(trainer.summary(result.stop_reason))
    if result.stop_reason == "interrupted":
        round_.logger.info(f"interrupted: the current voice is unchanged; {round_.folder} keeps what was done. "
                           "Run again to start a new round")
        return stop.exit_status
    if not dist.is_main:
        return 0
    return conclude_round(config, round_, data, versions, base, trainer, evaluator, result, lines)


def base_model_dir(config: FeedbackConfig, versions) -> Path:
    if config.base_model:
        path = Path(config.base_model)
    elif versions.current.is_dir():
        path = versions.current
    else:
        path = Path("training/checkpoints/best_model")
    missing = [name for name in ("config.json", "vocab.json") if not (path / name).is_file()]
    if missing:
        raise feedback.FeedbackError(f"no model to start from at {path} (no {' or '.join(missing)}): train one first "
                            "(train_vits.py), or pass --base_model DIR with a model folder train_vits.py wrote")
    return path


def review(config: FeedbackConfig, base: Path) -> int:
    voice = synthesis.load_voice(base, session.pick_device(config.device))
    lines = synthesis.prepare_lines(voice, synthesis.numbered(synthesis.read_sentences(config.review)))
    out = Path(config.review_dir)
    sayable = synthesis.speak_for_review(voice, lines, out)
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
    raise feedback.FeedbackError(f"no corrections: record them into {FEEDBACK_DIRS[0]}/ as pairs <name>.wav + <name>.txt "
                        "(or wavs/ + metadata.csv), or pass --feedback_dir")


def corrections_source(folder: Path):
    """The corrections in either layout: LJSpeech (metadata.csv + wavs/) or audio + .txt pairs."""
    try:
        if (folder / "metadata.csv").is_file() or not folder.is_dir():
            source = sources.ljspeech_source(folder, flag="--feedback_dir")
        elif sources.looks_like_pairs(folder):
            source = sources.pairs_source(folder, flag="--feedback_dir")
        else:
            raise feedback.FeedbackError(f"{folder} holds no corrections: expected pairs <name>.wav + <name>.txt, or wavs/ + "
                                "metadata.csv (see train_feedback.py --review)")
    except sources.SourceError as error:
        raise feedback.FeedbackError(str(error)) from error
    if source.count == 0:
        raise feedback.FeedbackError(f"{folder}/metadata.csv lists no corrections: record some first "
                            "(see train_feedback.py --review)")
    return source


def prepare_corrections(config: FeedbackConfig, round_dir: Path, base: Path, logger) -> tuple[Path, dict]:
    """The feedback folder prepared like the corpus (the base model's vocabulary and rate), into the round."""
    folder = feedback_folder(config)
    source = corrections_source(folder)
    model = model_source.resolve_model(str(base))
    settings = prepare.ClipSettings(sample_rate=model_source.model_sample_rate(model), trim_db=40.0, trim_margin_s=0.05, peak=0.95,
                            min_seconds=config.min_seconds, max_seconds=config.max_seconds)
    out = round_dir / "corrections"
    preparer = prepare.Preparer(out, text.TextNormalizer(model_source.model_vocabulary(model)), settings, num_workers=1)
    report = prepare.write_outputs(out, preparer.run(source), 0.0, {"source": source.description})
    logger.info(f"corrections: {report['counts']['kept']} of {report['counts']['items']} usable"
                + "".join(f"; {d['id']} dropped: {d['reason']} ({d['detail']})" for d in report["dropped"]))
    if not report["counts"]["kept"]:
        raise feedback.FeedbackError(f"none of the corrections in {folder} can be used; reasons are in "
                            f"{out}/prepare_report.json")
    return out, report


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


def start_round(config: FeedbackConfig, versions, base: Path, clock, stop, dist) -> recipe.Run:
    """The round's folder (made by the main process; every process learns it), log, budget, device."""
    budget = budgeting.Budget(config.budget_s, clock, safety_s=budgeting.safety_margin_s(config.budget_s))
    folder = None
    if dist.is_main:
        versions.ensure_base(base)
        folder = versions.new_round_dir()
    folder = dist.broadcast(folder)
    logger = logs.setup_logging(folder, rank=dist.rank)
    logger.info(f"train_feedback {folder.name}: starting from {base}; budget {config.budget_s:.0f}s"
                + (f"; data parallel over {dist.world_size} processes ({dist.backend})" if dist.active else ""))
    session.seed_everything(config.seed)
    return recipe.open_run(folder, logger, config, budget, dist, stop)


def load_round_data(config: FeedbackConfig, round_: recipe.Run, base: Path) -> RoundData:
    """Corrections prepared like the corpus; held-out clips and a replay sample of the original."""
    prepared = prepare_corrections(config, round_.folder, base, round_.logger) if round_.dist.is_main else None
    corrections_dir, prepare_report = round_.dist.broadcast(prepared)  # the others wait for the main one's
    loaded = generator.load_generator(model_source.resolve_model(str(base)), [], 16_000)
    round_.stop.check()  # loading a model takes seconds: a stop asked for meanwhile is honoured here
    model, tokenizer = generator.ready_for_training(loaded.model), loaded.tokenizer
    features = recipe.features_for(model, round_.device)
    hop, rate = features.config.hop_length, features.config.sample_rate
    corrections = corpus.load_corpus(corrections_dir, "metadata.csv", tokenizer, features, rate, 0, False, round_.device,
                                     round_.stop)
    data_dir = Path(config.data_dir)
    if not (data_dir / "metadata_val.csv").is_file() or not corpus.read_metadata(data_dir / "metadata_val.csv"):
        raise feedback.FeedbackError(f"{data_dir}/metadata_val.csv is missing or empty: held-out original clips are needed to "
                            "check that nothing else got worse (prepare the corpus with --val_fraction > 0)")
    originals = corpus.load_corpus(data_dir, "metadata_val.csv", tokenizer, features, rate, config.val_samples, False,
                                   round_.device, round_.stop)
    replay = replay_clips(data_dir, len(corrections.examples), config, tokenizer, features, rate, round_.logger)
    round_.logger.info(f"training data: {len(corrections.examples)} corrections + {len(replay)} replayed original "
                       f"clips; {len(originals.examples)} held-out originals scored")
    return RoundData(model, tokenizer, features, corrections, originals, replay, prepare_report, hop, rate)


def build_trainer(config: FeedbackConfig, round_: recipe.Run, data: RoundData, base: Path):
    """The base model's discriminator (or a new one, warmed up first) and the optimizer step."""
    frozen_parts = generator.freeze(data.model, config.freeze)
    saved = base / "discriminator.pt"
    choice = session.build_discriminator(str(saved) if saved.is_file() else None, config.discriminator_width,
                                         [2, 3, 5, 7, 11], None, True, config.discriminator_warmup_steps)
    round_.logger.info(choice.description)
    data.model.to(round_.device)
    discriminator = choice.discriminator.to(round_.device)
    round_.stop.check()
    return recipe.train_step(config, round_, data.model, discriminator, data.features), choice.warmup_steps, frozen_parts


def render_before(round_: recipe.Run, data: RoundData, base: Path) -> list:
    """listen/<id>_0_recording.wav and <id>_1_before.wav (the starting model) for each correction."""
    lines = [synthesis.Line(e.item_id, "", e.token_ids) for e in data.corrections.examples]
    synthesis.speak_to_folder(synthesis.load_voice(base, round_.device), lines, round_.folder / "listen",
                              suffix="_1_before")
    for example in data.corrections.examples:
        audio.write_pcm16(round_.folder / "listen" / f"{example.item_id}_0_recording.wav", example.audio / 32768.0,
                          data.rate)
    return lines


def fit_round(config: FeedbackConfig, round_: recipe.Run, data: RoundData, step, warmup_steps: int, frozen_parts,
              base: Path):
    """The training loop of train_vits.py on corrections + replay, judged on corrections and originals."""
    corrections = data.corrections.examples
    common = dict(seed=config.seed, batch_size=session.eval_batch_size(round_.device),
                  rule=measures.TimingRule(config.max_length_ratio))
    evaluator = feedback.FeedbackEvaluator(
        evaluation.Evaluator(corrections, data.features, round_.device, data.rate, round_.folder / "samples",
                             [(e.item_id, e.token_ids) for e in corrections[:5]], **common),
        evaluation.Evaluator(data.originals.examples, data.features, round_.device, data.rate, None, [], **common),
        config.max_regression)
    examples = corrections + data.replay
    resolved = config_to_dict(config)
    generator.train_mode(data.model, frozen_parts)
    # A round is short and never resumed: no checkpoints, no early stopping, no worker processes.
    trainer = recipe.training_loop(
        config, round_, loop_settings=dict(discriminator_warmup_steps=warmup_steps, num_workers=0, checkpoints=False,
                                           reserve_after_s=after_loop_reserve_s(len(corrections))),
        model=data.model, tokenizer=data.tokenizer, discriminator=step.discriminator, step=step, examples=examples,
        evaluator=evaluator, state=checkpoints.TrainingState(),
        sampler=sampler.BucketSampler([e.frame_count(data.hop) for e in examples], config.batch_size, config.seed,
                                      round_.dist.rank, round_.dist.world_size),
        paths=loop.RunPaths(run_dir=round_.folder / "checkpoints", output_dir=round_.folder / "final_model"),
        run_log=recipe.run_log(config, round_, f"train_feedback: {round_.folder.name}", data.rate,
                               best_dir=round_.folder / "checkpoints" / "best_model"),
        hop=data.hop, frozen_parts=frozen_parts,
        checkpoint_extra={"config": resolved, "model_config": data.model.config.to_dict(),
                          "tokenizer_files": session.tokenizer_files(data.tokenizer), "data_fingerprint": ""},
        export_extra=lambda: {"feedback_args.json": resolved},
        card=model_card.card_facts(str(base), sum(len(e.audio) for e in examples) / data.rate / 3600, len(examples),
                                   "train_feedback.py"))
    trainer.paths.run_dir.mkdir(parents=True, exist_ok=True)
    return trainer, evaluator, loop.run_with_signals(trainer)


def conclude_round(config: FeedbackConfig, round_: recipe.Run, data: RoundData, versions, base: Path, trainer, evaluator,
                   result, lines) -> int:
    """Decide, render the candidate, make a version (or not), write the report."""
    best_dir = trainer.paths.best_dir
    best = json.loads((best_dir / "eval.json").read_text(encoding="utf-8")) if (best_dir / "eval.json").is_file() else None
    decision = feedback.decide(evaluator.baseline, best, result.last_eval, config.max_regression)
    candidate = best_dir if best and best["step"] > 0 else trainer.paths.last_dir
    if not (candidate / "config.json").is_file():
        raise feedback.FeedbackError(f"the round's model could not be written to {candidate} (see {round_.folder}/train.log); "
                            "the current voice is unchanged")
    listen = round_.folder / "listen"
    synthesis.speak_to_folder(synthesis.load_voice(candidate, round_.device), lines, listen, suffix="_2_after")
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
    atomic.write_text_atomic(round_.folder / "feedback_report.json", json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    default_voices = FeedbackConfig.output_dir
    undo = "" if config.output_dir == default_voices else f"--output_dir {shlex.quote(config.output_dir)}"
    text = feedback.summary_text(round_.folder.name, decision, version, counts, config.max_regression, listen,
                        data.prepare_report["dropped"], undo)
    atomic.write_text_atomic(round_.folder / "feedback_report.txt", text)
    round_.metrics.write("feedback", **{k: v for k, v in report.items() if not k.startswith("per_clip")})
    round_.logger.info("\n" + text.rstrip())
    return 0


def after_loop_reserve_s(corrections: int) -> float:
    """Seconds kept for after the loop: rendering each correction once more and copying a version."""
    return 5.0 + 0.5 * corrections


def replay_clips(data_dir: Path, corrections: int, config: FeedbackConfig, tokenizer, features, rate, logger):
    if config.replay_ratio == 0:
        logger.warning("warning: --replay_ratio 0: training on the corrections alone risks forgetting the rest")
        return []
    if not (data_dir / "metadata.csv").is_file():
        raise feedback.FeedbackError(f"{data_dir}/metadata.csv not found: the original corpus is needed for replay "
                            "(--data_dir), or pass --replay_ratio 0")
    rows = corpus.read_metadata(data_dir / "metadata.csv")
    chosen = set(feedback.replay_sample([i for i, _ in rows], corrections, config.replay_ratio, config.seed))
    examples, _ = corpus.load_examples(data_dir, "metadata.csv", tokenizer, features.config.hop_length, rate, only_ids=chosen)
    return examples


if __name__ == "__main__":
    sys.exit(run_script(main))
