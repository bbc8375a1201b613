#!/usr/bin/env python3
"""Our training step beside Piper's trainer (piper-tts[train]), on identical batches of the same clips.

    .venv/bin/python bench/bench_piper.py --peer_dir PIPER1_GPL_CHECKOUT    # both; Piper in its own venv
    .venv/bin/python bench/bench_piper.py --smoke                           # ours only, tiny: the code path

The demo corpus's clips (prepared here for a scratch model) are cut into micro-batches of --batch_size;
the same micro-batches, in the same order, go to both trainers on the CPU with the same number of
threads and the same torch version:
- ours: TrainStep.run on one micro-batch (generator forward with the alignment, discriminator forward and
  backward, generator losses and backward, both AdamW steps), fp32, a new scratch generator of --size
  and the standard discriminator (width 1, 46.7M parameters);
- Piper: its own VitsModel.training_step under a lightning Trainer (bench/peer_piper.py, run in Piper's
  venv), its hyperparameters set to the same architecture as ours where its flags allow (192 hidden,
  6 text-encoder layers, HiFi-GAN resblock 1 with kernels 3/7/11 and upsampling 8,8,2,2 from 512 channels,
  the stochastic duration predictor, segments of 8192 samples, 16 kHz, its MultiPeriodDiscriminator).
  What differs: its duration predictor's filter width (its 192, MMS's 256) and its text front end
  (phonemes; the token ids here are ours, given to it as phoneme ids).
Seconds a step after --burn_in steps, median of --steps, and the ratio.

Piper's environment is made once in W/piper_venv (PIPER_VERSIONS); its monotonic_align extension, which
the wheel ships without its source, is built from the checkout --peer_dir names (OHF-Voice/piper1-gpl,
src/piper/train/vits/monotonic_align/core.pyx).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench.demo_data import prepare_demo
from bench.machine import describe
from bench.peer_venv import made_venv, run
from finetune.data.corpus import load_examples
from finetune.data.examples import Example, collate
from finetune.data.features import FeatureConfig, Features
from finetune.training.precision import resolve_precision
from finetune.training.step import StepSettings, TrainStep
from finetune.vits.discriminator import Discriminator, DiscriminatorConfig, parameter_count
from finetune.vits.generator import hop_length, ready_for_training, scratch_generator
from finetune.vits.losses import LossWeights

REPO = Path(__file__).resolve().parent.parent
PIPER_VERSIONS = ["piper-tts[train]==1.8.0", "cython>=3,<4", "setuptools"]
MONOTONIC_ALIGN = "src/piper/train/vits/monotonic_align/core.pyx"
# Piper's VitsModel hyperparameters for the architecture of transformers' VitsConfig defaults (MMS)
PIPER_AS_MMS = dict(
    sample_rate=16000,
    resblock="1",
    resblock_kernel_sizes=[3, 7, 11],
    resblock_dilation_sizes=[[1, 3, 5], [1, 3, 5], [1, 3, 5]],
    upsample_rates=[8, 8, 2, 2],
    upsample_initial_channel=512,
    upsample_kernel_sizes=[16, 16, 4, 4],
    filter_length=1024,
    hop_length=256,
    win_length=1024,
    inter_channels=192,
    hidden_channels=192,
    filter_channels=768,
    n_heads=2,
    n_layers=6,
    kernel_size=3,
    use_sdp=True,
    segment_size=8192,
    mos_metric=None,
)


def piper_tensors(examples: list[Example]) -> dict:
    """A micro-batch as plain tensors for Piper: token ids (zero-padded) and audio in [-1, 1]."""
    tokens = torch.zeros(len(examples), max(len(e.token_ids) for e in examples), dtype=torch.long)
    audio = torch.zeros(len(examples), max(len(e.audio) for e in examples))
    for i, example in enumerate(examples):
        tokens[i, : len(example.token_ids)] = torch.from_numpy(example.token_ids.astype("int64"))
        audio[i, : len(example.audio)] = torch.from_numpy(example.audio.astype("float32") / 32768.0)
    return {
        "tokens": tokens,
        "token_lengths": torch.tensor([len(e.token_ids) for e in examples]),
        "audio": audio,
        "audio_lengths": torch.tensor([len(e.audio) for e in examples]),
    }


def time_ours(args, examples: list[Example], model, hop: int) -> tuple[list[float], float]:
    device = torch.device("cpu")
    discriminator = Discriminator(DiscriminatorConfig(width=args.discriminator_width))
    step = TrainStep(
        model,
        discriminator,
        Features(FeatureConfig(hop_length=hop)),
        LossWeights(),
        StepSettings(),
        resolve_precision(device, False, False),
        device,
    )
    batches = [collate(examples[i : i + args.batch_size], hop).to(device) for i in batch_starts(args, examples)]
    seconds = []
    for index in range(args.burn_in + args.steps):
        started = time.perf_counter()
        result = step.run([batches[index % len(batches)]])
        assert result.applied, result.reason
        seconds.append(time.perf_counter() - started)
    return seconds[args.burn_in :], parameter_count(discriminator) / 1e6


def batch_starts(args, examples: list[Example]) -> range:
    return range(0, len(examples) - args.batch_size + 1, args.batch_size)


def piper_python(peer: Path, work: Path) -> Path:
    """Piper's own environment (made once, in W/piper_venv), its monotonic_align built from the checkout."""
    venv = work / "piper_venv"
    python = made_venv(venv, PIPER_VERSIONS, work, "piper")
    folder = (
        Path(
            subprocess.run(
                [str(python), "-c", "import piper, os; print(os.path.dirname(piper.__file__))"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
        )
        / "train"
        / "vits"
        / "monotonic_align"
    )
    inner = folder / "monotonic_align"  # its __init__ imports .monotonic_align.core
    if not list(inner.glob("core*.so")):
        shutil.copy(peer / MONOTONIC_ALIGN, folder / "core.pyx")
        run(
            [venv / "bin" / "cythonize", "-i", folder / "core.pyx"],
            work / "piper_build.log",
            "building its monotonic_align",
        )
        inner.mkdir(exist_ok=True)
        (inner / "__init__.py").touch()
        for built in folder.glob("core*.so"):
            shutil.move(str(built), inner / built.name)
    return python


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--peer_dir", help="a checkout of OHF-Voice/piper1-gpl (for its monotonic_align source)")
    parser.add_argument("--work_dir", default=None, help="Piper's venv and the batches (default: a temporary one)")
    parser.add_argument("--size", default="mms", choices=["tiny", "small", "mms"], help="our scratch generator")
    parser.add_argument("--discriminator_width", type=float, default=1.0)
    parser.add_argument("--batch_size", type=int, default=4)
    parser.add_argument("--max_samples", type=int, default=24, help="demo clips used (cut into micro-batches)")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--burn_in", type=int, default=2)
    parser.add_argument("--smoke", action="store_true", help="ours only, a tiny model, one step: the code path")
    args = parser.parse_args(argv)
    if args.smoke:
        args.size, args.discriminator_width, args.batch_size, args.max_samples = "tiny", 0.0625, 2, 4
        args.steps, args.burn_in, args.peer_dir = 1, 0, None
    print(f"machine: {describe()}", flush=True)
    if args.work_dir:
        work = Path(args.work_dir).resolve()
        work.mkdir(parents=True, exist_ok=True)
        return measure(args, work)
    with tempfile.TemporaryDirectory(prefix="bench_piper_") as work:  # Piper's venv too: made again next time
        return measure(args, Path(work))


def measure(args: argparse.Namespace, work: Path) -> int:
    """Both steps on the same micro-batches; the table printed and W/results.json written."""
    threads = torch.get_num_threads()

    data = prepare_demo(work / "data", max_samples=args.max_samples)
    texts = [line.split("|", 1)[1] for line in (data / "metadata.csv").read_text(encoding="utf-8").splitlines()]
    torch.manual_seed(0)
    loaded = scratch_generator(args.size, sorted(set("".join(texts))), 16000)
    model = ready_for_training(loaded.model).train()
    hop = hop_length(model.config)
    examples, _ = load_examples(data, "metadata.csv", loaded.tokenizer, hop, 16000)
    starts = batch_starts(args, examples)
    print(
        f"{len(starts)} micro-batches of {args.batch_size} clips ({sum(len(e.audio) for e in examples) / 16000:.0f} s "
        f"of audio), CPU, {threads} threads, fp32; {args.steps} steps timed after {args.burn_in}",
        flush=True,
    )
    ours, discriminator_m = time_ours(args, examples, model, hop)
    rows = [
        {
            "system": f"ours (scratch:{args.size})",
            "generator_m": sum(p.numel() for p in model.parameters()) / 1e6,
            "discriminator_m": discriminator_m,
            "step_s": statistics.median(ours),
        }
    ]
    if args.peer_dir:
        batches_file = work / "batches.pt"
        torch.save([piper_tensors(examples[i : i + args.batch_size]) for i in starts], batches_file)
        hparams = {**PIPER_AS_MMS, "num_symbols": len(loaded.tokenizer.encoder), "threads": threads}
        python = piper_python(Path(args.peer_dir).resolve(), work)
        out = work / "piper_steps.json"
        command = [str(python), str(REPO / "bench" / "peer_piper.py"), str(batches_file), str(out)]
        command += [str(args.steps), str(args.burn_in), json.dumps(hparams)]
        run(command, work / "piper_run.log", "Piper's training steps")
        piper = json.loads(out.read_text())
        rows.append(
            {
                "system": "Piper 1.8.0 (its training_step, MMS's architecture)",
                "generator_m": piper["generator_m"],
                "discriminator_m": piper["discriminator_m"],
                "step_s": statistics.median(piper["step_s"]),
            }
        )
    else:
        print("Piper: skipped (no --peer_dir: a checkout of OHF-Voice/piper1-gpl)", flush=True)
    print("\n| system | generator (M) | discriminator (M) | s a step (median) | clips/s | Piper's time / ours |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for row in rows:
        ratio = row["step_s"] / rows[0]["step_s"]
        print(
            f"| {row['system']} | {row['generator_m']:.1f} | {row['discriminator_m']:.1f} | {row['step_s']:.3f} | "
            f"{args.batch_size / row['step_s']:.2f} | {ratio:.3f} |"
        )
    (work / "results.json").write_text(json.dumps({"machine": describe(), "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
