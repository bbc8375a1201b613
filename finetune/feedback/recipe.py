"""train_feedback.py's round, in the order the script calls it: the round's folder, log and budget (start_round),
then (round_data.py's load_round_data: the corrections, what they correct, the split, the replay and the voice's
held-out clips) the starting weights with what the round may move and the text anchor (starting_point), the
"before" renders (render_before), the training loop judged on corrections and originals (fit_round), then the
held-out corrections judged once, the decision, the "after" renders, the version and the report
(conclude_round). Also --review (the voice speaking sentences for listening). Each takes the script's
FeedbackConfig.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

from finetune.cli import config_to_dict
from finetune.data import audio, sampler, speakers
from finetune.data.corpus import tokenize
from finetune.data.metadata import texts_of
from finetune.feedback import (
    corrections,
    decision,
    differences,
    hearing,
    judge_check,
    listen_page,
    measure_check,
    round_data,
)
from finetune.feedback import versions as versions_folder
from finetune.feedback.anchor import TextAnchor
from finetune.feedback.report import judges_line, judges_record, summary_text
from finetune.feedback.round_evaluator import DECIDING_DRAWS, FOCUS_RATIO, FeedbackEvaluator
from finetune.recipes import shared
from finetune.reporting import evaluation, logs, measures, model_card
from finetune.system import atomic
from finetune.training import assembly, context, distributed, loop, machinery, run_settings
from finetune.training.budget import Budget, safety_margin_s
from finetune.vits import generator, speaker_layers, synthesis


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
    voice = synthesis.load_voice(base, assembly.pick_device(config.device))
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


def start_round(config, versions, base: Path, clock, stop, dist) -> context.Run:
    """The round's folder (made by the main process; every process learns it), log, budget, device."""
    budget = Budget(config.budget_s, clock, safety_s=safety_margin_s(config.budget_s))
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
    assembly.seed_everything(config.seed)
    return shared.open_run(folder, logger, config, budget, dist, stop)


def starting_point(config, round_: context.Run, data: round_data.RoundData, base: Path) -> shared.StartingPoint:
    """The base model and its discriminator (or a new one, warmed up first: the base model is pretrained), with
    what the round may move (--acoustics) and, for a round on what the corrections correct, the text anchor."""
    parts = list(config.freeze)
    own = config.corrections_voice == "own"
    learn_pronunciation = own and config.acoustics != "trained"
    flow_learns = config.acoustics == "focus" and bool(data.focus.letters)
    if learn_pronunciation:
        extra = [p for p in (*generator.ACOUSTIC_PARTS, "duration_predictor") if not (flow_learns and p == "flow")]
        extra += ["text_encoder"] if config.acoustics != "frozen" and not data.focus.words else []
        parts += [part for part in extra if part not in parts]
    frozen_parts = generator.freeze(data.model, parts)
    if config.dropout != "on":  # auto: the base is a pretrained voice
        generator.without_dropout(data.model)
    regulariser = None
    if learn_pronunciation:  # the corrections' own voice still learns, in its speaker conditioning alone
        speaker_layers.train_conditioning(data.model)
        trained, rows = "", None
        if config.acoustics == "embeddings":  # what each letter is, not how the text encoder reads sentences
            trained = "the token embeddings and "
        if config.acoustics == "focus":
            rows = [data.tokenizer.encoder[c] for c in data.focus.letters if c in data.tokenizer.encoder]
            trained = (
                f"the embeddings of {', '.join(repr(c) for c in data.focus.letters)}, the flow (a letter's sound the "
                "voice never made alone), "
                if data.focus.letters
                else ""
            ) + ("the text encoder's layers (a word is read in its context), " if data.focus.words else "")
            regulariser = text_anchor(config, data)
        if config.acoustics in ("embeddings", "focus"):
            later = config.timbre_first > 0  # the letters wait while the corrections' own voice takes their timbre
            mask = generator.train_token_rows(data.model, [] if later else rows)
            data.letters_later = (mask, rows) if later else None
        held = (
            f"; the rest held by the text anchor at {regulariser.weight:g} (--text_anchor_weight)"
            if regulariser
            else ""
        )
        round_.logger.info(
            f"frozen: {', '.join(parts)}, but for {trained}the speakers' conditioning: the round teaches how the "
            f"text is said, not how the voice sounds or its tempo (--acoustics trained lets every part learn){held}"
        )
    saved = base / "discriminator.pt"
    choice = assembly.build_discriminator(
        str(saved) if saved.is_file() else None,
        width=config.discriminator_width,
        periods=None,  # a new one (no discriminator.pt beside the base) has the standard VITS periods
        scales=1,
        payload=None,  # a round is never resumed
        generator_pretrained=True,
        warmup_steps=config.discriminator_warmup_steps,
    )
    round_.logger.info(choice.description)
    return shared.StartingPoint(data.model, data.tokenizer, frozen_parts, data.features, choice, regulariser)


