#!/usr/bin/env python3
"""The same start, the same clips, the same wall budget, one judge: this tool beside finetune-hf-vits.

    python bench/bench_peers.py --base_model DIR --data_dir DIR --budget_s 180 --work_dir W \\
        --peer_dir finetune-hf-vits=PATH [--seeds 2] [--learning_rate 1e-3] [--levers clip1 dur8]
    python bench/bench_peers.py --scenario tiny --work_dir W --peer_dir finetune-hf-vits=PATH --budget_s 180
    python bench/bench_peers.py --scenario small ...  # the same with an 11M-parameter voice (scratch:small)
    python bench/bench_peers.py --scenario mms ...    # the MMS-TTS shape (36M), for a GPU
    python bench/bench_peers.py --smoke            # ours alone on a few clips, seconds of training

The start: --base_model, a voice folder this tool wrote (config.json, weights, tokenizer, discriminator.pt),
and --data_dir, a corpus prepared for it (prepare_data.py: wavs/, metadata.csv, metadata_val.csv). Or
--scenario NAME: this script makes both as bench/scenarios/NAME.json says (tiny, small, mms: voice A's scratch
shape, pretraining hours and rate; B, A's recordings played 1.25x slower and lower; the budgets and rates the
races ran at), with a discriminator finetune-hf-vits can hold too (the period discriminators alone, width 1/16). A start whose own
tempo fit was held at a limit of speaking_rate (a short pretraining from new weights) is warned of: ours judges
timing at the start's config.json settings, so its runs may keep the start (start_tempo_held).

The held-out clips are split: the first --eval_clips are what this tool's runs evaluate on (as a user's
run would), the rest are the judge's: no run sees them.

Systems (--systems), each --seeds times, one after another on this machine:
  ours         train_vits.py with every flag at its default but the budget, the start (--model_name,
               --discriminator) and --learning_rate (default: this tool's default); each run a new
               interpreter, as the peer's is, so its start-up and imports count in its wall time
  ours+LEVER   the same with one recipe difference changed (--levers; LEVERS below)
  fhv          finetune-hf-vits (ylacombe/finetune-hf-vits, the checkout of --peer_dir, in a venv of its own
               with the versions of its time, PEER_VERSIONS, or the interpreter --peer_python names), started
               the way its README says
               (convert_original_discriminator_checkpoint.py on our generator and our discriminator written
               as an original VITS D_*.pth), run with its documented MMS fine-tuning config
               (training_config_examples/finetune_mms.json: learning rate 2e-5, batch 16, its loss weights,
               an evaluation every 50 steps, fp16 where a GPU is) on the same clips, stopped at the budget
               (killed: it has no time limit), its clips filtered and preprocessed by a first, untimed
               launch before the timed runs (as a user's second run on them finds them); a training state
               saved every --peer_save_steps steps makes its curve, and the last one saved is its result
               (the time it was saved is printed: a coarse --peer_save_steps leaves the peer's result that
               much short of the budget)
  fhv@lr       the same at --learning_rate, so that a difference is not a learning rate alone
  fhv@RATE     the same at RATE (fhv@2e-3): a sweep of the peer's rate in one call, each in a folder and
               a results.json entry of its own (`--systems fhv@1e-3 fhv@2e-3 fhv@4e-3`)

--peer_results W2/results.json puts the peer's runs of another call (the same start and judge clips, another
budget) beside this call's: ours given half the peer's budget, against the peer's final quality.

The judge, the same for every model: stock transformers (VitsModel.forward on the text, one request a
sentence, --judge_seeds seeds) on the judge's clips (all, or the first --judge_clips): the mean MCD-DTW
against the recordings (each clip's mean over seeds), and the median length of a request over the
recording's. Every model a run saved on the way (ours: each whole evaluation's; the peer: each saved state)
is judged too: the curve of the judge's MCD against wall time since launch, and from it each system's time
to reach a quality (interpolated between the curve's points, which are tens of seconds apart; the first
point below it is printed as the bound).

How far apart two systems are, beyond the noise: each system's final models against each peer's, 1 - its mean
judge MCD over the peer's, with a 95% interval from a paired bootstrap over the judge's clips (the judge's
noise) and the figure for every seed against every seed of the peer (the training's noise, which the
clips' interval leaves out). A difference is beyond the noise where the interval and every seed pair
agree in sign.

Where a lead is made: each system's judge MCD at each quarter of the budget (a run's last judged model by then,
the start before its first; at the end its result), seeds averaged. `--systems` left empty prints the tables of
an existing W/results.json again, with no run (the start is judged again).

Outputs: W/<system>_s<seed>/final_model/ (a transformers folder), W/results.json (with the tables' figures
under "table", "nearer" and "lead"), and the tables.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.bench_selection import judge_model as judge  # the same judge as the kept-model bench
from bench.launcher import run_script, wait_passing_stops
from bench.machine import describe
from bench.peer_venv import made_venv, run

REPO = Path(__file__).resolve().parent.parent

# The peer's requirements name floors only (transformers>=4.35.1, datasets[audio]>=2.14.7, accelerate>=0.24.1);
# these are the releases of its last commit's time (6f3f51f, 2024-02-12), which its code was written against
# (datasets 2.x also decodes audio with soundfile, where 4.x needs torchcodec). PyTorch is the one on this
# machine (2.13.0, CPU); numpy below 2, pyarrow and pandas of then, for the transformers and datasets of then.
PEER_VERSIONS = [
    "transformers==4.37.2",
    "datasets[audio]==2.17.1",
    "accelerate==0.27.2",
    "numpy<2",
    "Cython",
    "pyarrow==15.0.0",
    "pandas==2.2.0",
    "matplotlib==3.8.2",
    "tensorboard",
    "soundfile",
    "librosa",
    "safetensors",
    "torch==2.13.0",
]

# One recipe difference each (issue 35): this tool's flags that change it.
LEVERS = {
    "constant_lr": ["--lr_floor_ratio", "1", "--warmup_steps", "0"],
    "no_warmup": ["--warmup_steps", "0"],  # the cosine from the peak at once, the decay kept
    "floor0": ["--lr_floor_ratio", "0"],  # the cosine down to nothing at the budget's end (default: 10% of the peak)
    # the peak held, then the cosine over the last 30% / 50% of the steps after the warm-up (a "warmup, stable,
    # decay" schedule): ours' lead over the peer at the tiny scale is made in its cosine's last third (RESULTS)
    "decay0.3": ["--lr_decay_share", "0.3"],
    "decay0.5": ["--lr_decay_share", "0.5"],
    "mel35_kl1.5": ["--mel_loss_weight", "35", "--kl_loss_weight", "1.5"],
    "dur8": ["--duration_loss_weight", "8"],
    "clip1": ["--max_grad_norm", "1"],
    "eps1e-8": ["--adam_eps", "1e-8"],
    "no_eval": ["--val_every", "1000000"],
    "disc3": ["--discriminator_loss_weight", "3"],
    # how often the discriminator updates (issue 35 part 2): every second step, saving its own pass in the others
    "disc_every2": ["--discriminator_every", "2"],
    # beyond the peer's recipe (issue 35 part 2): the learning rate, what to freeze, the micro-batch,
    # the segment
    "lr5e-4": ["--learning_rate", "5e-4"],
    "lr2e-3": ["--learning_rate", "2e-3"],
    "lr4e-3": ["--learning_rate", "4e-3"],
    "lr8e-3": ["--learning_rate", "8e-3"],
    "lr1.2e-2": ["--learning_rate", "1.2e-2"],
    "lr1.6e-2": ["--learning_rate", "1.6e-2"],
    "freeze_text": ["--freeze", "text_encoder"],
    # the latent space held still: the flow and prior learn against a fixed target, and the posterior
    # encoder's backward (over whole clips, not the decoder's segment) is not paid
    "freeze_posterior": ["--freeze", "posterior_encoder"],
    # the duration predictor held still: no backward through its flows (a step without it at all is x0.86 of
    # one with it at 11M, x0.75 tiny: bench_step.py); it then cannot learn a new tempo, which the timing rule
    # judges at the model's own settings
    "freeze_duration": ["--freeze", "duration_predictor"],
    # the duration predictor learning in every second step: half that cost, its tempo still learned
    "duration_every2": ["--duration_every", "2"],
    "batch4": ["--batch_size", "4"],
    "batch16": ["--batch_size", "16"],
    "seg16": ["--segment_frames", "16"],  # half VITS's segment: faster steps, half the audio each
    # batch composition: clips drawn at random (the peer's), or sorted by length within 4 batches' worth
    "pool1": ["--length_pool_batches", "1"],
    "pool4": ["--length_pool_batches", "4"],
    # the peer trains with dropout off (its model stays in from_pretrained's eval mode), as ours does by default
    # from a pretrained start since --dropout auto; dropout_on is ours before it
    "no_dropout": ["--dropout", "off"],
    "dropout_on": ["--dropout", "on"],
}


# Voice A's pretraining rate by size: scratch:small collapsed on a CPU at 2e-3 and 1e-3 (ninth session), not at
# 5e-4 (tenth session, bench/RESULTS.md); scratch:mms (36M) is given the same, untried on a CPU.
SCENARIOS = REPO / "bench" / "scenarios"  # one JSON file a scenario: voice A's shape and pretraining, B, the race


def load_scenario(name: str) -> dict:
    """bench/scenarios/NAME.json: voice A (its scratch shape, pretraining hours and rate, discriminator), voice B
    (how much slower and lower, the share held out) and the race's budgets and rates (what RESULTS.md reports)."""
    path = SCENARIOS / f"{name}.json"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in SCENARIOS.glob("*.json")))
        raise SystemExit(f"--scenario {name}: no {path}; the scenarios: {known}")
    return json.loads(path.read_text(encoding="utf-8"))


