#!/usr/bin/env python3
"""Fine-tune a VITS model on a prepared corpus inside a time budget, keeping the best model.

    python train_vits.py --target_hours 9.5          # the whole run, final save included, fits 9.5 h
    python train_vits.py --max_samples 1000          # a smoke run on a subset
    python train_vits.py --resume auto               # continue an interrupted run with the same budget

The clock starts when the process starts. The first steps are timed and the run is planned to end
inside the budget; the learning rate warms up, then follows a cosine that reaches its floor at the
last step. Held-out clips are synthesised and scored (mel-cepstral distortion, timing) at each
evaluation; CHECKPOINT_DIR/best_model is the best so far (within the timing rule, else the nearest to
it), OUTPUT_DIR a copy of it at the end (the voice to load) and CHECKPOINT_DIR/last_model the last
weights; each loads with VitsModel.from_pretrained and pipeline("text-to-speech"), carries a model card
(README.md) and the discriminator. --push_to_hub REPO_ID uploads OUTPUT_DIR at the end.
Ctrl-C or SIGTERM saves a checkpoint and exits; --resume auto continues.

Exit status: 0 finished, 1 bad data or model, 2 bad flags, 130/143 interrupted (checkpoint saved).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from finetune.cli import exit_process, flag, given_flags, parse_config, run_script
from finetune.data import speakers
from finetune.settings import TrainingFlags
from finetune.system import interrupt
from finetune.system.run_lock import hold_for_launch
from finetune.training.budget import Clock

# What a resumed run takes from this command line is said in each flag's declaration (on_resume): the budget,
# where it runs, what it writes and how often may change; every other flag keeps the checkpoint's value.


@dataclass
class TrainConfig(TrainingFlags):
    """train_vits.py's flags: the shared training flags (finetune/settings.py) and these."""

    data_dir: str = flag(
        "training", "prepared corpus: wavs/, metadata.csv, metadata_val.csv (prepare_data.py)", on_resume="may_change"
    )
    checkpoint_dir: str = flag(
        "training/checkpoints",
        "run folder: checkpoints, best_model/, samples/, logs, metrics",
        on_resume="command_line",
    )
    output_dir: str = flag(
        "training/final_model",
        "the voice to load: a copy of best_model at the end (Hugging Face "
        "format + discriminator.pt); the last weights go to CHECKPOINT_DIR/last_model",
        on_resume="may_change",
    )
    model_name: str = flag(
        "facebook/mms-tts-kmr-script_latin",
        "starting model: hub id, local folder, or scratch[:tiny|small|mms] (new weights)",
    )
    target_hours: float = flag(
        9.5, "time budget for the whole run, start-up and final save included (hours)", on_resume="may_change"
    )
    max_samples: int = flag(0, "train on the first N clips of metadata.csv only (0: all)")
    resume: str = flag(
        "none",
        "auto: newest checkpoint in --checkpoint_dir if any; none: a new run; or a checkpoint path",
        on_resume="command_line",
    )
    num_workers: int = flag(-1, "DataLoader worker processes (-1: 2 with CUDA, 0 on CPU)", on_resume="may_change")
    precompute_mels: bool | None = flag(
        None,
        "precompute spectrograms into RAM (default: on CPU yes, with CUDA no; falls back when RAM is short)",
        on_resume="may_change",
    )
    early_stopping_patience: int = flag(
        0, "stop after N evaluations without a better score (0: never)", on_resume="may_change"
    )
    discriminator: str | None = flag(
        None,
        "discriminator to start from: this tool's discriminator.pt or an original VITS D_*.pth",
        on_resume="command_line",
    )
    discriminator_periods: list[int] = flag([2, 3, 5, 7, 11], "periods of a new discriminator's period discriminators")
    discriminator_scales: int = flag(
        1, "scale discriminators of a new discriminator (1: standard VITS; 0: the period ones alone)"
    )
    keep_checkpoints: int = flag(
        3, "checkpoints kept in --checkpoint_dir (older ones are deleted)", on_resume="may_change"
    )
    checkpoint_every_minutes: float = flag(
        30.0, "also checkpoint this often inside an epoch (minutes)", on_resume="may_change"
    )
    checkpoint_min_minutes: float = flag(
        10.0,
        "at most one checkpoint every N minutes: an epoch's end sooner than that after the last writes none (a "
        "small corpus on a GPU ends an epoch every minute or two; an MMS-size checkpoint is about 1 GB); the first "
        "and the final checkpoint are always written (0: one every epoch)",
        on_resume="may_change",
    )
    test_sentences: str | None = flag(
        None,
        "text file, one sentence a line, synthesised at each evaluation (default: three built-in Kurmanji sentences)",
        on_resume="may_change",
    )
    report_to: list[str] = flag(
        ["auto"],
        "trackers besides train.log and metrics.jsonl: auto (TensorBoard when installed), tensorboard, wandb, none",
        on_resume="may_change",
    )
    naturalness: bool | None = flag(
        None,
        "score held-out speech with DNSMOS (reported, not part of choosing best_model; "
        "default: on with CUDA when requirements-naturalness.txt is installed, off on CPU)",
        on_resume="may_change",
    )
    push_to_hub: str | None = flag(
        None,
        "after the final save, upload --output_dir to this Hugging Face repository "
        "(needs a token: hf auth login); checked before training starts",
        on_resume="may_change",
    )
    target_speaker: str | None = flag(
        None,
        "a multi-speaker corpus: the voice to speak in, judge and export (default: "
        "the speaker with the most hours; prepare_report.html lists them)",
    )
    speakers: str = flag(
        "auto",
        "a multi-speaker corpus: conditioned (every clip, each speaker its own "
        "embedding; the target exported alone), pooled (every clip as one voice), "
        "target_only (the target's clips only) or auto (target_only from a pretrained voice, "
        "conditioned from new weights: docs/training.md says why)",
    )
    target_share: float = flag(
        0.9,
        "--speakers conditioned: the target's clips are repeated until they are this "
        "share of each epoch's draws (0: as many as it has; docs/training.md says why 0.9)",
    )
    hub_private: bool = flag(
        True, "create the --push_to_hub repository private (--no-hub_private: public)", on_resume="may_change"
    )

    def problems(self) -> list[str]:
        problems = super().problems()
        problems += [
            f"--{k} {v}: must be positive"
            for k, v in {
                "target_hours": self.target_hours,
                "checkpoint_every_minutes": self.checkpoint_every_minutes,
            }.items()
            if v <= 0
        ]
        problems += [
            f"--{k} {v}: must be 0 or more"
            for k, v in {
                "max_samples": self.max_samples,
                "early_stopping_patience": self.early_stopping_patience,
                "checkpoint_min_minutes": self.checkpoint_min_minutes,
            }.items()
            if v < 0
        ]
        if self.keep_checkpoints < 1:
            problems.append(f"--keep_checkpoints {self.keep_checkpoints}: keep at least 1")
        if not 0 <= self.target_share < 1:
            problems.append(f"--target_share {self.target_share}: give a share from 0 up to (not including) 1")
        if self.speakers not in (*speakers.MODES, speakers.AUTO):
            problems.append(f"--speakers {self.speakers}: choose auto, conditioned, pooled or target_only")
        from finetune.reporting.tracking import check_trackers  # after parsing: --help does not wait for it

        problems += check_trackers(self.report_to)
        if self.discriminator_scales < 0 or (self.discriminator_scales == 0 and not self.discriminator_periods):
            problems.append(
                f"--discriminator_scales {self.discriminator_scales}: 0 or more, and 0 only with "
                "--discriminator_periods (a discriminator needs at least one part)"
            )
        if self.discriminator and not Path(self.discriminator).is_file():
            problems.append(f"--discriminator {self.discriminator}: no such file")
        if self.test_sentences and not Path(self.test_sentences).is_file():
            problems.append(f"--test_sentences {self.test_sentences}: no such file")
        return problems