WORD_ANCHOR_WEIGHT = 100.0  # a round on a word trains the text encoder's layers, which every sentence passes through
LETTER_ANCHOR_WEIGHT = 10.0  # a round on letters alone trains their embedding rows


def anchor_weight(config, focus) -> float:
    """--text_anchor_weight, or (-1) by what the round trains. On a word learnt from the voice's own recordings
    ("min" said as "man", bench/bench_corrections.py), 10 fixed the word and moved the voice's own clips +0.034 dB
    (at most +0.062, their noise 0.044): rejected; 100 fixed it as much with the rest of the voice held
    (bench/log/2026-12-05.md). On letters, 10 is what was measured (x accepted and fixed)."""
    if config.text_anchor_weight >= 0:
        return config.text_anchor_weight
    return WORD_ANCHOR_WEIGHT if focus.words else LETTER_ANCHOR_WEIGHT


def text_anchor(config, data: round_data.RoundData) -> TextAnchor | None:
    """The voice's prior held on its own sentences and on what the corrections do not correct (anchor.py)."""
    weight = anchor_weight(config, data.focus)
    if weight <= 0:
        return None
    decoder = getattr(data.tokenizer, "decoder", {})
    texts = [tokenize(data.tokenizer, text) for text in data.corpus_texts if text.strip()]
    texts = [ids for ids in texts if len(ids)]
    held = [~data.focus.token_mask(ids, decoder) for ids in texts]
    for example in data.trained:
        texts.append(example.token_ids)
        held.append(~data.masks[example.item_id])
    return TextAnchor(data.model, texts, held, weight, config.batch_size, config.seed)


def render_before(round_: context.Run, data: round_data.RoundData, base: Path) -> dict[str, list]:
    """listen/<id>_0_recording.wav and <id>_1_before.wav (the starting model) for each correction, and the words
    the start says differently from each recording (made while the focus was heard, when it was)."""
    listen = round_.folder / "listen"
    listen.mkdir(parents=True, exist_ok=True)
    for example in data.corrections.examples:
        audio.write_pcm16(listen / f"{example.item_id}_0_recording.wav", example.audio / 32768.0, data.rate)
    readings = data.before or hearing.render(
        synthesis.load_voice(base, round_.device), data.corrections.examples, listen, "_1_before", data.features
    )
    return hearing.words_said(readings, data.corrections.examples, getattr(data.tokenizer, "decoder", {}))


RETEST_SEED_OFFSET = 7919  # the second draw of the voice's own clips at the baseline: another seed, the same clips