def recipe(script: str, argv: list, log: Path, label: str) -> None:
    code = run_script(REPO / script, [str(a) for a in argv], log)
    if code != 0:
        raise SystemExit(f"{label} failed (exit {code}); see {log}")


# ---------------------------------------------------------------- the start and the clips


def scenario(
    work: Path,
    settings: dict,
    pretrain_hours: float,
    max_samples: int,
    pretrain_rate: float,
    pretrain_flags: tuple[str, ...] = (),
) -> tuple[Path, Path]:
    """Voice A (the scenario's scratch shape) pretrained from scratch on the demo corpus (a discriminator both
    tools can hold), and B's data: A's recordings played slower and lower (the scenario's stretch), prepared
    with A's vocabulary, the scenario's share held out."""
    voice, b = settings["voice_a"], settings["voice_b"]
    from bench.bench_finetune import make_voice_b

    voice_a = work / "voice_a" / "checkpoints" / "best_model"
    if not (voice_a / "config.json").is_file():
        recipe(
            "prepare_data.py",
            [
                "--input_dir",
                REPO / "demo" / "corpus",
                "--data_dir",
                work / "data_a",
                "--model_name",
                voice["model_name"],
                "--val_fraction",
                "0.05",
                "--num_workers",
                "1",
                "--max_samples",
                max_samples,
            ],
            work / "data_a.log",
            "preparing A",
        )
        smoke = ["--max_epochs", "1", "--val_samples", "2", "--benchmark_samples", "4"] if max_samples else []
        recipe(
            "train_vits.py",
            [
                "--data_dir",
                work / "data_a",
                "--checkpoint_dir",
                work / "voice_a" / "checkpoints",
                "--output_dir",
                work / "voice_a" / "final_model",
                "--model_name",
                voice["model_name"],
                "--target_hours",
                pretrain_hours,
                "--discriminator_width",
                voice["discriminator_width"],
                "--discriminator_scales",
                voice["discriminator_scales"],
                "--learning_rate",
                pretrain_rate,
                "--gradient_accumulation_steps",
                "1",
                "--log_every_seconds",
                "60",
                *smoke,
                *pretrain_flags,
            ],
            work / "voice_a.log",
            "pretraining A",
        )
    if not (voice_a / "config.json").is_file():
        voice_a = work / "voice_a" / "final_model"
    elif (voice_a / "eval.json").is_file() and json.loads((voice_a / "eval.json").read_text()).get("step") == 0:
        # a short pretraining whose evaluations all missed the timing rule keeps its step 0 (new weights) as
        # the fallback best_model (seen on the H200 with 54 s of it): the start is its last weights instead
        voice_a = work / "voice_a" / "checkpoints" / "last_model"
    if start_says_nothing(voice_a):
        raise SystemExit(
            f"voice A ({voice_a}) says nothing: its pretraining collapsed (as two scratch:small ones did on a CPU, at "
            f"2e-3 and 1e-3, bench/RESULTS.md); delete {work / 'voice_a'} and pretrain again at a lower "
            "--pretrain_learning_rate"
        )
    data_b = work / "data_b"
    if not (data_b / "metadata.csv").is_file():
        shutil.rmtree(work / "corpus_b", ignore_errors=True)
        make_voice_b(work / "data_a", work / "corpus_b", b["stretch"], b["semitones"])
        recipe(
            "prepare_data.py",
            [
                "--input_dir",
                work / "corpus_b",
                "--data_dir",
                data_b,
                "--model_name",
                voice_a,
                "--val_fraction",
                b["val_fraction"],
                "--num_workers",
                "1",
            ],
            work / "data_b.log",
            "preparing B",
        )
    return voice_a, data_b


