#!/usr/bin/env python3
"""Teach the voice what it still says wrong: a short fine-tune on corrected recordings.

    python train_feedback.py --review sentences.txt       # 1. speak sentences with the current voice -> review/
    # 2. listen; record the ones it says wrong, correctly, as pairs in training/feedback/: <id>.wav (any
    #    audio format) + <id>.txt (its text; review/<id>.txt has it), as a recording app saves them; or
    #    as wavs/<id>.wav + metadata.csv lines id|text (the LJSpeech layout)
    python train_feedback.py                              # 3. a feedback round (default 15 minutes)
    python train_feedback.py --rollback previous          # 4. undo the last accepted round
    python train_feedback.py --find 300                   # what the voice says unlike the corpus's other readers

A round starts from the current voice (training/voices/current, else the best model of the last
training run) and its discriminator, trains on the corrections mixed with a replay sample of the
original corpus (against forgetting) with the training loop of train_vits.py, and scores, before and
after, the voice saying the corrected sentences and the voice on its own held-out clips. The new model is
kept, as the next version and the voice the app loads, only when the voice says the corrections held out of its
training better beyond the noise (clip by clip against the starting model, judged once) and its own held-out
clips got no worse beyond their noise and kept its tempo; otherwise the current voice stays as it was. The corrections, recorded by other
people, train under a speaker id of their own (--corrections_voice own): they teach the words, not their
voices, and they are judged as other people's recordings (their timbre taken out of the comparison, their
tempo never held against the voice); the voice is what is judged, and what the round's model holds.
Either way the corrected sentences are rendered before and after, for listening, and a report is written.

Exit status: 0 done (accepted or rejected: see the report), 1 bad data or model, 2 bad flags,
130/143 interrupted.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from finetune.cli import exit_process, flag, parse_config, run_script
from finetune.settings import TrainingFlags
from finetune.system import interrupt
from finetune.system.run_lock import hold_for_launch
from finetune.training.budget import Clock


@dataclass
class FeedbackConfig(TrainingFlags):
    """train_feedback.py's flags: the shared training flags (finetune/settings.py; some with a round's defaults,
    declared again below) and these."""

    feedback_dir: str | None = flag(
        None,
        "corrections: pairs <name>.wav + <name>.txt, or wavs/ + metadata.csv "
        "(id|text); any audio format and rate (default: training/feedback, else feedback)",
    )
    base_model: str | None = flag(
        None,
        "model to start from (default: OUTPUT_DIR/current, else "
        "training/checkpoints/best_model); its discriminator.pt is used if present",
    )
    data_dir: str = flag("training", "the original prepared corpus: replay clips and held-out clips come from it")
    output_dir: str = flag("training/voices", "versions folder: current/, v000/, v001/ ..., history.json, rounds/")
    replay_ratio: float = flag(2.0, "original clips replayed per correction (0: none, which risks forgetting)")
    timbre_first: float = flag(
        0.0,
        "--acoustics focus or embeddings: for this share of the round's planned steps only the corrections' own "
        "speaker conditioning learns (their readers' timbre and tempo), then the letters' embeddings too (the flow, "
        "which a round on letters trains, learns from the start)",
    )
    holdout_share: float = flag(
        0.34,
        "share of the corrections that hold what the round corrects (at least 3, and 3 left to train on) held out "
        "of the round's training, by sentence: the round is accepted only when the voice says those better, "
        "sentences it did not learn (0: decide on the trained ones)",
    )
    corrections_voice: str = flag(
        "own",
        "own: the corrections train under a speaker id of their own (recorded by "
        "other people: they teach pronunciation, the voice stays); voice: as the voice "
        "itself (recorded by its own speaker)",
    )
    acoustics: str = flag(
        "focus",
        "with --corrections_voice own, what the round may move: focus (the default) learns what the corrections "
        "correct (the words and letters they share that the voice's own sentences hold less often: a letter's "
        "embedding and the flow, the text encoder's layers for a word), from those tokens' frames alone, with the "
        "voice's prior held to the start everywhere else (--text_anchor_weight); embeddings trains every token "
        "embedding on whole sentences; frozen also the text encoder's layers; each keeps the decoder, the posterior "
        "encoder and the duration predictor (the voice's sound and tempo; the flow too but for focus on letters) "
        "but for the corrections' own conditioning; trained lets every part "
        "learn (bench/bench_corrections.py compares them; docs/feedback.md)",
        choices=["focus", "embeddings", "frozen", "trained"],
    )
    focus: list[str] = flag(
        [],
        "--acoustics focus: what the corrections correct, named (words, or single letters; word:û for a one-letter word), in place of what the "
        "round finds they share (the words and letters they hold far more often than the voice's own sentences)",
    )
    text_anchor_weight: float = flag(
        -1.0,
        "--acoustics focus: how strongly the voice's prior (the text encoder's output) and what its duration predictor "
        "reads of it are held to the start on its own sentences and on what the corrections do not correct "
        "(finetune/feedback/anchor.py; 0: not held; -1: 100 for a round on a word, whose text encoder layers learn, "
        "10 on letters alone)",
    )
    app_model_dir: str | None = flag(
        None,
        "the folder the user's app loads, which an accepted round replaces (the one before kept as a version; "
        "--rollback restores it): default, the output folder of the training run the voice came from "
        "(its training_args.json), as the voice's first round recorded it; none: leave every app folder alone",
    )
    target_speaker: str | None = flag(
        None,
        "a multi-speaker --data_dir: whose clips are replayed and judged (default: "
        "the speaker the base model was exported for)",
    )
    target_minutes: float = flag(15.0, "time budget of the round, everything included (minutes)")
    target_hours: float = flag(0.0, "time budget in hours instead (0: use --target_minutes)")
    min_seconds: float = flag(0.5, "drop corrections shorter than this after trimming (seconds)")
    max_seconds: float = flag(15.0, "drop corrections longer than this after trimming (seconds)")
    rollback: str | None = flag(None, "instead of training: make a version current again ('previous' or e.g. v001)")
    review: str | None = flag(None, "instead of training: speak this file's sentences with the current voice")
    review_dir: str = flag("review", "output folder of --review")
    find: int = flag(
        0,
        "instead of training: hear up to N clips of --data_dir the voice did not train on (other readers', and its "
        "own reader's held-out ones) against the voice saying them, and rank the letters and words it says unlike "
        "most readers (0: off; 300 is a good start) -> --find_dir",
    )
    find_minutes: float = flag(3.0, "--find: the time it may take; what was heard by then is ranked")
    find_dir: str = flag("find", "output folder of --find: findings.html, findings.json, review.txt, audio/")
    # Shared flags with a round's defaults: a short, gentle fine-tune.
    learning_rate: float = flag(
        0.0,
        "peak learning rate (0: a quarter of the rate the voice was trained at, from its config.json or its run's "
        "training_args.json; 1e-5 where neither says)",
    )
    dropout: str = flag(
        "on",
        "dropout while the round trains: on (the model's rates: what the rounds were measured with), off, or "
        "auto (off: the base is pretrained)",
        choices=["auto", "on", "off"],
    )
    gradient_accumulation_steps: int = flag(1, "micro-batches per optimizer step")
    warmup_steps: int = flag(50, "linear warmup in optimizer steps")
    benchmark_samples: int = flag(64, "clips of timed training steps before planning")
    val_samples: int = flag(16, "held-out original clips scored before, during and after")
    max_epochs: int = flag(0, "stop after N passes over the mixed data (0: no limit)")
    discriminator_warmup_steps: int = flag(50, "steps a new discriminator trains alone, when the base model has none")
    max_length_ratio: float = flag(
        1.25,
        "timing rule: a model whose median length ratio (synthesised / recorded) on "
        "the voice's held-out clips (and, with --corrections_voice voice, on the "
        "corrections) lies outside [1/X, X] is never accepted",
    )

    def problems(self) -> list[str]:
        # --learning_rate 0 is this script's "fitted to the voice" (the shared check wants a positive rate)
        problems = [p for p in super().problems() if not (self.learning_rate == 0 and p.startswith("--learning_rate "))]
        if self.learning_rate < 0:
            problems.append(f"--learning_rate {self.learning_rate}: must be 0 (fitted to the voice) or more")
        if self.target_hours <= 0 and self.target_minutes <= 0:
            problems.append("--target_minutes (or --target_hours) must be positive")
        if not 0 <= self.timbre_first < 1:
            problems.append(f"--timbre_first {self.timbre_first}: give a share from 0 up to (not including) 1")
        if not 0 <= self.holdout_share < 1:
            problems.append(f"--holdout_share {self.holdout_share}: give a share from 0 up to (not including) 1")
        for name in ("replay_ratio", "target_hours"):
            if getattr(self, name) < 0:
                problems.append(f"--{name} {getattr(self, name)}: must be 0 or more")
        if self.text_anchor_weight < 0 and self.text_anchor_weight != -1:
            problems.append(
                f"--text_anchor_weight {self.text_anchor_weight}: must be 0 or more, or -1 (by what the round trains)"
            )
        if self.corrections_voice not in ("own", "voice"):
            problems.append(f"--corrections_voice {self.corrections_voice}: choose own or voice")
        if sum(map(bool, (self.rollback, self.review, self.find))) > 1:
            problems.append("--rollback, --review and --find are separate actions: give one")
        if self.find < 0 or self.find_minutes <= 0:
            problems.append("--find must be 0 (off) or a number of clips, and --find_minutes positive")
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


def act(config: FeedbackConfig, clock) -> int:
    """Roll back, review, or run a round, in the voices folder this process holds."""
    from finetune.feedback import recipe  # torch and transformers load here, once the flags are read

    versions = recipe.open_versions(config)  # what a killed round left put right first
    if config.rollback:  # actions that do not train: roll back, or speak sentences for review
        previous, now = versions.rollback(config.rollback)
        print(f"rolled back: current voice is now {now} (was {previous}); {versions.current} holds it")
        return 0
    base = recipe.base_model_dir(config, versions)
    if config.review:
        return recipe.review(config, base)
    if config.find:
        from finetune.feedback import crowd

        return crowd.run(config, base)
    stop = interrupt.StopRequest()
    dist = recipe.processes(config)
    with stop.installed():  # from the start: Ctrl-C while preparing or loading stops within seconds too
        finished = False
        try:
            code = feedback_round(config, versions, base, clock or Clock(), stop, dist)
            finished = True
            return code
        except interrupt.StopRequested as request:
            print(
                f"interrupted ({request.signal_name}): the current voice is unchanged; run again to start a new round",
                file=sys.stderr,
            )
            return stop.exit_status
        finally:
            dist.close(finished)


def feedback_round(config: FeedbackConfig, versions, base: Path, clock, stop, dist) -> int:
    """A round: data, model, "before" renders, the training loop, then the decision and the report. In a
    data-parallel launch every process trains; the main one renders, decides and makes the version."""
    from finetune.feedback import recipe, round_data, voice_run

    round_ = recipe.start_round(config, versions, base, clock, stop, dist)  # its folder, log, budget, device
    voice_run.fit_rate(config, base, round_.logger)  # a share of the rate the voice was trained at, unless given
    if dist.is_main and (config.app_model_dir or "app_model_dir" not in versions.history()):  # found once a voice
        versions.set_app_folder(voice_run.app_folder(config, versions, base))
    data = round_data.load_round_data(config, round_, base, versions)  # corrections, what they fix, held out, replay
    start = recipe.starting_point(config, round_, data, base)  # what the round may move, the discriminator
    rendering = round_.budget.used_s()
    before = recipe.render_before(round_, data, base) if dist.is_main else {}  # and the words said differently
    render_s = round_.budget.used_s() - rendering + data.before_s  # made while the focus was heard, when it was
    held_s = render_s * len(data.held) / max(1, len(data.corrections.examples))  # the held-out judged, alike
    reserve_s = recipe.after_loop_reserve_s(render_s, base, held_s)  # the "after" renders, alike
    trainer, evaluator, result = recipe.fit_round(config, round_, data, start, base, dist.broadcast(reserve_s))
    trainer.context.run_log.end(trainer.summary(result.stop_reason))
    if result.stop_reason == "interrupted":
        round_.logger.info(
            f"interrupted: the current voice is unchanged; {round_.folder} keeps what was done. "
            "Run again to start a new round"
        )
        return stop.exit_status
    if not dist.is_main:
        return 0
    return recipe.conclude_round(config, round_, data, versions, base, trainer, evaluator, result, before)


if __name__ == "__main__":
    exit_process(run_script(main))  # no interpreter teardown after the budget's last line (finetune/cli.py)