def fit_round(config, round_: context.Run, data: round_data.RoundData, start, base: Path, reserve_after_s: float):
    """The training loop of train_vits.py on corrections + replay, judged on corrections and originals.
    A round is short and never resumed: no checkpoints, no early stopping, no worker processes;
    `reserve_after_s` is kept for what follows the loop (the held-out corrections judged once, the "after"
    renders, the version's copies)."""
    own = config.corrections_voice == "own"  # other people's recordings, under a speaker id of their own
    voice = speakers.TARGET_SPEAKER if speaker_layers.speaker_count(data.model) > 1 else None  # the corrections': 1
    rule = measures.TimingRule(config.max_length_ratio)
    texts = {**texts_of(Path(config.data_dir)), **texts_of(round_.folder / "corrections")}
    validation = judge_check.VoiceValidation(base, Path(config.data_dir), data.voice, round_, config.seed)
    judges = shared.judges_panel(config, round_, data.originals.examples, texts, data.rate, validation)
    common = dict(seed=config.seed, batch_size=assembly.eval_batch_size(round_.device), judges=judges)
    on_corrections = dict(speaker=voice, rule=None if own else rule, across_speakers=own, focus=data.masks or None)
    # The part that decides (the held-out corrections, else those it trained on) scored on several draws a clip.
    draws = lambda decides: DECIDING_DRAWS if decides else 1  # noqa: E731
    said = evaluation.Evaluator(
        data.trained,
        data.features,
        round_.device,
        data.rate,
        round_.folder / "samples",
        [(e.item_id, e.token_ids) for e in data.trained[:5]],
        **on_corrections,
        **common,
        synthesis_draws=draws(not data.held),
    )
    held = (
        evaluation.Evaluator(
            data.held, data.features, round_.device, data.rate, **on_corrections, **common, synthesis_draws=draws(True)
        )
        if data.held
        else None
    )
    learnt = (
        evaluation.Evaluator(
            data.trained, data.features, round_.device, data.rate, speaker=1, rule=None, **{**common, "judges": None}
        )
        if own
        else None
    )
    originals, retest = (
        evaluation.Evaluator(
            data.originals.examples,
            data.features,
            round_.device,
            data.rate,
            speaker=voice,
            rule=rule,
            **{**common, "seed": config.seed + offset, "judges": judges if offset == 0 else None},
        )
        for offset in (0, RETEST_SEED_OFFSET)
    )
    evaluator = FeedbackEvaluator(said, originals, learnt, held, retest)
    if evaluator.deciding.measure == FOCUS_RATIO:
        measure_check.before_training(round_, data, base, said.references_of)  # made once, for the evaluations too
    examples = data.trained + data.replay
    generator.train_mode(data.model, start.frozen_parts)
    paths = context.RunPaths(run_dir=round_.folder / "checkpoints", output_dir=round_.folder / "final_model")
    resolved = config_to_dict(config)
    choices = machinery.RunChoices(
        title=f"train_feedback: {round_.folder.name}",
        paths=paths,
        checkpoints=run_settings.CheckpointSettings(enabled=False),
        num_workers=0,
        reserve_after_s=reserve_after_s,
        checkpoint_extras={
            "config": resolved,
            "model_config": data.model.config.to_dict(),
            "tokenizer_files": assembly.tokenizer_files(data.tokenizer),
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
        examples,
        buckets,
        evaluator,
        choices,
        step_callback=letters_after_timbre(config, round_, data),
    )
    paths.run_dir.mkdir(parents=True, exist_ok=True)
    return trainer, evaluator, loop.run_with_signals(trainer)


def letters_after_timbre(config, round_: context.Run, data: round_data.RoundData):
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
    config, round_: context.Run, data: round_data.RoundData, versions, base: Path, trainer, evaluator, result, before
) -> int:
    """Judge the round's model once on the held-out corrections, decide, render it, make a version (and the app's
    voice) or not, write the report."""
    best_dir = trainer.context.paths.best_dir
    best = (
        json.loads((best_dir / "eval.json").read_text(encoding="utf-8")) if (best_dir / "eval.json").is_file() else None
    )
    candidate = best_dir if best and best["step"] > 0 else trainer.context.paths.last_dir
    if not (candidate / "config.json").is_file():
        raise corrections.FeedbackError(
            f"the round's model could not be written to {candidate} (see {round_.folder}/train.log); "
            "the current voice is unchanged"
        )
    voice = synthesis.load_voice(candidate, round_.device)
    held_after = evaluator.judge_held(voice.model, round_.stop)  # once, on the model the round chose without them
    verdict = decision.decide(evaluator.baseline, best, result.last_eval, evaluator, held_after)
    listen = round_.folder / "listen"
    decoder = getattr(data.tokenizer, "decoder", {})
    after = hearing.words_said(
        hearing.render(voice, data.corrections.examples, listen, "_2_after", data.features),
        data.corrections.examples,
        decoder,
    )
    words = hearing.said_differently(data.corrections.examples, before, after)
    counts = {
        "corrections": len(data.corrections.examples),
        "held_out": len(data.held),
        "originals": len(data.originals.examples),
        "replay": len(data.replay),
    }
    record = {
        "base_model": str(base),
        "accepted": verdict.accepted,
        "reason": verdict.reason,
        "decided_by": verdict.measure,
        "improvement": verdict.improvement,
        "voice_check": verdict.voice,
        "identity": verdict.identity,
        "focus": data.focus.describe() if data.focus else "",
        "before": verdict.before,
        "after": verdict.after,
        "candidate_step": verdict.candidate_step,
        "counts": counts,
        "voice": data.voice,
        "corrections_voice": config.corrections_voice,
        "learning_rate": config.learning_rate,
        "steps": result.state.step,
        "stop_reason": result.stop_reason,
        "time_used_s": round(round_.budget.used_s(), 1),
        "judges": judges_record(evaluator.said.judges),
        "measure_check": data.measure_check,
    }
    version = versions.accept(candidate, round_.folder.name, record) if verdict.accepted else None
    if not verdict.accepted:
        versions.reject(round_.folder.name, record)
    report = {
        "round": round_.folder.name,
        "version": version,
        "app_model_dir": str(versions.app_folder) if version and versions.app_folder else None,
        **record,
        "listen_dir": str(listen),
        "words_said_differently": {
            e.item_id: {
                "before": [w.word for w in differences.said_differently(before.get(e.item_id, []))],
                "after": [w.word for w in differences.said_differently(after.get(e.item_id, []))],
            }
            for e in data.corrections.examples
        },
        "corrections_dropped": data.prepare_report["dropped"],
        "per_clip_before": evaluator.baseline.per_clip_dict(),
        "per_clip_after": {  # the round's model: its evaluation, and the held-out corrections judged once on it
            **(best["per_clip"] if best and best["step"] > 0 else result.last_eval.per_clip_dict()),
            **(held_after.per_clip_dict() if held_after is not None else {}),
        },
    }
    atomic.write_text_atomic(
        round_.folder / "feedback_report.json", json.dumps(report, indent=2, ensure_ascii=False) + "\n"
    )
    default_voices = type(config).output_dir  # the flag's default: the undo command needs no --output_dir
    undo = "" if config.output_dir == default_voices else f"--output_dir {shlex.quote(config.output_dir)}"
    text = summary_text(
        round_.folder.name,
        verdict,
        version,
        counts,
        listen,
        data.prepare_report["dropped"],
        undo,
        words,
        data.focus.describe() if data.focus else "",
        judges_line(evaluator.said.judges),
        f"Checked before training: {data.measure_check}." if data.measure_check else "",
    )
    if version and versions.app_folder:
        text += (
            f"The app's voice, {versions.app_folder}, is now {version} (the one before is kept: --rollback previous).\n"
        )
    atomic.write_text_atomic(round_.folder / "feedback_report.txt", text)
    listen_page.write_page(
        listen / "listen.html",
        data.corrections.examples,
        round_data.texts_by_id(round_.folder / "corrections"),
        before,
        after,
        text,
    )
    round_.metrics.write("feedback", **{k: v for k, v in report.items() if not k.startswith("per_clip")})
    round_.logger.info("\n" + text.rstrip())
    return 0


def after_loop_reserve_s(render_s: float, model_dir: Path, held_s: float = 0.0) -> float:
    """Seconds kept for after the loop: the held-out corrections judged once on the round's model (`held_s`, as
    long as at the baseline, half as much again for a busier machine), rendering each correction once more (as
    long as the "before" renders took, half as much again), copying the new version three times (at 100 MB/s:
    the version, current/ and the app's folder) and the reports. Before, a flat 5 s + 0.5 s a correction: 7 s
    where 1 s was spent, which a 60 s round took from its final evaluation."""
    model_bytes = sum(path.stat().st_size for path in model_dir.rglob("*") if path.is_file())
    return 0.5 + 1.5 * (render_s + held_s) + 3 * model_bytes / 100e6
