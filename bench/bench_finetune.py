#!/usr/bin/env python3
"""Does fine-tuning a pretrained voice make it the new voice, without breaking its timing?

    .venv/bin/python bench/bench_finetune.py                       # about 25 minutes on 2 CPU cores
    .venv/bin/python bench/bench_finetune.py --pretrain_hours 0.05 --finetune_hours 0.03   # a quick look

1. Voice A: the demo corpus. A tiny VITS is pretrained on it from scratch (train_vits.py).
2. Voice B: the same recordings made slower and lower offline (resampled with librosa/soxr to play
   --stretch x longer, which lowers the pitch by the same factor), prepared with A's vocabulary. Held-out
   clips are chosen by id, so B's held-out sentences are A's held-out sentences: unseen by both runs.
3. A is fine-tuned on B with train_vits.py, as a user fine-tunes an MMS voice: A's weights, a new
   discriminator (warmed up alone), a small learning rate, a budget.
4. Before and after, scored on held-out clips of B and of A: MCD-DTW, and the median length ratio
   measured by stock transformers (`VitsModel.forward` on the text; its length over the recording's).
   B's tempo is --stretch times A's, so A's model speaks B's sentences at about 1/stretch of their
   length, and a fine-tune that learned B's tempo at about 1.
5. The same fine-tune with transformers' own duration training path (`--compare_old_loss`), the
   flow order this tool replaced (finetune/vits/duration.py).
6. `--precision fp16 [bf16]`: the same fine-tune again under CPU autocast (fp32 is always run as the
   reference), for the same number of steps: give `--max_epochs` (the discriminator warm-up's epochs
   count too) and `--discriminator_warmup_steps` (the warm-up then ends by that cap in every run, not by
   its margin, which differs between runs). Reported per run: MCD and length ratio against B, the steps
   fp16's gradient scaler skipped, and the time per training step (CPU fp16 is slow: numerics only).

    .venv/bin/python bench/bench_finetune.py --work_dir W --reuse --precision fp16 bf16 --max_epochs 3 \
        --max_samples 80 --discriminator_warmup_steps 10 --finetune_hours 1.5 --no-compare_old_loss
    .venv/bin/python bench/bench_finetune.py --smoke          # the whole pipeline with tiny budgets
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.launcher import run_script
from bench.machine import describe

REPO = Path(__file__).resolve().parent.parent

OLD_LOSS_PATCH = (  # transformers' own training path for the stochastic duration predictor
    "import finetune.vits.objective as o;o.stochastic_duration_nll = lambda p, h, m, d: p(h, m, durations=d);"
)


def run(command: list[str], label: str, log: Path) -> float:
    """`command` ([python, script.py, flags...], or [python, -c, code, flags...]) in a process of its own,
    its output in `log`; its seconds. A script is forked from bench/launcher.py's server (the imports paid
    once); code, which patches a module, gets a new interpreter."""
    started = time.perf_counter()
    if command[1].endswith(".py"):
        code = run_script(Path(command[1]), command[2:], log)
    else:
        with open(log, "w") as out:
            code = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, cwd=REPO).returncode
    if code != 0:
        raise SystemExit(f"{label} failed (exit {code}); see {log}")
    return time.perf_counter() - started


def train(
    data_dir: Path, run_dir: Path, model: str, hours: float, lr: float, old_loss: bool = False, extra: list[str] = ()
) -> float:
    argv = [
        "--data_dir",
        str(data_dir),
        "--checkpoint_dir",
        str(run_dir / "checkpoints"),
        "--output_dir",
        str(run_dir / "final_model"),
        "--model_name",
        model,
        "--target_hours",
        str(hours),
        "--discriminator_width",
        "0.0625",
        "--learning_rate",
        str(lr),
        "--gradient_accumulation_steps",
        "1",
        "--log_every_seconds",
        "60",
        "--val_samples",
        "16",
        *extra,
    ]
    if old_loss:  # transformers' duration loss patched in: a new interpreter, the patch in its code
        code = OLD_LOSS_PATCH + "import sys, train_vits; sys.exit(train_vits.main(sys.argv[1:]))"
        return run([sys.executable, "-c", code, *argv], f"training {run_dir.name}", run_dir.with_suffix(".log"))
    return run(
        [sys.executable, str(REPO / "train_vits.py"), *argv], f"training {run_dir.name}", run_dir.with_suffix(".log")
    )


def make_voice_b(source: Path, out: Path, stretch: float, semitones: float) -> None:
    """The demo recordings slowed down by resampling, as a tape played slower: `stretch` times longer, and
    pitch and formants lower by the same factor (-3.9 semitones for 1.25), as a larger speaker's; then
    shifted by `semitones` more if asked. Resampling adds no artefacts (a phase-vocoder time stretch
    smears transients, and the alignment of smeared speech is noisier)."""
    import librosa
    import soundfile as sf

    (out / "wavs").mkdir(parents=True)
    rows = [(source / name).read_text(encoding="utf-8") for name in ("metadata.csv", "metadata_val.csv")]
    (out / "metadata.csv").write_text("".join(rows), encoding="utf-8")  # all of A's clips; B splits them alike
    for path in sorted((source / "wavs").glob("*.wav")):
        audio, rate = sf.read(path, dtype="float32")
        slower = librosa.resample(audio, orig_sr=rate, target_sr=round(rate * stretch), res_type="soxr_hq")
        if semitones:
            slower = librosa.effects.pitch_shift(slower, sr=rate, n_steps=semitones)
        sf.write(out / "wavs" / path.name, slower, rate, subtype="PCM_16")


def prepare(source: Path, data_dir: Path, model: str, max_samples: int = 0, val_fraction: float = 0.05) -> None:
    run(
        [
            sys.executable,
            str(REPO / "prepare_data.py"),
            "--input_dir",
            str(source),
            "--data_dir",
            str(data_dir),
            "--model_name",
            model,
            "--val_fraction",
            str(val_fraction),
            "--num_workers",
            "1" if max_samples else "2",
            "--max_samples",
            str(max_samples),
        ],
        f"preparing {data_dir.name}",
        data_dir.with_suffix(".log"),
    )


def fine_tune_flags(args, precision: str) -> list[str]:
    """train_vits.py flags every fine-tune shares (step caps, subset), plus the precision's own."""
    flags = [
        "--max_epochs",
        str(args.max_epochs),
        "--max_samples",
        str(args.max_samples),
        "--val_samples",
        str(args.val_samples),
        "--device",
        "cpu",
    ]
    if args.discriminator_warmup_steps:  # an unreachable margin: every run's warm-up ends by the same cap
        flags += [
            "--discriminator_warmup_steps",
            str(args.discriminator_warmup_steps),
            "--discriminator_warmup_margin",
            "1e9",
        ]
    if args.val_every:
        flags += ["--val_every", str(args.val_every)]
    return flags + {"fp32": [], "fp16": ["--fp16"], "bf16": ["--bf16"]}[precision]


