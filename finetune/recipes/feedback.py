"""train_feedback.py's round, in the order the script calls it: the round's folder, log and budget (start_round),
the corrections prepared like the corpus with a replay sample of it and the voice's held-out clips
(load_round_data), the starting weights with what the round may move (starting_point), the "before" renders
(render_before), the training loop judged on corrections and originals (fit_round), then the decision, the
"after" renders, the version and the report (conclude_round). Also --review (the voice speaking sentences for
listening). Each takes the script's FeedbackConfig.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from transformers import VitsModel, VitsTokenizer

from finetune.cli import config_to_dict
from finetune.data import audio, corpus, corrections, sampler, speakers
from finetune.data.features import Features
from finetune.data.metadata import texts_of
from finetune.recipes import shared
from finetune.reporting import evaluation, logs, measures, model_card
from finetune.system import atomic, model_source
from finetune.training import budget as budgeting
from finetune.training import context, distributed, feedback, loop, machinery, run_settings, session
from finetune.training import versions as versions_folder
from finetune.vits import generator, synthesis
from finetune.vits import speakers as speaker_layers


def open_versions(config) -> versions_folder.Versions:
    """The voices folder, with what a round killed while making a version left put right (by the main process);
    --rollback and --review refused under torchrun (they are one process's work)."""
    versions = versions_folder.Versions(Path(config.output_dir))
    if (config.rollback or config.review) and distributed.launched_by_torchrun():
        raise corrections.FeedbackError("--rollback and --review run as one process: start them without torchrun")
    main_process = int(os.environ.get("RANK", "0")) == 0
    for note in versions.repair() if main_process else []:
        print(f"{versions.root}: {note} (left by a round that was killed)", file=sys.stderr)
    return versions


def base_model_dir(config, versions) -> Path:
    """--base_model, else the current voice, else the last training run's best model (checked: a model folder)."""
    if config.base_model:
        path = Path(config.base_model)
    elif versions.current.is_dir():
        path = versions.current
    else:
        path = Path("training/checkpoints/best_model")
    missing = [name for name in ("config.json", "vocab.json") if not (path / name).is_file()]
    if missing:
        raise corrections.FeedbackError(
            f"no model to start from at {path} (no {' or '.join(missing)}): train one "
            "first (train_vits.py), or pass --base_model DIR with a model folder "
            "train_vits.py wrote"
        )
    return path


def processes(config) -> distributed.Distributed:
    """This process's place in a torchrun launch (one process alone otherwise)."""
    return distributed.from_environment(config.device)


def review(config, base: Path) -> int:
    voice = synthesis.load_voice(base, session.pick_device(config.device))
    lines = synthesis.prepare_lines(voice, synthesis.numbered(synthesis.read_sentences(config.review)))
    out = Path(config.review_dir)
    sayable = synthesis.speak_for_review(voice, lines, out)
    target = config.feedback_dir or corrections.FEEDBACK_DIRS[0]
    print(
        f"{len(sayable)} sentences spoken by {base} -> {out}/ (<id>.wav, <id>.txt, metadata.csv)\n"
        f"Listen; record each sentence it says wrong as {target}/<id>.wav and copy {out}/<id>.txt beside it "
        f"(or let your recording app save the pairs there); then run train_feedback.py"
    )
    return 0


@dataclass
class RoundData:
    model: VitsModel  # the generator, ready for training
    tokenizer: VitsTokenizer
    features: Features
    corrections: corpus.Corpus  # every usable correction (rendered before and after for listening)
    held: list  # Examples: the corrections held out of the round's training, which decide (hold_out)
    originals: corpus.Corpus  # held-out clips of the original
    replay: list  # Examples of the original corpus
    prepare_report: dict
    hop: int
    rate: int
    voice: str | None  # the speaker of a multi-speaker corpus whose clips are replayed and judged
    focus: list[int] | None  # --acoustics letters: the token ids the corrections are about (what trains and is judged)
    letters_later: tuple | None = None  # --timbre_first: (the embeddings' gradient mask, the rows it lets learn later)


def start_round(config, versions, base: Path, clock, stop, dist) -> shared.Run:
    """The round's folder (made by the main process; every process learns it), log, budget, device."""
    budget = budgeting.Budget(config.budget_s, clock, safety_s=budgeting.safety_margin_s(config.budget_s))
    folder = None
    if dist.is_main:
        versions.ensure_base(base)
        folder = versions.new_round_dir()
    folder = dist.broadcast(folder)
    logger = logs.setup_logging(folder, rank=dist.rank)
    logger.info(
        f"train_feedback {folder.name}: starting from {base}; budget {config.budget_s:.0f}s"
        + (f"; data parallel over {dist.world_size} processes ({dist.backend})" if dist.active else "")
    )
    session.seed_everything(config.seed)
    return shared.open_run(folder, logger, config, budget, dist, stop)


def load_round_data(config, round_: shared.Run, base: Path) -> RoundData:
    """Corrections prepared like the corpus (finetune/data/corrections.py); held-out clips and a replay
    sample of the original."""
    out = round_.folder / "corrections"
    prepared = (
        corrections.prepare_corrections(
            corrections.feedback_folder(config.feedback_dir),
            out,
            base,
            config.min_seconds,
            config.max_seconds,
            round_.logger,
        )
        if round_.dist.is_main
        else None
    )
    prepare_report = round_.dist.broadcast(prepared)  # the others wait for the main one's
    loaded = generator.load_generator(model_source.resolve_model(str(base)), [])
    round_.stop.check()  # loading a model takes seconds: a stop asked for meanwhile is honoured here
    model, tokenizer = generator.ready_for_training(loaded.model), loaded.tokenizer
    data_dir = Path(config.data_dir)
    voice = corrections.voice_speaker(
        data_dir, config.target_speaker, getattr(model.config, "speaker", None), int(model.config.sampling_rate)
    )
    if config.corrections_voice == "own":  # other people's recordings: their own speaker id, the voice its own
        model = speaker_layers.add_speakers(model, 2, seed=config.seed)
        speaker_layers.pin_target_speaker(model)  # the voice's own path: only the shared parts can move it
        model.config.speaker_names = [voice or "voice", "corrections"]
        round_.logger.info(
            "speakers: the corrections train under a speaker id of their own, the replayed clips as "
            f"the voice ({voice or 'the corpus'}); the voice is judged and exported "
            "(--corrections_voice voice: the corrections are the voice's own)"
        )
    features = shared.features_for(model, round_.device)
    hop, rate = features.config.hop_length, features.config.sample_rate
    fixed = corpus.load_corpus(out, "metadata.csv", tokenizer, features, rate, 0, False, round_.device, round_.stop)
    for example in fixed.examples if config.corrections_voice == "own" else []:
        example.speaker = 1
    held, trained = corrections.hold_out(fixed.examples, config.holdout_share, config.seed)
    corrections.held_out_originals(data_dir, voice)
    originals = corpus.load_corpus(
        data_dir,
        "metadata_val.csv",
        tokenizer,
        features,
        rate,
        config.val_samples,
        False,
        round_.device,
        round_.stop,
        speakers={voice: speakers.TARGET_SPEAKER} if voice else None,
    )
    replay = corrections.replay_clips(
        data_dir, len(trained), config.replay_ratio, config.seed, tokenizer, hop, rate, round_.logger, voice
    )
    round_.logger.info(
        f"training data: {len(trained)} corrections + {len(replay)} replayed original clips; "
        + (
            f"{len(held)} corrections held out of the training to decide on (--holdout_share {config.holdout_share:g})"
            if held
            else f"no correction held out ({len(fixed.examples)} came; {2 * corrections.MIN_HELD_OUT} are needed to "
            "hold some out): the round decides on those it trains on, which says they were learnt, not that the fix "
            "carries to other sentences"
        )
        + f"; {len(originals.examples)} held-out originals scored"
    )
    own_letters = config.corrections_voice == "own" and config.acoustics == "letters"
    focus = focus_letters(tokenizer, fixed.examples, replay) if own_letters else None
    return RoundData(
        model, tokenizer, features, fixed, held, originals, replay, prepare_report, hop, rate, voice, focus
    )


def starting_point(config, round_: shared.Run, data: RoundData, base: Path) -> shared.StartingPoint:
    """The base model and its discriminator (or a new one, warmed up first: the base model is pretrained)."""
    parts = list(config.freeze)
    learn_pronunciation = config.corrections_voice == "own" and config.acoustics != "trained"
    if learn_pronunciation:
        extra = [*generator.ACOUSTIC_PARTS, *(["text_encoder"] if config.acoustics != "frozen" else [])]
        parts += [part for part in extra if part not in parts]
    frozen_parts = generator.freeze(data.model, parts)
    if config.dropout != "on":  # auto: the base is a pretrained voice
        generator.without_dropout(data.model)
    if learn_pronunciation:  # the corrections' own voice still learns, in its speaker conditioning alone
        speaker_layers.train_conditioning(data.model)
        trained, rows = "", None
        if config.acoustics == "embeddings":  # what each letter is, not how the text encoder reads sentences
            trained = "the token embeddings and "
        if config.acoustics == "letters":  # only the letters the corrections are about
            rows = data.focus
            names = getattr(data.tokenizer, "decoder", {})  # VitsTokenizer's id -> character
            trained = f"the embeddings of {' '.join(repr(names.get(t, t)) for t in data.focus) or 'no letter'} and "
        if config.acoustics in ("embeddings", "letters"):
            later = config.timbre_first > 0  # the letters wait while the corrections' own voice takes their timbre
            mask = generator.train_token_rows(data.model, [] if later else rows)
            data.letters_later = (mask, rows) if later else None
        round_.logger.info(
            f"frozen: {', '.join(parts)}, but for "
            f"{trained}the speakers' "
            "conditioning: the round teaches how the text is said, not how the voice sounds "
            "(--acoustics trained lets every part learn)"
        )
    saved = base / "discriminator.pt"
    choice = session.build_discriminator(
        str(saved) if saved.is_file() else None,
        width=config.discriminator_width,
        periods=None,  # a new one (no discriminator.pt beside the base) has the standard VITS periods
        scales=1,
        payload=None,  # a round is never resumed
        generator_pretrained=True,
        warmup_steps=config.discriminator_warmup_steps,
    )
    round_.logger.info(choice.description)
    return shared.StartingPoint(data.model, data.tokenizer, frozen_parts, data.features, choice)


def focus_letters(tokenizer: VitsTokenizer, fixed: list, replay: list) -> list[int]:
    """The letters the corrections are about, against the replayed clips of the voice (blank and space
    aside: they are in every sentence)."""
    ignore = {tokenizer.pad_token_id, getattr(tokenizer, "encoder", {}).get(" ")}  # (no unknown's id)
    return corrections.letters_in_focus(
        [e.token_ids for e in fixed], [e.token_ids for e in replay], {t for t in ignore if t is not None}
    )


def render_before(round_: shared.Run, data: RoundData, base: Path) -> list:
    """listen/<id>_0_recording.wav and <id>_1_before.wav (the starting model) for each correction."""
    lines = [synthesis.Line(e.item_id, "", e.token_ids) for e in data.corrections.examples]
    synthesis.speak_to_folder(
        synthesis.load_voice(base, round_.device), lines, round_.folder / "listen", suffix="_1_before"
    )
    for example in data.corrections.examples:
        audio.write_pcm16(
            round_.folder / "listen" / f"{example.item_id}_0_recording.wav", example.audio / 32768.0, data.rate
        )
    return lines


def fit_round(config, round_: shared.Run, data: RoundData, start, base: Path, reserve_after_s: float):
    """The training loop of train_vits.py on corrections + replay, judged on corrections and originals.
    A round is short and never resumed: no checkpoints, no early stopping, no worker processes;
    `reserve_after_s` is kept for what follows the loop (the "after" renders, the version's copies)."""
    held_ids = {e.item_id for e in data.held}
    fixed = [e for e in data.corrections.examples if e.item_id not in held_ids]  # what the round trains on
    own = config.corrections_voice == "own"  # other people's recordings, under a speaker id of their own
    voice = speakers.TARGET_SPEAKER if speaker_layers.speaker_count(data.model) > 1 else None  # the corrections': 1
    rule = measures.TimingRule(config.max_length_ratio)
    texts = {**texts_of(Path(config.data_dir)), **texts_of(round_.folder / "corrections")}
    judges = shared.judges_panel(config, round_, data.originals.examples, texts, data.rate)
    common = dict(seed=config.seed, batch_size=session.eval_batch_size(round_.device), judges=judges)
    said = evaluation.Evaluator(
        fixed,
        data.features,
        round_.device,
        data.rate,
        round_.folder / "samples",
        [(e.item_id, e.token_ids) for e in fixed[:5]],
        speaker=voice,
        rule=None if own else rule,
        across_speakers=own,
        # --acoustics letters: judged on the letters it teaches (the rest of each sentence cannot change)
        focus_tokens=set(data.focus) if data.focus is not None else None,
        **common,
    )
    held = (
        evaluation.Evaluator(
            data.held,
            data.features,
            round_.device,
            data.rate,
            speaker=voice,
            rule=None if own else rule,
            across_speakers=own,
            focus_tokens=set(data.focus) if data.focus is not None else None,
            **common,
        )
        if data.held
        else None
    )
    learnt = (
        evaluation.Evaluator(
            fixed, data.features, round_.device, data.rate, speaker=1, rule=None, **{**common, "judges": None}
        )
        if own
        else None
    )
    originals = evaluation.Evaluator(
        data.originals.examples, data.features, round_.device, data.rate, speaker=voice, rule=rule, **common
    )
    evaluator = feedback.FeedbackEvaluator(said, originals, config.max_regression, learnt, held)
    examples = fixed + data.replay
    generator.train_mode(data.model, start.frozen_parts)
    paths = context.RunPaths(run_dir=round_.folder / "checkpoints", output_dir=round_.folder / "final_model")
    choices = shared.RunChoices(
        title=f"train_feedback: {round_.folder.name}",
        paths=paths,
        checkpoints=run_settings.CheckpointSettings(enabled=False),
        num_workers=0,
        reserve_after_s=reserve_after_s,
    )
    resolved = config_to_dict(config)
    saves = machinery.SaveExtras(
        checkpoint={
            "config": resolved,
            "model_config": data.model.config.to_dict(),
            "tokenizer_files": session.tokenizer_files(data.tokenizer),
            "data_fingerprint": "",
        },
        card=model_card.card_facts(
            str(base), sum(len(e.audio) for e in examples) / data.rate / 3600, len(examples), "train_feedback.py"
        ),
    )
    buckets = sampler.BucketSampler(
        [e.frame_count(data.hop) for e in examples],
        config.batch_size,
        config.seed,
        round_.dist.rank,
        round_.dist.world_size,
        config.length_pool_batches,
    )
    trainer = shared.build_loop(
        config,
        round_,
        start,
        shared.TrainingData(examples, buckets),
        evaluator,
        choices,
        saves,
        step_callback=letters_after_timbre(config, round_, data),
    )
    paths.run_dir.mkdir(parents=True, exist_ok=True)
    return trainer, evaluator, loop.run_with_signals(trainer)


def letters_after_timbre(config, round_: shared.Run, data: RoundData):
    """--timbre_first: the loop's callback that lets the letters learn once the corrections' own speaker
    conditioning has had its share of the round's planned steps to take up their readers' timbre and tempo
    (learnt together, the letters took some of it, and a fix that sounded right in the readers' voices did not
    in the voice's: bench/RESULTS.md). None without it."""
    if data.letters_later is None:
        return None
    mask, rows = data.letters_later

    def callback(loop) -> None:
        plan = loop.pacer.plan
        if mask.any() or plan is None or loop.state.step < config.timbre_first * plan.total_steps:
            return
        mask[list(range(mask.shape[0])) if rows is None else list(rows)] = 1.0
        round_.logger.info(
            f"step {loop.state.step}: the letters learn from now on (the first {config.timbre_first:.0%} of the "
            "round's steps went to the corrections' own voice, --timbre_first)"
        )

    return callback


def conclude_round(
    config, round_: shared.Run, data: RoundData, versions, base: Path, trainer, evaluator, result, lines
) -> int:
    """Decide, render the candidate, make a version (or not), write the report."""
    best_dir = trainer.context.paths.best_dir
    best = (
        json.loads((best_dir / "eval.json").read_text(encoding="utf-8")) if (best_dir / "eval.json").is_file() else None
    )
    decision = feedback.decide(evaluator.baseline, best, result.last_eval, config.max_regression, evaluator)
    candidate = best_dir if best and best["step"] > 0 else trainer.context.paths.last_dir
    if not (candidate / "config.json").is_file():
        raise corrections.FeedbackError(
            f"the round's model could not be written to {candidate} (see {round_.folder}/train.log); "
            "the current voice is unchanged"
        )
    listen = round_.folder / "listen"
    synthesis.speak_to_folder(synthesis.load_voice(candidate, round_.device), lines, listen, suffix="_2_after")
    counts = {
        "corrections": len(data.corrections.examples),
        "held_out": len(data.held),
        "originals": len(data.originals.examples),
        "replay": len(data.replay),
    }
    record = {
        "base_model": str(base),
        "accepted": decision.accepted,
        "reason": decision.reason,
        "decided_by": decision.measure,
        "improvement": decision.improvement,
        "identity": decision.identity,
        "before": decision.before,
        "after": decision.after,
        "candidate_step": decision.candidate_step,
        "counts": counts,
        "voice": data.voice,
        "corrections_voice": config.corrections_voice,
        "max_regression_pct": config.max_regression,
        "steps": result.state.step,
        "stop_reason": result.stop_reason,
        "time_used_s": round(round_.budget.used_s(), 1),
    }
    version = versions.accept(candidate, round_.folder.name, record) if decision.accepted else None
    if not decision.accepted:
        versions.reject(round_.folder.name, record)
    report = {
        "round": round_.folder.name,
        "version": version,
        **record,
        "listen_dir": str(listen),
        "corrections_dropped": data.prepare_report["dropped"],
        "per_clip_before": evaluator.baseline.per_clip_dict(),
        "per_clip_after": best["per_clip"] if best else None,
    }
    atomic.write_text_atomic(
        round_.folder / "feedback_report.json", json.dumps(report, indent=2, ensure_ascii=False) + "\n"
    )
    default_voices = type(config).output_dir  # the flag's default: the undo command needs no --output_dir
    undo = "" if config.output_dir == default_voices else f"--output_dir {shlex.quote(config.output_dir)}"
    text = feedback.summary_text(
        round_.folder.name,
        decision,
        version,
        counts,
        config.max_regression,
        listen,
        data.prepare_report["dropped"],
        undo,
    )
    atomic.write_text_atomic(round_.folder / "feedback_report.txt", text)
    round_.metrics.write("feedback", **{k: v for k, v in report.items() if not k.startswith("per_clip")})
    round_.logger.info("\n" + text.rstrip())
    return 0


def after_loop_reserve_s(render_s: float, model_dir: Path) -> float:
    """Seconds kept for after the loop: rendering each correction once more (as long as the "before" renders
    took, half as much again for a busier machine), copying the new version twice (at 100 MB/s) and the
    reports. Before, a flat 5 s + 0.5 s a correction: 7 s where 1 s was spent, which a 60 s round took from
    its final evaluation."""
    model_bytes = sum(path.stat().st_size for path in model_dir.rglob("*") if path.is_file())
    return 0.5 + 1.5 * render_s + 2 * model_bytes / 100e6