def start_says_nothing(voice: Path) -> bool:
    """Whether a voice folder speaks a demo sentence as a constant signal (finetune/reporting/evaluation.py)."""
    import torch
    from transformers import AutoTokenizer, VitsModel

    from finetune.reporting.evaluation import says_nothing

    model, tokenizer = VitsModel.from_pretrained(str(voice)).eval(), AutoTokenizer.from_pretrained(str(voice))
    torch.manual_seed(0)
    with torch.no_grad():
        waveform = model(**tokenizer("ez baş im, tu çawa yî?", return_tensors="pt")).waveform[0]
    return says_nothing(waveform.numpy())


def start_tempo_held(voice: Path) -> str:
    """The note of the start's own tempo fit when its speaking_rate was held at a limit of the fit ("" otherwise,
    or for a folder without this tool's eval.json): the start's duration predictor is then far from its
    recordings, and that held speaking_rate is what a fine-tune's evaluations judge its timing at."""
    from finetune.vits.tempo_fit import MAX_RATE, MIN_RATE

    eval_json = voice / "eval.json"
    if not eval_json.is_file():
        return ""
    fitted = json.loads(eval_json.read_text()).get("inference_settings", {})
    rate = fitted.get("speaking_rate")
    if rate is None or MIN_RATE < rate < MAX_RATE:
        return ""
    return fitted.get("note") or f"speaking_rate {rate:g}, a limit of the fit"


def split_held_out(
    data_dir: Path, work: Path, eval_clips: int, judge_clips: int = 0
) -> tuple[Path, list[tuple[str, str]]]:
    """W/data: the training clips as they are, the first `eval_clips` held-out clips as the runs'
    metadata_val.csv; the other held-out clips (the first `judge_clips` of them; 0: all), the judge's
    (id, text)."""
    from finetune.data.metadata import read_rows

    held = [(item, text) for item, _, text in read_rows(data_dir / "metadata_val.csv")]
    if len(held) < eval_clips + 4:
        raise SystemExit(
            f"{data_dir}/metadata_val.csv holds {len(held)} clips: at least {eval_clips + 4} are needed "
            f"({eval_clips} for the runs' evaluations, the rest for the judge); prepare with a larger "
            "--val_fraction"
        )
    data = work / "data"
    shutil.rmtree(data, ignore_errors=True)
    data.mkdir(parents=True)
    (data / "wavs").symlink_to((data_dir / "wavs").resolve())
    shutil.copyfile(data_dir / "metadata.csv", data / "metadata.csv")
    (data / "metadata_val.csv").write_text("".join(f"{i}|{t}\n" for i, t in held[:eval_clips]), encoding="utf-8")
    judged = held[eval_clips : eval_clips + judge_clips] if judge_clips else held[eval_clips:]
    (data / "judge.csv").write_text("".join(f"{i}|{t}\n" for i, t in judged), encoding="utf-8")
    return data, judged


# ---------------------------------------------------------------- ours


def child(record_dir: str, argv: list[str]) -> int:
    """train_vits.main with each whole evaluation's model saved to RECORD/curve/step_N/ (and the seconds
    since its interpreter started that it was saved at): the curve (runs in an interpreter of its own)."""
    import train_vits
    from finetune.cli import run_script as run_recipe
    from finetune.training.budget import seconds_since_process_start
    from finetune.training.run_evaluations import Evaluations
    from finetune.vits.voice_on_disk import export_model

    folder = Path(record_dir)
    real = Evaluations.keep_if_best

    def keep_if_best(self, result, final=False):
        kept = real(self, result, final)
        if result.clips_scored == result.clips_planned:
            saved = folder / "curve" / f"step_{result.step:06d}"
            export_model(self.model, self.exports.saver.tokenizer, saved)
            (saved / "wall_s.txt").write_text(f"{seconds_since_process_start():.2f}\n")
        return kept

    Evaluations.keep_if_best = keep_if_best
    return run_recipe(lambda: train_vits.main(argv))


def run_ours(args, base: Path, data: Path, folder: Path, seed: int, extra: list[str]) -> dict:
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    flags = [
        "--data_dir",
        data,
        "--checkpoint_dir",
        folder / "checkpoints",
        "--output_dir",
        folder / "final_model",
        "--model_name",
        base,
        "--target_hours",
        args.budget_s / 3600,
        "--seed",
        seed,
        "--val_samples",
        args.eval_clips,
        "--log_every_seconds",
        "60",
        *(["--discriminator", base / "discriminator.pt"] if (base / "discriminator.pt").is_file() else []),
        *(["--learning_rate", args.learning_rate] if args.learning_rate else []),
        *extra,
        *args.ours_flags,
    ]
    # A new interpreter, as the peer's run and a user's `python train_vits.py` are: its start-up and imports
    # count against its budget and its wall time (a fork of this process would skip them: 4.4 s of a 180 s
    # budget on a 2-core CPU, bench/RESULTS.md).
    started = time.perf_counter()
    run(
        [sys.executable, Path(__file__).resolve(), "--child_record", folder, "--", *flags],
        folder / "run.log",
        "ours",
        cwd=REPO,
    )
    wall = time.perf_counter() - started
    end = [
        json.loads(line)
        for line in (folder / "checkpoints" / "metrics.jsonl").read_text().splitlines()
        if '"kind": "end"' in line
    ][-1]
    return {
        "wall_s": round(wall, 1),
        "steps": end["steps"],
        "samples_seen": end["samples_seen"],
        "final_model": str(folder / "final_model"),
        "curve": {float((p / "wall_s.txt").read_text()): str(p) for p in sorted((folder / "curve").glob("step_*"))},
    }


# ---------------------------------------------------------------- finetune-hf-vits


def peer_venv(peer: Path, work: Path, given: str | None) -> Path:
    """The peer's own environment (made once, in W/fhv_venv: PEER_VERSIONS), or the interpreter --peer_python
    names (a machine with no package registry brings its own); its monotonic_align built with it."""
    python = Path(given) if given else made_venv(work / "fhv_venv", PEER_VERSIONS, work, "fhv")
    build = peer / "monotonic_align"
    if not list(build.glob("**/core*.so")):  # its README: cd monotonic_align; mkdir monotonic_align; build in place
        (build / "monotonic_align").mkdir(exist_ok=True)
        run(
            [python, "setup.py", "build_ext", "--inplace"],
            work / "fhv_build.log",
            "building its monotonic_align",
            cwd=build,
        )
    return python