def run_figures(run_dir: Path) -> dict:
    """From the run's own end record: steps, fp16 skipped steps, seconds per training step (the step
    profile's sections summed: data, forward, backward, optimizer; the warm-up's steps are not in it)."""
    records = [json.loads(line) for line in (run_dir / "checkpoints" / "metrics.jsonl").read_text().splitlines()]
    end = next(r for r in reversed(records) if r.get("kind") == "end")
    steps = int(end["steps"])
    return {
        "steps": steps,
        "warmup_steps": end.get("discriminator_warmup_steps", 0),
        "skipped_fp16": end.get("fp16_overflow_skips", 0),
        "nonfinite_skips": end.get("nonfinite_skips", 0),
        "step_s": sum(end.get("profile_s", {}).values()) / max(1, steps),
        "time_used_s": end["time_used_s"],
        "budget_s": end["budget_s"],
        "loss_scale": end.get("loss_scale_generator"),
    }


def score(model_dir: Path, data_dir: Path, metadata: str = "metadata_val.csv") -> dict:
    """MCD-DTW (this tool's evaluation) and the median length ratio by stock transformers, on the clips of
    `metadata` (the held-out ones by default)."""
    import torch
    from transformers import VitsModel, VitsTokenizer
    from transformers.utils import logging as transformers_logging

    from finetune.data.corpus import load_examples
    from finetune.data.features import FeatureConfig, Features
    from finetune.reporting.evaluation import Evaluator

    transformers_logging.disable_progress_bar()
    model = VitsModel.from_pretrained(str(model_dir)).eval()
    tokenizer = VitsTokenizer.from_pretrained(str(model_dir))
    examples, _ = load_examples(data_dir, metadata, tokenizer, 256, 16000)
    result = Evaluator(examples, Features(FeatureConfig()), torch.device("cpu"), 16000, seed=0, batch_size=1).evaluate(
        model, 0
    )
    ratios = []
    for index, example in enumerate(examples):
        torch.manual_seed(index)
        with torch.no_grad():
            out = model(input_ids=torch.from_numpy(example.token_ids.astype(np.int64)).unsqueeze(0))
        ratios.append(int(out.sequence_lengths[0]) / len(example.audio))
    return {
        "mcd_db": result.mcd_db,
        "stock_length_ratio": float(np.median(ratios)),
        "duration_error": result.duration_error,
        "clips": len(examples),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pretrain_hours", type=float, default=0.17, help="pretraining budget of voice A")
    parser.add_argument("--finetune_hours", type=float, default=0.1, help="fine-tuning budget on voice B")
    parser.add_argument("--pretrain_lr", type=float, default=2e-3)
    parser.add_argument("--finetune_lr", type=float, default=5e-4)
    parser.add_argument("--stretch", type=float, default=1.25, help="B's recordings are this many times longer")
    parser.add_argument("--semitones", type=float, default=0.0, help="B's pitch shift beyond what slowing down gives")
    parser.add_argument("--compare_old_loss", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--work_dir", default=None, help="keep everything here (default: a temporary folder)")
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="with --work_dir: keep voice A and B's data from an earlier run there and redo only the fine-tunes",
    )
    parser.add_argument(
        "--precision",
        nargs="*",
        default=[],
        choices=["fp16", "bf16"],
        help="also fine-tune under these (CPU autocast); fp32 is always the reference",
    )
    parser.add_argument(
        "--max_epochs",
        type=int,
        default=0,
        help="fine-tunes stop after N epochs (warm-up included): the same steps for every precision (0: budget-driven)",
    )
    parser.add_argument("--max_samples", type=int, default=0, help="fine-tune on the first N clips of B (0: all)")
    parser.add_argument(
        "--discriminator_warmup_steps",
        type=int,
        default=0,
        help="end every fine-tune's warm-up after exactly N steps (0: by its margin, as users run)",
    )
    parser.add_argument("--val_samples", type=int, default=16, help="held-out clips per in-run evaluation")
    parser.add_argument("--val_every", type=int, default=0, help="in-run evaluations every N steps (0: planned)")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="the whole pipeline on 24 clips with tiny budgets (seconds of training: figures mean nothing)",
    )
    args = parser.parse_args()
    if args.smoke:
        smoke(args)
    print(f"machine: {describe()}", flush=True)
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="bench_finetune_"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"work folder: {work}", flush=True)
    voice_a = make_voice_a(args, work)
    rows, figures = {"voice A (before)": voice_a}, {}
    for label, run_dir, old, precision in fine_tunes(args):
        run_dir = work / run_dir
        shutil.rmtree(run_dir, ignore_errors=True)
        seconds = train(
            work / "data_b",
            run_dir,
            str(voice_a),
            args.finetune_hours,
            args.finetune_lr,
            old,
            fine_tune_flags(args, precision),
        )
        best = run_dir / "checkpoints" / "best_model"
        rows[f"{label}: best_model"] = best if (best / "config.json").is_file() else None
        rows[f"{label}: final_model"] = run_dir / "final_model"
        figures[label] = {"precision": precision, "seconds": round(seconds, 1), **run_figures(run_dir)}
        print(f"{label}: {seconds:.0f}s; {json.dumps(figures[label])}", flush=True)
    results = score_all(args, work, rows)
    print_precision_table(results, figures)
    (work / "results.json").write_text(json.dumps({"scores": results, "runs": figures}, indent=2))