def main(argv: list[str] | None = None, clock=None, step_callback=None) -> int:
    config = parse_config(TrainConfig, argv, __doc__)
    lock = hold_for_launch(config.checkpoint_dir)  # one run per folder: a second is refused here, in seconds
    stop = interrupt.StopRequest()
    try:
        with stop.installed():  # from the start: Ctrl-C while loading stops within seconds too
            try:
                return train(config, given_flags(TrainConfig, argv), clock or Clock(), step_callback, stop)
            except interrupt.StopRequested as request:
                resumed = "the checkpoints in --checkpoint_dir are as they were; " if config.resume != "none" else ""
                print(
                    f"interrupted ({request.signal_name}) before training started: nothing was trained; {resumed}"
                    "run the command again to start",
                    file=sys.stderr,
                )
                return stop.exit_status
    finally:
        if lock is not None:
            lock.release()


def train(config: TrainConfig, given: set[str], clock, step_callback, stop) -> int:
    """The recipe: the run folder (and what it resumes), then the training in it; the process group (under
    torchrun) is left last, once the training's objects are gone."""
    from finetune.recipes import train as recipe  # torch and transformers load here, once the flags are read

    run, config = recipe.open_run(config, given, clock, stop)  # run folder, resumed checkpoint, budget, device
    finished = False
    try:
        recipe.check_hub(config)  # on the settings the run goes on with: a resumed run uploads by its checkpoint's
        code = fit_and_report(config, run, step_callback)  # its objects are gone once it returns
        finished = True
        return code
    finally:
        recipe.close(run, finished)


def fit_and_report(config: TrainConfig, run, step_callback) -> int:
    """Model, data, loop, fit, report: the plan is made inside the fit, once its first steps are timed."""
    from finetune.recipes import train as recipe

    model = recipe.build_model(config, run)  # the generator (pretrained, new or resumed) and the corpus's speakers
    data = recipe.load_data(config, run, model)  # the clips in RAM after the memory check, length-bucketed
    trainer = recipe.build_loop(config, run, model, data, step_callback)  # discriminator, evaluation, checkpoints
    if not recipe.ready_to_train(config, run, model, data):
        return 1
    result = recipe.fit(run, trainer)  # benchmark, plan, warm-up, steps, evaluations, the final save
    return 1 if result is None else recipe.report_end(config, run, trainer, result)  # closing lines, upload


if __name__ == "__main__":
    exit_process(run_script(main))  # no interpreter teardown after the budget's last line (finetune/cli.py)