def peer_env(work: Path | None = None) -> dict:
    """The peer's environment: offline, no wandb; with `work`, its `datasets` cache in that work folder's
    peer_datasets (so that what it prepared for a call's runs is theirs alone, whatever ~/.cache holds)."""
    return {
        **os.environ,
        **({"HF_DATASETS_CACHE": str(peer_datasets(work))} if work is not None else {}),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "WANDB_DISABLED": "true",
        "WANDB_MODE": "disabled",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "PYTHONPATH": "",
        "TOKENIZERS_PARALLELISM": "false",
    }


def peer_start(python: Path, peer: Path, base: Path, work: Path) -> Path:
    """Our starting voice converted as the peer's README says: its conversion script on our generator and our
    discriminator (written as an original VITS D_*.pth); the discriminator's shape goes into the config."""
    import torch

    from finetune.vits.discriminator import (
        PERIOD_CHANNELS,
        SCALE_CHANNELS,
        load_discriminator,
        scaled,
        to_original_layout,
    )

    start = work / "fhv_start"
    if (start / "config.json").is_file():
        return start
    loaded = load_discriminator(base / "discriminator.pt").discriminator
    config = loaded.config
    generator = work / "fhv_generator"
    shutil.rmtree(generator, ignore_errors=True)
    shutil.copytree(base, generator, ignore=shutil.ignore_patterns("discriminator.pt", "multi_speaker"))
    settings = json.loads((generator / "config.json").read_text())
    settings.update(
        discriminator_periods=list(config.periods),
        discriminator_period_channels=[1] + [scaled(c, config.width) for c in PERIOD_CHANNELS[:4]],
        discriminator_scale_channels=(
            None if config.scales == 0 else [1] + [scaled(c, config.width) for c in SCALE_CHANNELS[:4]]
        ),
    )
    if config.scales > 1 or (config.scales == 1 and config.width != 1.0):
        raise SystemExit(
            "finetune-hf-vits holds the standard discriminator (width 1) or period discriminators alone "
            f"at any width; this start's is width {config.width} with {config.scales} scale discriminator(s)"
        )
    (generator / "config.json").write_text(json.dumps(settings, indent=2))
    torch.save({"model": to_original_layout(loaded), "iteration": 0}, work / "D_start.pth")
    run(
        [
            python,
            "convert_original_discriminator_checkpoint.py",
            "--checkpoint_path",
            work / "D_start.pth",
            "--generator_checkpoint_path",
            generator,
            "--pytorch_dump_folder_path",
            start,
        ],
        work / "fhv_convert.log",
        "the peer's conversion",
        env=peer_env(),
        cwd=peer,
    )
    return start


def peer_data(data: Path, work: Path) -> Path:
    """The training clips as an audiofolder the peer's load_dataset reads (file_name, text)."""
    import csv

    from finetune.data.metadata import read_rows

    folder = work / "fhv_data"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    with open(folder / "metadata.csv", "w", newline="", encoding="utf-8") as out:
        writer = csv.writer(out)
        writer.writerow(["file_name", "text"])
        for item, _, text in read_rows(data / "metadata.csv"):
            source = (data / "wavs" / f"{item}.wav").resolve()
            try:  # a file of its own: the peer's datasets finds no audio behind symbolic links (a plain csv)
                os.link(source, folder / f"{item}.wav")
            except OSError:  # another filesystem
                shutil.copyfile(source, folder / f"{item}.wav")
            writer.writerow([f"{item}.wav", text])
    return folder


def peer_config(
    peer: Path, start: Path, clips: Path, out: Path, seed: int, learning_rate: float | None, save_steps: int
) -> Path:
    """Its documented MMS config with our start, clips and folders, offline (no hub, no wandb); fp16 as
    documented where a GPU is (its Accelerator takes it), off on the CPU; the rest as documented."""
    import torch

    config = json.loads((peer / "training_config_examples" / "finetune_mms.json").read_text())
    for key in (
        "hub_model_id",
        "dataset_config_name",
        "speaker_id_column_name",
        "override_speaker_embeddings",
        "filter_on_speaker_id",
    ):
        config.pop(key, None)
    config.update(
        push_to_hub=False,
        report_to=["tensorboard"],
        output_dir=str(out),
        project_name="bench_peers",
        dataset_name=str(clips),
        model_name_or_path=str(start),
        fp16=bool(config.get("fp16")) and torch.cuda.is_available(),
        seed=seed,
        full_generation_sample_text="rojbaş, tu çawa yî",
        preprocessing_num_workers=1,
        num_train_epochs=100000,
        save_steps=save_steps,
        save_total_limit=None,
        **({"learning_rate": learning_rate} if learning_rate else {}),
    )
    path = out.parent / "fhv_config.json"
    path.write_text(json.dumps(config, indent=2))
    return path


TRAINING_STARTS = "***** Running training *****"  # what the peer logs once its clips are ready and its steps begin


def peer_datasets(work: Path) -> Path:
    """Where the peer's `datasets` keeps the clips it filtered and preprocessed (its HF_DATASETS_CACHE)."""
    return work / "fhv_datasets"


def launch_peer(python: Path, peer: Path, config: Path, log, work: Path) -> subprocess.Popen:
    """The peer's training script on `config`, in a session of its own (so that ending it takes its workers)."""
    return subprocess.Popen(
        [str(python), "run_vits_finetuning.py", str(config)],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=peer,
        env=peer_env(work),
        start_new_session=True,
    )