def smoke(args) -> None:
    """Tiny budgets for the smoke test: voice A from 24 clips in 1 epoch; a fine-tune on 8 clips (one
    micro-batch an epoch): 1 warm-up step, 2 training steps."""
    args.smoke_samples = 24
    args.pretrain_hours, args.finetune_hours = 0.1, 0.1  # room for start-up and evaluations; the epoch caps end them
    args.max_epochs, args.max_samples, args.discriminator_warmup_steps = 3, 8, 1
    args.val_samples, args.val_every = 2, 1000
    args.compare_old_loss = False  # and fp32 only, unless --precision asks for more (fp16 is tests/test_precision.py's)


def make_voice_a(args, work: Path) -> Path:
    """Voice A pretrained from scratch on the demo corpus, and B's data made from it (or both reused)."""
    voice_a = pretrain_voice_a(args, work)
    if not (args.reuse and (work / "data_b" / "metadata.csv").is_file()):
        shutil.rmtree(work / "corpus_b", ignore_errors=True)
        shutil.rmtree(work / "data_b", ignore_errors=True)
        make_voice_b(work / "data_a", work / "corpus_b", args.stretch, args.semitones)
        prepare(work / "corpus_b", work / "data_b", str(voice_a), getattr(args, "smoke_samples", 0))
    return voice_a


