"""train_vits.py's steps, in the order the script calls them: the run folder and what it resumes (open_run),
the model and the corpus's speakers (build_model), the corpus in RAM (load_data), the loop with its
discriminator, evaluation, checkpoints and trackers (build_loop), the last checks (ready_to_train), the fit
(fit) and the closing lines (report_end). Each takes the script's TrainConfig and the Run it works in.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from finetune.cli import config_to_dict, resume_rules
from finetune.data import corpus, sampler, speakers
from finetune.data.features import Features
from finetune.data.metadata import read_metadata, read_rows, texts_of
from finetune.recipes import shared
from finetune.reporting import evaluation, logs, measures, model_card, naturalness, tracking
from finetune.system import atomic, hub_upload
from finetune.system.disk import OPTIONAL
from finetune.system.errors import ConfigError
from finetune.system.model_source import parse_scratch
from finetune.training import (
    assembly,
    checkpoint_file,
    context,
    distributed,
    loop,
    machinery,
    model_folders,
    run_settings,
)
from finetune.training.budget import Budget, safety_margin_s
from finetune.vits import generator, speaker_layers


def open_run(config, given: set[str], clock, stop) -> tuple[context.Run, object]:
    """Run folder and log (leftovers of a killed process cleared); the checkpoint to resume (never silently
    mixing two runs; an unreadable newest one skipped) and the settings it continues with; budget; device."""
    dist = distributed.from_environment(config.device)
    folder = Path(config.checkpoint_dir)
    folder.mkdir(parents=True, exist_ok=True)
    lock = distributed.lock_run_folder(folder, dist)  # main() holds it already; under torchrun rank 0 does
    logger = logs.setup_logging(folder, rank=dist.rank)
    if lock is not None and lock.took_over():
        logger.info(lock.took_over())
    tidy(folder, None, dist, logger)
    resume_path, payload = checkpoint_file.resolve_resume(config.resume, folder, warn=logger.warning)
    if resume_path is None and checkpoint_file.list_checkpoints(folder):
        raise ConfigError(
            [
                f"{folder} holds checkpoints of an earlier run: continue it with --resume auto, or start "
                "a new run with another --checkpoint_dir (or delete those checkpoints)"
            ]
        )
    if payload:
        may_change, from_command_line = resume_rules(type(config))  # each flag's on_resume
        settings, changed = checkpoint_file.resumed_settings(
            payload["config"], config_to_dict(config), given, may_change, from_command_line
        )
        config = type(config)(**settings)
        logger.info(
            "resuming with the checkpoint's settings"
            + (
                "; changed on this command line: " + ", ".join(f"--{k} {settings[k]}" for k in changed)
                if changed
                else ""
            )
        )
    # The output folder (the resumed run's own) is this run's too: another run publishing there is refused.
    output = Path(config.output_dir)
    output_lock = distributed.lock_run_folder(output, dist, output=True)
    tidy(output.parent, output.name, dist, logger)
    used_before = payload["state"]["time_used_s"] if payload else 0.0
    target_s = config.target_hours * 3600
    budget = Budget(target_s, clock, used_before_s=used_before, safety_s=safety_margin_s(target_s))
    logger.info(
        f"train_vits: budget {config.target_hours} h ({target_s:.0f}s), {budget.used_s():.1f}s used "
        f"({used_before:.1f}s by earlier processes of this run)" + (f"; resuming {resume_path}" if payload else "")
    )
    run = shared.open_run(folder, logger, config, budget, dist, stop, payload, resume_path)
    run.held = [output_lock] if output_lock is not None else []
    if dist.active:
        logger.info(
            f"data parallel: {dist.world_size} processes ({dist.backend}); this is rank {dist.rank} on {run.device}"
        )
    return run, config


def tidy(folder: Path, only: str | None, dist, logger) -> None:
    """What a killed process left half-saved in `folder` (for `only` in it, if given), put right by the main
    process; the others wait until it has."""
    if dist.is_main:
        for note in atomic.recover(folder, only=only):
            logger.info(f"{note} (left by a process that was killed while saving)")
    dist.any(False)


@dataclass
class Model:
    loaded: generator.LoadedGenerator  # the generator, its tokenizer, where it came from
    frozen_parts: list[str]
    features: Features  # for its rate and hop
    speakers: speakers.Speakers | None  # of a multi-speaker corpus, else None


def build_model(config, run: context.Run) -> Model:
    """The generator (pretrained, scratch, or from the checkpoint), its tokenizer, and the features."""
    assembly.seed_everything(config.seed)  # before any weights are made (a resume restores its own state later)
    texts = assembly.corpus_texts(Path(config.data_dir))
    loaded = assembly.build_generator(config.model_name, run.payload, texts)
    run.stop.check()  # loading a model takes seconds: a stop asked for meanwhile is honoured before the data
    assembly.check_vocabulary(loaded.tokenizer, texts)
    saved_names = getattr(loaded.model.config, "speaker_names", None) if run.payload else None
    mode, why = speakers.resolve_mode(config.speakers, loaded.pretrained, resumed_conditioned=bool(saved_names))
    found = speakers.find_speakers(
        Path(config.data_dir), config.target_speaker, mode, int(loaded.model.config.sampling_rate), saved_names
    )
    if found is not None:
        run.logger.info(found.describe() + (f" ({why})" if why else ""))
    if found is not None and found.conditioned and not run.payload:  # a resumed run's model has them already
        loaded.model = speaker_layers.add_speakers(loaded.model, len(found.names), seed=config.seed)
        loaded.model.config.speaker_names = list(found.names)
    elif found is not None:  # target_only or pooled: a plain model that names the voice it speaks as (for feedback)
        loaded.model.config.speaker = found.target
    # Every model folder the run writes says the rate it was trained at: a round of corrections fits its own to it.
    loaded.model.config.trained_learning_rate = config.learning_rate
    frozen_parts = generator.freeze(loaded.model, config.freeze)
    from_scratch = parse_scratch(config.model_name) is not None  # a resumed scratch run's too
    dropout_off = config.dropout == "off" or (config.dropout == "auto" and not from_scratch)
    if dropout_off:
        generator.without_dropout(loaded.model)
    features = shared.features_for(loaded.model, run.device)
    run.logger.info(
        f"generator: {loaded.description}; device {run.device}, {run.precision.name}"
        + (f"; frozen: {', '.join(frozen_parts)}" if frozen_parts else "")
        + (f"; dropout {'off' if dropout_off else 'on'}" + (" (--dropout auto)" if config.dropout == "auto" else ""))
    )
    return Model(loaded, frozen_parts, features, found)


@dataclass
class Data:
    train: corpus.Corpus
    val: corpus.Corpus | None  # held-out clips (metadata_val.csv), if any
    sampler: sampler.BucketSampler  # over the training clips
    precomputed: bool  # spectrograms in RAM (else computed per batch)


def load_data(config, run: context.Run, model: Model) -> Data:
    """Training and held-out clips into RAM (after the memory check) and the bucketed sampler."""
    data_dir, features, stop = Path(config.data_dir), model.features, run.stop
    hop, rate, tokenizer = features.config.hop_length, features.config.sample_rate, model.loaded.tokenizer
    rows = read_metadata(data_dir / "metadata.csv")[: config.max_samples or None]
    wanted = config.precompute_mels if config.precompute_mels is not None else run.device.type == "cpu"
    estimate = corpus.estimate_memory(data_dir, rows, features.config.linear_bins, features.config.n_mels, hop)
    precompute, memory_note = corpus.decide_precompute(estimate, wanted)
    run.logger.info(memory_note)
    indices = model.speakers.indices() if model.speakers else None  # the speakers trained on, and as whom
    judged = {model.speakers.target: indices[model.speakers.target]} if model.speakers else None  # the target's clips
    train = corpus.load_corpus(
        data_dir,
        "metadata.csv",
        tokenizer,
        features,
        rate,
        config.max_samples,
        precompute,
        run.device,
        stop,
        speakers=indices,
    )
    val = (
        corpus.load_corpus(
            data_dir, "metadata_val.csv", tokenizer, features, rate, 0, False, run.device, stop, speakers=judged
        )
        if (data_dir / "metadata_val.csv").is_file()
        else None
    )
    if not train.examples:
        raise ConfigError([f"no usable training clips in {data_dir}/metadata.csv ({dict(train.report.skipped)})"])
    if model.speakers and model.speakers.conditioned and config.target_share > 0:
        train.examples, note = speakers.weighted_for_target(train.examples, config.target_share)
        run.logger.info(note)
    for name, part in (("metadata.csv", train), ("metadata_val.csv", val)):
        if part is not None and part.report.skipped:  # each clip left out named, with its reason
            run.logger.warning("warning: " + part.report.describe(f"{data_dir / name}"))
    buckets = sampler.BucketSampler(
        train.lengths(hop),
        config.batch_size,
        config.seed,
        run.dist.rank,
        run.dist.world_size,
        config.length_pool_batches,
    )
    padding = sampler.padding_fraction(buckets.epoch_batches(0), train.lengths(hop))
    skipped = dict(train.report.skipped)
    run.logger.info(
        f"data: {len(train.examples)} clips, {train.hours(rate):.2f} h, loaded in {train.load_s:.1f}s, "
        f"{train.ram_bytes / 2**30:.2f} GiB in RAM; {buckets.batches_per_epoch} batches an epoch, padding "
        f"{100 * padding:.1f}% of frames" + (f"; skipped {skipped}" if skipped else "")
    )
    run.metrics.write(
        "data",
        clips=len(train.examples),
        hours=round(train.hours(rate), 4),
        load_s=round(train.load_s, 3),
        ram_bytes=train.ram_bytes,
        precomputed=precompute,
        padding_fraction=round(padding, 4),
        skipped=skipped,
        skipped_clips=train.report.examples_skipped,
        val_skipped=dict(val.report.skipped) if val else {},
        val_skipped_clips=val.report.examples_skipped if val else [],
    )
    return Data(train, val, buckets, precompute)


OTHER_SPEAKERS, OTHER_CLIPS = 3, 3  # a conditioned run reports the 3 speakers with most hours, 3 held-out clips each


def other_speakers(config, run: context.Run, model: Model) -> dict:
    """Evaluators of a few other speakers of a conditioned run, each in its own voice on a few of its held-out
    clips: what the crowd sounds like beside the target (reported, never judged on)."""
    data_dir = Path(config.data_dir)
    if not (model.speakers and model.speakers.conditioned) or not (data_dir / "metadata_val.csv").is_file():
        return {}
    held = {speaker for _, speaker, _ in read_rows(data_dir / "metadata_val.csv")}
    chosen = [(name, index) for index, name in enumerate(model.speakers.names) if index and name in held]
    chosen = dict(chosen[:OTHER_SPEAKERS])  # the names come by hours: the first with held-out clips
    features = model.features
    clips = corpus.load_corpus(
        data_dir,
        "metadata_val.csv",
        model.loaded.tokenizer,
        features,
        features.config.sample_rate,
        0,
        False,
        run.device,
        run.stop,
        speakers=chosen,
    ).examples
    found = {}
    for name, index in chosen.items():
        mine = [e for e in clips if e.speaker == index][:OTHER_CLIPS]
        if mine:
            found[name] = evaluation.Evaluator(
                mine,
                features,
                run.device,
                features.config.sample_rate,
                seed=config.seed,
                batch_size=assembly.eval_batch_size(run.device),
                rule=measures.TimingRule(config.max_length_ratio),
                speaker=index,
            )
    return found


def build_loop(config, run: context.Run, model: Model, data: Data, step_callback):
    """What is particular to this recipe: its discriminator (the checkpoint's, a given one, or new), its
    held-out evaluation, its checkpoints and trackers, what its saves carry; shared.build_loop does the rest."""
    loaded, features = model.loaded, model.features
    choice = assembly.build_discriminator(
        config.discriminator,
        config.discriminator_width,
        config.discriminator_periods,
        config.discriminator_scales,
        run.payload,
        loaded.pretrained,
        config.discriminator_warmup_steps,
    )
    run.logger.info(choice.description)
    clips = assembly.evaluation_clips(data.val, data.train, config.val_samples, run.logger)
    evaluator = evaluation.Evaluator(
        clips,
        features,
        run.device,
        features.config.sample_rate,
        run.folder / "samples",
        assembly.test_sentences(config.test_sentences, loaded.tokenizer, run.logger),
        seed=config.seed,
        batch_size=assembly.eval_batch_size(run.device),
        rule=measures.TimingRule(config.max_length_ratio),
        naturalness=naturalness_for(config.naturalness, run.device, run.logger) if run.dist.is_main else None,
        speaker=speakers.TARGET_SPEAKER if model.speakers and model.speakers.conditioned else None,
        others=other_speakers(config, run, model),
        judges=shared.judges_panel(config, run, clips, texts_of(Path(config.data_dir)), features.config.sample_rate),
    )
    held = len(data.val.examples) if data.val else 0
    warning = measures.few_held_out(
        len(evaluator.examples),
        f"raise --val_samples ({held} are held out)"
        if held > len(evaluator.examples)
        else "prepare the corpus with a larger --val_fraction (prepare_data.py)",
    )
    if warning:
        run.logger.warning(warning)
    fingerprint = checkpoint_file.data_fingerprint([e.item_id for e in data.train.examples])
    if run.payload:
        checkpoint_file.check_same_data(run.payload, fingerprint)
    resolved = config_to_dict(config)
    tracker = tracking.open_tracker(config.report_to, run.folder, resolved, run.dist.is_main)
    if tracker.sinks:
        run.logger.info(f"tracking: {', '.join(tracker.names)} in {run.folder}")
    choices = machinery.RunChoices(
        title=f"train_vits: {run.folder}",
        paths=context.RunPaths(run_dir=run.folder, output_dir=Path(config.output_dir)),
        checkpoints=run_settings.CheckpointSettings(
            True, config.keep_checkpoints, config.checkpoint_every_minutes, config.checkpoint_min_minutes
        ),
        num_workers=workers(config, run),
        early_stopping_patience=config.early_stopping_patience,
        tracker=tracker,
        checkpoint_extras={
            "config": resolved,
            "model_config": loaded.model.config.to_dict(),
            "tokenizer_files": assembly.tokenizer_files(loaded.tokenizer),
            "data_fingerprint": fingerprint,
        },
        card=model_card.card_facts(
            config.model_name, data.train.hours(features.config.sample_rate), len(data.train.examples)
        ),
    )
    start = shared.StartingPoint(loaded.model, loaded.tokenizer, model.frozen_parts, features, choice)
    return shared.build_loop(config, run, start, data.train.examples, data.sampler, evaluator, choices, step_callback)


def fit(run: context.Run, trainer) -> loop.LoopResult | None:
    """The loop, with Ctrl-C / SIGTERM as "save and stop at the next safe point"; None, said, when the budget
    cannot hold the work asked for."""
    try:
        return loop.run_with_signals(trainer)
    except loop.BudgetTooSmall as error:
        run.logger.error(f"error: {error}")
        return None


def close(run: context.Run, finished: bool) -> None:
    """The process group (under torchrun) left, and the output folder's lock released."""
    run.dist.close(finished)
    for lock in run.held:
        lock.release()


def naturalness_for(wanted: bool | None, device, logger):
    """DNSMOS when asked for, or by default on a GPU run where it is installed (on a CPU it costs a tiny voice's
    evaluation six times over: bench/RESULTS.md); None when off. Asked for and missing: a clear error."""
    if wanted and not naturalness.available():
        raise ConfigError([f"--naturalness: its optional extra is not installed ({naturalness.INSTALL_HINT})"])
    if wanted is None and device.type == "cuda" and not naturalness.available():
        logger.info(f"naturalness (DNSMOS) not measured: {naturalness.INSTALL_HINT} to have it")
    if wanted is None:
        wanted = device.type == "cuda"
    return naturalness.load_naturalness(wanted and naturalness.available())


def workers(config, run: context.Run) -> int:
    """DataLoader workers: as asked, else 2 on a GPU and none on a CPU (where they only compete for cores)."""
    return config.num_workers if config.num_workers >= 0 else (2 if run.device.type == "cuda" else 0)


def ready_to_train(config, run: context.Run, model: Model, data: Data) -> bool:
    """Training mode, the resolved settings written, the random state restored last; False when start-up has
    already spent the budget."""
    generator.train_mode(model.loaded.model, model.frozen_parts)
    if run.dist.is_main:
        write_args(run, config, data.precomputed)
    if run.payload:  # last: after everything that draws random numbers while being built
        by_rank = run.payload.get("rng_by_rank") or [run.payload["rng"]]
        checkpoint_file.restore_rng(
            by_rank[run.dist.rank] if len(by_rank) == run.dist.world_size else run.payload["rng"]
        )
    elif run.dist.active:
        torch.manual_seed(config.seed + 7919 * run.dist.rank)  # each process its own segments and noise
    if run.budget.left_s() <= 2 * run.budget.safety_s:
        run.logger.error(
            f"error: the budget of {run.budget.target_s:.0f}s is spent ({run.budget.used_s():.0f}s used by "
            "start-up, loading and earlier processes) before training could start: raise --target_hours"
        )
        return False
    return True


def write_args(run: context.Run, config, precomputed: bool) -> None:
    """training_args.json: the resolved flags, and what was decided from them on this machine."""
    resolved = {
        "device": str(run.device),
        "precision": run.precision.name,
        "precompute_mels": precomputed,
        "num_workers": workers(config, run),
        "resumed_from": str(run.resume_path) if run.resume_path else None,
        "processes": run.dist.world_size,
    }
    try:
        atomic.write_text_atomic(
            run.folder / "training_args.json",
            json.dumps({**config_to_dict(config), "resolved": resolved}, indent=2) + "\n",
        )
    except OSError as error:  # a full disk: the exported models carry these settings too
        OPTIONAL.failed("training_args.json", run.folder, error, run.logger.warning)


def report_end(config, run: context.Run, trainer, result) -> int:
    """The closing lines and the exit status: 0 finished, 1 stopped by a failure, 130/143 interrupted."""
    summary = trainer.summary(result.stop_reason)
    summary.update(
        data_wait_share=round(result.data_wait_s / max(result.train_s, 1e-9), 4), train_s=round(result.train_s, 3)
    )
    summary = trainer.context.run_log.end(summary)
    state = result.state
    if result.stop_reason == "interrupted":
        saved = (
            f"saved {result.checkpoint}; continue with the same command and --resume auto"
            if result.checkpoint
            else "no checkpoint could be written (see the errors above)"
        )
        published = (
            f"; the final model was written to {config.output_dir} first (the stop came during the final evaluation)"
            if result.final_saved
            else ""
        )
        run.logger.info(f"interrupted ({trainer.context.stop.signal_name}) at step {state.step}: {saved}{published}")
        return trainer.context.stop.exit_status
    run.logger.info(
        f"done ({result.stop_reason}) after {state.step} steps, {state.epoch} epochs, "
        f"{run.budget.used_s():.1f}s of {run.budget.target_s:.0f}s; last learning rate {result.last_lr:.3e}; "
        f"{describe_best(state, trainer.parts.evaluator.rule.describe(), run.folder / 'best_model')}; "
        f"{describe_final(config.output_dir, trainer.progress.final_source, run.folder)}; "
        f"report -> {run.folder / 'report.html'}"
    )
    run.logger.info(
        f"time: steps {result.train_s:.0f}s ({trainer.context.run_log.profile.describe()}), evaluations "
        f"{summary['evaluation_s']:.0f}s, checkpoints {summary['checkpoint_s']:.0f}s, exports "
        f"{summary['export_s']:.0f}s; data wait {100 * summary['data_wait_share']:.2f}% of step time"
    )
    if result.save_failures:
        run.logger.error(f"error: {result.save_failures} save(s) could not be written (see above)")
    if result.stop_reason == "out_of_memory" and not result.final_saved:
        run.logger.info(f"{config.output_dir} is left as it was: no model this run trained was kept as best_model")
    elif not result.final_saved:
        run.logger.error(f"error: the final model could not be written to {config.output_dir}")
    pushed = not (config.push_to_hub and result.final_saved and run.dist.is_main) or push(config, run)
    return 1 if result.stop_reason in ("diverged", "out_of_memory") or not result.final_saved or not pushed else 0


def describe_best(state, band: str, best_dir: Path) -> str:
    """The end line's words on best_model: its score (on the clips its evaluation scored, when the deadline cut it
    short), and whether it met the timing rule or is the fallback."""
    best = state.best
    if best.step < 0:
        return "no best_model (no evaluation had a finite score, or every one said nothing)"
    partial = model_card.partial_clips(model_folders.read_evaluation(best_dir) or {})
    kept = f"best MCD {best.score:.3f} dB at step {best.step}{' on ' + partial if partial else ''} -> {best_dir}"
    if best.eligible:
        return kept
    return (
        f"{kept} (a fallback: no evaluation met the timing rule {band}; this is the one nearest to it, see "
        "eval.json there)"
    )


def describe_final(output_dir: str, source: str, run_dir: Path) -> str:
    if not source:
        return f"final model not written to {output_dir}"
    return f"final model -> {output_dir} (a copy of {source}: the voice to load; the last weights -> {run_dir / 'last_model'})"


def check_hub(config) -> None:
    """--push_to_hub: fail now, before any training, when the upload could not happen at the end."""
    if config.push_to_hub:
        try:
            hub_upload.check_ready(config.push_to_hub)
        except hub_upload.HubError as error:
            raise ConfigError([str(error)]) from error


def push(config, run: context.Run) -> bool:
    """Upload the output folder (after the final save); False, with what to do logged, when it failed."""
    try:
        url = hub_upload.push_folder(Path(config.output_dir), config.push_to_hub, private=config.hub_private)
    except hub_upload.HubError as error:
        run.logger.error(f"error: {error}")
        return False
    run.logger.info(f"uploaded {config.output_dir} -> {url} ({'private' if config.hub_private else 'public'})")
    return True