def end_group(process: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


def prepare_peer_clips(
    python: Path, peer: Path, start: Path, clips: Path, work: Path, timeout_s: float = 1800.0
) -> float:
    """The peer's first launch on these clips, untimed, ended as soon as its training starts: it filters and
    preprocesses them into peer_datasets(work), so that every timed run finds them ready, as a user's second
    run on the same clips does. Without it the first timed run paid for it and the next did not (tiny scale,
    2-core CPU: 45 s of a 180 s budget to its first step, against 9 s for the next seed). Returns its seconds."""
    folder = work / "fhv_prepare"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    config = peer_config(peer, start, clips, folder / "out", 0, None, 1_000_000)
    log_path, started = folder / "run.log", time.perf_counter()
    with open(log_path, "w") as log:
        process = launch_peer(python, peer, config, log, work)

        def until_its_training_starts() -> bool:
            while process.poll() is None and time.perf_counter() - started < timeout_s:
                if TRAINING_STARTS in log_path.read_text(errors="replace"):
                    return True
                time.sleep(0.2)
            return TRAINING_STARTS in log_path.read_text(errors="replace")

        ready = wait_passing_stops(until_its_training_starts, lambda _signum: end_group(process))
        end_group(process)
        process.wait()
    if not ready:
        raise SystemExit(
            f"finetune-hf-vits did not get to its training in {timeout_s:.0f} s while preparing its clips "
            f"(exit {process.returncode}); see {log_path}"
        )
    shutil.rmtree(folder / "out", ignore_errors=True)
    return time.perf_counter() - started


def run_peer(
    args, python: Path, peer: Path, start: Path, clips: Path, folder: Path, seed: int, learning_rate: float | None
) -> dict:
    """The peer's training, launched and killed at the budget (its clips prepared already: prepare_peer_clips);
    each saved state exported as a voice."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    config = peer_config(peer, start, clips, folder / "out", seed, learning_rate, args.peer_save_steps)
    started = time.perf_counter()
    with open(folder / "run.log", "w") as log:
        process = launch_peer(python, peer, config, log, folder.parent)
        saved_at: dict[str, float] = {}

        def until_the_budget() -> None:
            while process.poll() is None and time.perf_counter() - started < args.budget_s:
                time.sleep(0.5)
                for state in (folder / "out").glob("checkpoint-*"):
                    saved_at.setdefault(state.name, time.perf_counter() - started)

        # Its own session (so that the kill at the budget takes its workers too): a stop of this bench is passed
        # on to that whole group, or the peer would train on alone with no limit of its own.
        wait_passing_stops(until_the_budget, lambda _signum: end_group(process))
        if process.poll() is None:
            end_group(process)  # at the budget: what it saved by then is what it made
        elif process.returncode != 0:
            raise SystemExit(
                f"finetune-hf-vits failed before its budget (exit {process.returncode}); see {folder / 'run.log'}"
            )
        process.wait()
    wall = time.perf_counter() - started
    steps = last_peer_step(folder / "run.log")
    curve = {}
    for state in sorted((folder / "out").glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1])):
        if not (state / "model.safetensors").is_file() or state.name not in saved_at:
            continue  # a state the kill interrupted is not a result
        voice = folder / "curve" / state.name
        run(
            [python, REPO / "bench" / "peer_fhv.py", "export", start, state, voice],
            folder / "export.log",
            f"exporting {state}",
            env={**peer_env(), "PYTHONPATH": str(peer)},
            cwd=peer,
        )  # its utils package
        curve[round(saved_at[state.name], 2)] = str(voice)
        shutil.rmtree(state)  # optimizer states: large, and not needed once exported
    final = folder / "final_model"
    if curve:
        shutil.copytree(curve[max(curve)], final)
    return {
        "wall_s": round(wall, 1),
        "steps": steps,
        "final_model": str(final) if curve else None,
        "curve": curve,
        # its result is the last state it saved: this much of the budget trained it (--peer_save_steps)
        "result_saved_at_s": max(curve) if curve else None,
        "learning_rate": learning_rate or json.loads(config.read_text())["learning_rate"],
    }


def last_peer_step(log: Path) -> int:
    """The last optimizer step its progress bar showed (tqdm's "Steps: ... N/M")."""
    import re

    steps = re.findall(r"Steps:\s+\d+%\|[^|]*\|\s*(\d+)/", log.read_text(errors="replace").replace("\r", "\n"))
    return int(steps[-1]) if steps else 0


# ---------------------------------------------------------------- the judge


def judge_examples(data: Path, base: Path) -> list:
    from transformers import VitsTokenizer

    from finetune.data.corpus import load_examples

    examples, _ = load_examples(data, "judge.csv", VitsTokenizer.from_pretrained(str(base)), 256, 16000)
    return examples


def time_to_reach(curve: list[tuple[float, float]], target_db: float) -> tuple[float, float] | None:
    """When the judge's MCD first comes down to `target_db`: (the first curve point at or below it, the time
    interpolated linearly between that point and the one before); None if never. A system's curve points
    are tens of seconds apart (ours: its evaluations), so the first point alone only bounds the time from
    above; the interpolation is the estimate, the point the bound."""
    points = sorted(curve)
    for index, (seconds, mcd) in enumerate(points):
        if mcd <= target_db:
            if index == 0:
                return seconds, seconds
            before_s, before_mcd = points[index - 1]
            share = (before_mcd - target_db) / (before_mcd - mcd)  # before_mcd > target_db >= mcd
            return seconds, before_s + share * (seconds - before_s)
    return None


# ---------------------------------------------------------------- the whole bench


def systems_to_run(args) -> list[tuple[str, list[str]]]:
    names = list(args.systems) + [f"ours+{lever}" for lever in args.levers]
    out = []
    for name in names:
        if name.startswith("ours+"):  # ours+clip1, or several levers at once: ours+clip1+dur8
            levers = name.split("+")[1:]
            unknown = [lever for lever in levers if lever not in LEVERS]
            if unknown:
                raise SystemExit(
                    f"--levers {'+'.join(unknown)}: unknown; one of {', '.join(LEVERS)} (or several joined by +)"
                )
            out.append((name, [flag for lever in levers for flag in LEVERS[lever]]))
        else:
            peer_rate(name, 0.0)  # an unknown system or a rate that is no number stops here, before any run
            out.append((name, []))
    return out


def peer_rate(name: str, learning_rate: float) -> float | None:
    """The learning rate a finetune-hf-vits system runs at: None for fhv (its documented config's),
    --learning_rate for fhv@lr, RATE for fhv@RATE."""
    if name == "fhv":
        return None
    if name == "fhv@lr":
        return learning_rate
    if name.startswith("fhv@"):
        try:
            return float(name[4:])
        except ValueError:
            raise SystemExit(f"--systems {name}: the rate after fhv@ is no number (fhv@2e-3, or fhv@lr)") from None
    if name != "ours":
        raise SystemExit(f"--systems {name}: unknown; ours, fhv, fhv@lr or fhv@RATE (levers: --levers)")
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base_model", help="the starting voice: a folder this tool wrote (with discriminator.pt)")
    parser.add_argument("--data_dir", help="the clips: a corpus prepared for the base model")
    parser.add_argument(
        "--scenario",
        help="make the start and the clips here instead, as bench/scenarios/NAME.json says: tiny (0.7M), small "
        "(11M), mms (36M: the MMS-TTS shape, for a GPU)",
    )
    parser.add_argument(
        "--pretrain_hours", type=float, default=None, help="--scenario: voice A's pretraining (default: the scenario's)"
    )
    parser.add_argument(
        "--pretrain_learning_rate",
        type=float,
        default=None,
        help="--scenario: voice A's pretraining rate (default: the scenario's; small's is 5e-4, since two scratch:small "
        "ones collapsed at 2e-3 and 1e-3 on a CPU and one at 5e-4 did not, bench/RESULTS.md)",
    )
    parser.add_argument(
        "--pretrain_flags",
        default="",
        help="--scenario: more train_vits.py flags for voice A's pretraining, one string (--pretrain_flags=\"--bf16 "
        '--batch_size 16": on a GPU a step of 16 clips costs about what one of 8 does, and fp16 skips many steps of '
        "a voice from new weights, bench/RESULTS.md)",
    )
    parser.add_argument("--budget_s", type=float, default=180.0, help="wall seconds each run gets, launch to result")
    parser.add_argument("--work_dir", default=None)
    parser.add_argument(
        "--peer_dir", action="append", default=[], help="finetune-hf-vits=PATH: a checkout of ylacombe/finetune-hf-vits"
    )
    parser.add_argument(
        "--peer_python",
        help="an interpreter (or a script starting one) that holds finetune-hf-vits's packages: no venv "
        "is made (a machine without a package registry)",
    )
    parser.add_argument("--systems", nargs="*", default=["ours", "fhv", "fhv@lr"])
    parser.add_argument(
        "--levers",
        nargs="*",
        default=[],
        help=f"ours with one change each: {', '.join(LEVERS)}; several joined by + (clip1+dur8) change together",
    )
    parser.add_argument(
        "--ours_flags",
        default="",
        help="more train_vits.py flags for every run of ours, one string "
        '(--ours_flags="--gradient_accumulation_steps 1")',
    )
    parser.add_argument(
        "--learning_rate",
        type=float,
        default=0.0,
        help="ours' learning rate and fhv@lr's (0: this tool's default, and no fhv@lr)",
    )
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument(
        "--first_seed",
        type=int,
        default=0,
        help="run seeds FIRST_SEED.. (a later seed added to results.json: the earlier seeds' runs are kept)",
    )
    parser.add_argument("--eval_clips", type=int, default=16, help="held-out clips the runs evaluate on")
    parser.add_argument("--judge_seeds", type=int, default=2)
    parser.add_argument(
        "--judge_clips",
        type=int,
        default=0,
        help="judge on the first N of the judge's held-out clips (0: all; fewer where judging is the slow part)",
    )
    parser.add_argument("--peer_save_steps", type=int, default=50, help="the peer saves its state this often")
    parser.add_argument(
        "--peer_results",
        action="append",
        default=[],
        help="another work folder's results.json, of the same start and judge clips at another budget: its peer "
        "runs join the tables as 'fhv@2e-3 at 360 s' (ours at half the budget beside the peer at the whole)",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="ours alone on the tiny scenario with 24 clips, a few steps (figures mean nothing)",
    )
    parser.add_argument("--child_record", help=argparse.SUPPRESS)
    parser.add_argument("rest", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_record:
        sys.exit(child(args.child_record, args.rest))
    args.ours_flags = shlex.split(args.ours_flags)
    if args.judge_clips < 0:
        parser.error(f"--judge_clips {args.judge_clips}: give a count of clips, or 0 for all")
    print(f"machine: {describe()}", flush=True)
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="bench_peers_")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    print(f"work folder: {work}", flush=True)
    if args.smoke:
        args.scenario, args.systems, args.seeds, args.eval_clips, args.judge_seeds = "tiny", ["ours"], 1, 2, 1
        args.ours_flags += ["--max_epochs", "1", "--benchmark_samples", "4"]
        args.budget_s = max(args.budget_s, 600.0)  # room for any machine: the epoch ends the run
    peers = dict(p.split("=", 1) for p in args.peer_dir)
    if args.scenario:
        settings = load_scenario(args.scenario)
        base, data_dir = scenario(
            work,
            settings,
            0.1 if args.smoke else args.pretrain_hours or settings["voice_a"]["pretrain_hours"],
            24 if args.smoke else 0,
            args.pretrain_learning_rate or settings["voice_a"]["pretrain_learning_rate"],
            tuple(shlex.split(args.pretrain_flags)),
        )
    elif args.base_model and args.data_dir:
        base, data_dir = Path(args.base_model).resolve(), Path(args.data_dir).resolve()
    else:
        parser.error("give --base_model and --data_dir, or --scenario NAME (bench/scenarios/NAME.json; or --smoke)")
    held = start_tempo_held(base)
    if held:
        print(
            f"warning: the start's tempo fit was held at its limit ({held}): its duration predictor is undertrained, "
            "and ours' evaluations judge the timing at that speaking_rate, so a run may keep its start by the timing "
            "rule (bench/RESULTS.md, nineteenth session); "
            + ("pretrain voice A longer (--pretrain_hours)" if args.scenario else "start from a voice trained longer"),
            flush=True,
        )
    data, judged = split_held_out(data_dir, work, args.eval_clips, args.judge_clips)
    print(
        f"start: {base}; clips: {data_dir} ({len(judged)} held-out clips for the judge, {args.eval_clips} for the "
        f"runs' evaluations); {args.budget_s:.0f} s a run",
        flush=True,
    )
    examples = judge_examples(data, base)
    panel = judges_panel(examples)
    results = {
        "start": {
            **judge(str(base), examples, args.judge_seeds, panel),
            **({"tempo_fit_held": held} if held else {}),
        },
        "runs": {},
        "budget_s": args.budget_s,
        "machine": describe(),
    }
    earlier = work / "results.json"
    if earlier.is_file():  # the systems not run this time keep their earlier runs (same start, clips, budget)
        kept = json.loads(earlier.read_text())
        if kept.get("budget_s") == args.budget_s and judged_alike(kept, results["start"]):
            running = dict(systems_to_run(args))
            results["runs"] = {
                name: [r for r in runs if name not in running or r.get("seed", 0) < args.first_seed]
                for name, runs in kept["runs"].items()
            }
            results["runs"] = {name: runs for name, runs in results["runs"].items() if runs}
            if "peer_clips_prepared_s" in kept:  # the peer's runs kept were timed with its clips prepared
                results["peer_clips_prepared_s"] = kept["peer_clips_prepared_s"]
    for path in args.peer_results:
        results["runs"].update(peer_runs_from(Path(path), results["start"]))
    print(
        f"the start: judge MCD {results['start']['mcd_db']:.3f} dB, length x{results['start']['length_ratio']:.3f}",
        flush=True,
    )
    python = start = clips = None
    for name, extra in systems_to_run(args):
        if name.startswith("fhv"):
            if "finetune-hf-vits" not in peers:
                print(f"{name}: skipped (no --peer_dir finetune-hf-vits=PATH)", flush=True)
                continue
            if name == "fhv@lr" and not args.learning_rate:
                print(
                    "fhv@lr: skipped (no --learning_rate: ours runs at its default, the peer's documented one "
                    "is fhv's)",
                    flush=True,
                )
                continue
            peer = Path(peers["finetune-hf-vits"]).resolve()
            if python is None:
                python = peer_venv(peer, work, args.peer_python)
                start, clips = peer_start(python, peer, base, work), peer_data(data, work)
                results["peer_clips_prepared_s"] = round(prepare_peer_clips(python, peer, start, clips, work), 1)
                print(
                    f"finetune-hf-vits: its clips filtered and preprocessed before the timed runs, untimed "
                    f"({results['peer_clips_prepared_s']:.0f} s; {peer_datasets(work)})",
                    flush=True,
                )
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            folder = work / f"{name.replace('@', '_at_').replace('+', '_')}_s{seed}"
            if name.startswith("fhv"):
                outcome = run_peer(args, python, peer, start, clips, folder, seed, peer_rate(name, args.learning_rate))
            else:
                outcome = run_ours(args, base, data, folder, seed, extra)
            judging = time.monotonic()
            outcome["judge"] = (
                judge(outcome["final_model"], examples, args.judge_seeds, panel) if outcome["final_model"] else None
            )
            outcome["curve"] = {
                t: {"model": path, **{k: v for k, v in judge(path, examples, args.judge_seeds).items() if k != "clips"}}
                for t, path in outcome["curve"].items()
            }
            outcome["seed"] = seed
            outcome["judge_s"] = time.monotonic() - judging
            results["runs"].setdefault(name, []).append(outcome)
            score = outcome["judge"]
            print(
                f"{name} seed {seed}: {outcome['steps']} steps in {outcome['wall_s']:.0f} s; judge MCD "
                + (
                    f"{score['mcd_db']:.3f} dB, length x{score['length_ratio']:.3f}"
                    if score
                    else "none (nothing saved)"
                )
                + (
                    f"; its result is the state saved at {outcome['result_saved_at_s']:.0f} s (a smaller "
                    "--peer_save_steps saves nearer the budget)"
                    if outcome.get("result_saved_at_s")
                    else ""
                )
                + f" ({len(outcome['curve']) + bool(score)} models judged in {outcome['judge_s']:.0f} s)",
                flush=True,
            )
            (work / "results.json").write_text(json.dumps(results, indent=2))
    print_tables(results)
    (work / "results.json").write_text(json.dumps(results, indent=2))  # with the tables' figures


def judges_panel(examples: list):
    """The speaker and phonetic judges (finetune/reporting/judges.py) with the judge's clips as the voice, for
    every system's final model alike; None without their extra (the MCD judge alone, as before)."""
    from finetune.reporting import judges as judging

    made = judging.load_judges(list(judging.DEFAULT))
    if not made:
        print(f"judges beside MCD not measured: {judging.INSTALL_HINT}", flush=True)
        return None
    panel = judging.Panel(made)
    panel.set_voice({e.item_id: (e.audio / 32768.0, 16000) for e in examples})
    return panel


def judged_alike(other: dict, start: dict) -> bool:
    """Whether another call's results.json judged the same start on the same clips (each clip's score equal):
    only then do its runs go beside this call's."""
    return other.get("start", {}).get("clips") == start["clips"]


def peer_runs_from(path: Path, start: dict) -> dict[str, list[dict]]:
    """The peer's runs of another call's results.json, named with their budget ('fhv@2e-3 at 360 s'): ours
    beside the peer given twice its time is the budget a user needs with ours for the peer's voice (ours plans
    its schedule to its budget, so a longer run's curve says less of that). Refused unless the start judged
    the same on the same clips: another start, --data_dir, --eval_clips, --judge_clips or --judge_seeds."""
    other = json.loads(path.read_text())
    theirs = other.get("start", {})
    if not judged_alike(other, start):
        raise SystemExit(
            f"--peer_results {path}: its start judged {theirs.get('mcd_db', math.nan):.3f} dB on "
            f"{len(theirs.get('clips', {}))} clips, this one {start['mcd_db']:.3f} on {len(start['clips'])}: another "
            "start, --data_dir, --eval_clips, --judge_clips or --judge_seeds, so the two cannot be put side by side"
        )
    return {
        f"{name} at {other['budget_s']:.0f} s": [{**run, "budget_s": other["budget_s"]} for run in runs]
        for name, runs in other["runs"].items()
        if name.startswith("fhv") and " at " not in name
    }


def summary(runs: list[dict]) -> dict:
    judged = [r["judge"] for r in runs if r["judge"]]
    names = sorted({name for j in judged for name in j.get("judges", {})})
    return {
        "judges": {
            name: float(np.mean([j["judges"][name] for j in judged if name in j.get("judges", {})])) for name in names
        },
        "mcd_db": float(np.mean([j["mcd_db"] for j in judged])) if judged else math.nan,
        "length_ratio": float(np.mean([j["length_ratio"] for j in judged])) if judged else math.nan,
        "steps": float(np.mean([r["steps"] for r in runs])),
        "wall_s": float(np.mean([r["wall_s"] for r in runs])),
        "seeds": len(runs),
    }


def nearer_by(runs: list[dict], peer_runs: list[dict], confidence: float = 0.95) -> dict | None:
    """How much nearer the target one system's final models judge than a peer's (1 - its mean MCD over the
    peer's; negative: further), with the two noises a reader needs apart. The judge's: which clips were
    judged, a paired bootstrap over the clips of each system's per-clip mean over its seeds (the interval).
    The training's: every seed of one against every seed of the other (the seed pairs), which the clips'
    interval does not hold and a few seeds cannot put an interval on."""
    from scipy.stats import bootstrap

    ours = [r["judge"]["clips"] for r in runs if r.get("judge")]
    theirs = [r["judge"]["clips"] for r in peer_runs if r.get("judge")]
    if not ours or not theirs:
        return None
    clips = sorted(set.intersection(*(set(c) for c in ours + theirs)))
    if not clips:
        return None
    a = np.array([[c[k] for k in clips] for c in ours])
    b = np.array([[c[k] for k in clips] for c in theirs])
    point = float(1 - a.mean() / b.mean())
    pairs = sorted(float(1 - x.mean() / y.mean()) for x in a for y in b)
    if len(clips) < 2:
        return {
            "nearer": point,
            "interval": (math.nan, math.nan),
            "seed_pairs": pairs,
            "clips": len(clips),
            "beyond_noise": False,
        }
    interval = bootstrap(
        (a.mean(0), b.mean(0)),
        lambda x, y, axis: 1 - x.mean(axis) / y.mean(axis),
        paired=True,
        vectorized=True,
        confidence_level=confidence,
        method="percentile",
        n_resamples=10_000,
        rng=np.random.default_rng(0),
    ).confidence_interval
    signs = {bool(v > 0) for v in (interval.low, interval.high, *pairs)}
    return {
        "nearer": point,
        "interval": (float(interval.low), float(interval.high)),
        "seed_pairs": pairs,
        "clips": len(clips),
        "beyond_noise": len(signs) == 1 and 0 not in (interval.low, interval.high),
    }


def held_at(run: dict, t: float, start_db: float) -> float:
    """The judge's MCD of what a run held at `t` seconds: its last curve point by then (the start before its
    first)."""
    held = start_db
    for at, point in sorted(((float(at), point) for at, point in run["curve"].items()), key=lambda p: p[0]):
        if at <= t:
            held = point["mcd_db"]
    return held


def lead_along(runs: list[dict], peer_runs: list[dict], start_db: float, budget_s: float) -> list[tuple]:
    """(seconds, ours' mean, the peer's mean, ours nearer by) at each quarter of the budget: where a lead is
    made (the tiny scale's 180 s: in its last third, bench/RESULTS.md, twenty-fourth session)."""
    rows = []
    for quarter in (1, 2, 3):
        t = budget_s * quarter / 4
        ours = sum(held_at(r, t, start_db) for r in runs) / len(runs)
        peer = sum(held_at(r, t, start_db) for r in peer_runs) / len(peer_runs)
        rows.append((t, ours, peer, 1 - ours / peer))
    ours, peer = summary(runs)["mcd_db"], summary(peer_runs)["mcd_db"]  # the results, as the first table has them
    return [*rows, (budget_s, ours, peer, 1 - ours / peer)]


def ours_beside(runs: dict[str, list[dict]], peers) -> list[tuple[str, str, list[dict]]]:
    """(peer, system of ours, its runs) for each peer and each system of ours."""
    return [(peer, name, mine) for peer in peers for name, mine in runs.items() if not name.startswith("fhv")]


def print_tables(results: dict) -> None:
    start = results["start"]["mcd_db"]
    table = {name: summary(runs) for name, runs in results["runs"].items()}
    judged = sorted({name for s in table.values() for name in s["judges"]})
    heads = "".join(f" {name} judge |" for name in judged)
    print(
        f"\n| system | seeds | optimizer steps | judge MCD (dB) | change from the start ({start:.2f}) | length vs "
        f"recordings |{heads} wall s |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: |" + " ---: |" * len(judged) + " ---: |")
    for name, s in table.items():
        cells = "".join(f" {s['judges'].get(j, math.nan):.3f} |" for j in judged)
        print(
            f"| {name} | {s['seeds']} | {s['steps']:.0f} | {s['mcd_db']:.3f} | {100 * (s['mcd_db'] / start - 1):+.1f}% | "
            f"{s['length_ratio']:.3f} |{cells} {s['wall_s']:.0f} |"
        )
    if judged:
        start_cells = ", ".join(f"{j} {results['start'].get('judges', {}).get(j, math.nan):.3f}" for j in judged)
        print(
            f"(the start: {start_cells}; speaker: higher is nearer the voice, phonetic: lower is nearer what is said)"
        )
    results["table"] = table
    if results["start"].get("tempo_fit_held"):
        print("(the start's tempo fit was held at its limit, so a run may have kept its start: see the warning above)")
    peers = {name: s for name, s in table.items() if name.startswith("fhv") and math.isfinite(s["mcd_db"])}
    if not peers or all(name.startswith("fhv") for name in results["runs"]):
        return  # nothing of ours (a run of the peer alone) to put beside them
    print(
        "\nNearer than each peer, at the end (1 - the mean judge MCD over the peer's; negative: further): the "
        "judge's 95% interval from the clips judged, and each seed against each of the peer's (the training's "
        "noise, which the interval leaves out):"
    )
    for peer_name, name, runs in ours_beside(results["runs"], peers):
        said = nearer_by(runs, results["runs"][peer_name])
        if said is None:
            continue
        results.setdefault("nearer", {})[f"{name} vs {peer_name}"] = said
        low, high = said["interval"]
        pairs = ", ".join(f"{100 * p:+.1f}%" for p in said["seed_pairs"])
        print(
            f"  {name} against {peer_name}: {100 * said['nearer']:+.1f}% ({100 * low:+.1f}% to {100 * high:+.1f}% "
            f"over {said['clips']} clips); seed against seed: {pairs}; "
            + ("beyond the noise" if said["beyond_noise"] else "within the noise")
        )
    budget_s = results.get("budget_s") or max(r["wall_s"] for runs in results["runs"].values() for r in runs)
    same_budget = {name for name in peers if results["runs"][name][0].get("budget_s", budget_s) == budget_s}
    if same_budget:  # a peer given another budget (--peer_results) is beside ours at the end only, above
        print(
            "\nThe lead along the budget: each system's judge MCD at each quarter of it (a run's last judged model "
            "by then, the start before its first; at the end its result), seeds averaged, and ours nearer by:"
        )
    for peer_name, name, runs in ours_beside(results["runs"], same_budget):
        rows = lead_along(runs, results["runs"][peer_name], start, budget_s)
        results.setdefault("lead", {})[f"{name} vs {peer_name}"] = rows
        shown = "; ".join(f"{t:.0f} s {ours:.3f} / {peer:.3f} ({100 * by:+.1f}%)" for t, ours, peer, by in rows)
        print(f"  {name} / {peer_name}: {shown}")
    print(
        "\nTime to reach each peer's final quality (its seeds' mean judge MCD), per seed of each system, "
        "interpolated between the curve's points:"
    )
    for peer_name, peer in peers.items():
        for name, runs in results["runs"].items():
            times = [
                time_to_reach([(float(t), p["mcd_db"]) for t, p in r["curve"].items()], peer["mcd_db"]) for r in runs
            ]
            shown = ", ".join(
                "never"
                if t is None
                else f"{t[1]:.0f} s (x{t[1] / peer['wall_s']:.2f} of its wall time; "
                f"the first point below: {t[0]:.0f} s)"
                for t in times
            )
            print(f"  {peer_name} at {peer['mcd_db']:.3f} dB: {name} {shown}")


if __name__ == "__main__":
    main()