def pretrain_voice_a(args, work: Path) -> Path:
    """Voice A pretrained from scratch on the demo corpus (prepared in work/data_a), or reused."""
    voice_a = work / "voice_a" / "checkpoints" / "best_model"
    samples = getattr(args, "smoke_samples", 0)
    if args.reuse and any((v / "config.json").is_file() for v in (voice_a, work / "voice_a" / "final_model")):
        print(f"reusing voice A ({voice_a}) from an earlier run in {work}", flush=True)
    else:
        prepare(REPO / "demo" / "corpus", work / "data_a", "scratch:tiny", samples)
        extra = (
            ["--max_epochs", "1", "--val_samples", "2", "--benchmark_samples", "4", "--discriminator_warmup_steps", "0"]
            if samples
            else []
        )
        seconds = train(
            work / "data_a", work / "voice_a", "scratch:tiny", args.pretrain_hours, args.pretrain_lr, extra=extra
        )
        print(f"voice A pretrained in {seconds:.0f}s", flush=True)
    if not (voice_a / "config.json").is_file():  # no evaluation was within the timing rule: the last weights
        voice_a = work / "voice_a" / "final_model"
    print(f"voice A: {voice_a}", flush=True)
    return voice_a


def fine_tunes(args) -> list[tuple[str, str, bool, str]]:
    """(label, run folder, old duration loss, precision) of each fine-tune to run."""
    runs = [("fine-tuned on B", "finetune", False, "fp32")]
    runs += [(f"fine-tuned on B, {p}", f"finetune_{p}", False, p) for p in args.precision]
    if args.compare_old_loss:
        runs.append(("fine-tuned on B, old duration loss", "finetune_old", True, "fp32"))
    return runs


def score_all(args, work: Path, rows: dict) -> dict:
    lower = -12 * np.log2(args.stretch) + args.semitones
    print(f"\nB is voice A {args.stretch}x slower and {-lower:.1f} semitones lower; held-out clips of each")
    print("| model | MCD vs B (dB) | length vs B | duration error vs B | MCD vs A (dB) | length vs A |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    results = {}
    for label, folder in rows.items():
        if folder is None:
            print(f"| {label} | (no model passed the timing rule) | | | | |")
            continue
        on_b, on_a = score(folder, work / "data_b"), score(folder, work / "data_a")
        results[label] = {"b": on_b, "a": on_a}
        print(
            f"| {label} | {on_b['mcd_db']:.2f} | {on_b['stock_length_ratio']:.2f} | {on_b['duration_error']:.2f} | "
            f"{on_a['mcd_db']:.2f} | {on_a['stock_length_ratio']:.2f} |",
            flush=True,
        )
    return results


def print_precision_table(results: dict, figures: dict) -> None:
    """Each precision's final model against fp32's: MCD and length ratio vs B, skipped steps, step time."""
    reference = results.get("fine-tuned on B: final_model")
    if not reference or len(figures) < 2:
        return
    print(
        "\n| fine-tune (final_model) | steps (+ warm-up) | MCD vs B (dB) | vs fp32 | length vs B | vs fp32 | "
        "fp16 skipped steps | s / step | time used / budget (s) |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for label, run in figures.items():
        scores = results.get(f"{label}: final_model")
        if scores is None or run["precision"] == "fp32" and label != "fine-tuned on B":
            continue
        mcd, ratio = scores["b"]["mcd_db"], scores["b"]["stock_length_ratio"]
        print(
            f"| {label} ({run['precision']}) | {run['steps']} (+{run['warmup_steps']}) | {mcd:.2f} | "
            f"{100 * (mcd / reference['b']['mcd_db'] - 1):+.1f}% | {ratio:.3f} | "
            f"{ratio - reference['b']['stock_length_ratio']:+.3f} | {run['skipped_fp16']} | {run['step_s']:.2f} | "
            f"{run['time_used_s']:.0f} / {run['budget_s']:.0f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
