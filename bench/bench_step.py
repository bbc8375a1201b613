#!/usr/bin/env python3
"""Time one training step split into its parts: data to device, generator forward, alignment search,
discriminator forward+backward, generator losses+backward, optimizer steps.

The train step cut down: TrainStep's own parts, called one by one with a device sync between them
(which a real step does not have: on a GPU the parts overlap less here than in training). The first
`--burn_in` steps are left out (allocator warm-up, numba compilation, cuDNN autotuning).

    .venv/bin/python bench/bench_step.py                                   # tiny model, CPU
    .venv/bin/python bench/bench_step.py --size mms --batch_size 8 --discriminator_width 1 --precision fp16
    .venv/bin/python bench/bench_step.py --compile discriminator decoder   # torch.compile, checked against eager
    .venv/bin/python bench/bench_step.py --smoke                           # seconds: the smoke test's setting

Also timed: a discriminator warm-up step both ways, the full generator forward under no_grad (as the
warm-up ran before) and the segments alone (posterior encoder -> random segment -> decoder, as it runs now);
and a whole step as training runs it (TrainStep.run, no syncs between parts) with the discriminator learning,
with it only scoring (a step it sits out under --discriminator_every), and without the duration predictor
(a step it sits out under --duration_every).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from bench.demo_data import prepare_demo
from bench.machine import describe
from finetune.data.corpus import load_examples
from finetune.data.examples import collate
from finetune.data.features import FeatureConfig, Features
from finetune.training.precision import resolve_precision
from finetune.training.step import StepResult, StepSettings, TrainStep
from finetune.vits import objective
from finetune.vits.discriminator import Discriminator, DiscriminatorConfig, parameter_count
from finetune.vits.generator import hop_length, ready_for_training, scratch_generator
from finetune.vits.losses import LossWeights

REPO = Path(__file__).resolve().parent.parent

PHASES = (
    "data to device",
    "generator forward",
    "alignment",
    "discriminator fwd+bwd",
    "generator loss+bwd",
    "optimizer steps",
)


class AlignmentTimer:
    """Wraps the alignment functions the objective calls, adding their time (with syncs) to `seconds`."""

    def __init__(self, sync):
        self.seconds, self.sync = 0.0, sync
        self.originals = (objective.prior_log_likelihood, objective.maximum_path)

    def wrap(self, fn):
        def timed(*args, **kwargs):
            self.sync()
            started = time.perf_counter()
            result = fn(*args, **kwargs)
            self.sync()
            self.seconds += time.perf_counter() - started
            return result

        return timed

    def __enter__(self):
        objective.prior_log_likelihood = self.wrap(self.originals[0])
        objective.maximum_path = self.wrap(self.originals[1])
        return self

    def __exit__(self, *exc):
        objective.prior_log_likelihood, objective.maximum_path = self.originals


def timed_step(step: TrainStep, host_batch, device, sync, pin: bool) -> dict[str, float]:
    times = {}
    mark = time.perf_counter()

    def lap(name):
        nonlocal mark
        sync()
        now = time.perf_counter()
        times[name] = now - mark
        mark = now

    batch = host_batch.to(device, non_blocking=pin)
    lap("data to device")
    with AlignmentTimer(sync) as alignment:
        out, real_audio, mel_real = step.forward(batch)
        lap("generator forward")
    times["generator forward"] -= alignment.seconds
    times["alignment"] = alignment.seconds
    d_loss, _, real_features = step.discriminator_backward(real_audio, out.audio, True, 1.0)
    lap("discriminator fwd+bwd")
    g_losses = step.generator_backward(out, mel_real, real_features, 1.0)
    lap("generator loss+bwd")
    step.update(
        StepResult(applied=False, used=1, clips=len(batch)),
        {"generator": g_losses.total.detach(), "discriminator": d_loss.detach()},
        whole=len(batch),
    )
    lap("optimizer steps")
    return times


def warm_up_step(step: TrainStep, host_batch, device, sync, full: bool) -> float:
    """Seconds of one discriminator-only micro-batch: with the whole generator forward (no_grad), as the
    warm-up ran before, or with only the segments the discriminator sees, as it runs now."""
    sync()
    started = time.perf_counter()
    batch = host_batch.to(device)
    if full:
        with torch.no_grad():
            out, real_audio, _ = step.forward(batch)
        generated = out.audio
    else:
        generated, real_audio = step.forward_segments(batch)
    step.discriminator_backward(real_audio, generated, False, 1.0)
    step.zero_grad()
    sync()
    return time.perf_counter() - started


def whole_step(step: TrainStep, host_batch, device, sync, discriminator: bool, duration: bool = True) -> float:
    """Seconds of one whole optimizer step over one micro-batch as training runs it, the discriminator
    learning in it or only scoring (a step it sits out under --discriminator_every N), the duration predictor
    learning in it or not (--duration_every N)."""
    sync()
    started = time.perf_counter()
    step.run([host_batch.to(device)], discriminator=discriminator, duration=duration)
    sync()
    return time.perf_counter() - started


def compile_parts(model, discriminator, parts: list[str], sample_audio: torch.Tensor, sample_z: torch.Tensor) -> dict:
    """torch.compile the named parts in place; each compiled part is checked against eager on one input
    (largest absolute difference). Compilation itself happens at the first calls (the burn-in)."""
    differences = {}
    if "discriminator" in parts:
        eager = discriminator(sample_audio)[0][0].detach()
        discriminator.forward = torch.compile(discriminator.forward)
        differences["discriminator"] = float((discriminator(sample_audio)[0][0].detach() - eager).abs().max())
    if "decoder" in parts:
        eager = model.decoder(sample_z).detach()
        model.decoder.forward = torch.compile(model.decoder.forward)
        differences["decoder"] = float((model.decoder(sample_z).detach() - eager).abs().max())
    return differences


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", default="tiny", choices=["tiny", "small", "mms"])
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--discriminator_width", type=float, default=0.0625)
    parser.add_argument("--precision", default="fp32", choices=["fp32", "fp16", "bf16"])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--burn_in", type=int, default=3)
    parser.add_argument("--data_dir", default=None, help="a prepared folder (default: prepare the demo corpus)")
    parser.add_argument(
        "--compile",
        nargs="*",
        default=[],
        choices=["discriminator", "decoder"],
        help="torch.compile these parts (checked against eager first)",
    )
    parser.add_argument("--smoke", action="store_true", help="2 clips a batch, 1 step after 1 burn-in: seconds")
    args = parser.parse_args()
    if args.smoke:
        args.batch_size, args.steps, args.burn_in = 2, 1, 1

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    fp16 = {"fp32": False, "fp16": True, "bf16": None}[args.precision]
    precision = resolve_precision(device, fp16, bf16=args.precision == "bf16")
    tmp = tempfile.TemporaryDirectory()
    data_dir = (
        Path(args.data_dir)
        if args.data_dir
        else prepare_demo(Path(tmp.name) / "data", max_samples=8 if args.smoke else 0)
    )

    torch.manual_seed(0)
    texts = [line.split("|", 1)[1] for line in (data_dir / "metadata.csv").read_text(encoding="utf-8").splitlines()]
    loaded = scratch_generator(args.size, sorted(set("".join(texts))), 16000)
    model = ready_for_training(loaded.model).to(device).train()
    hop = hop_length(model.config)
    examples, _ = load_examples(data_dir, "metadata.csv", loaded.tokenizer, hop, 16000)
    discriminator = Discriminator(DiscriminatorConfig(width=args.discriminator_width)).to(device)
    step = TrainStep(
        model, discriminator, Features(FeatureConfig()).to(device), LossWeights(), StepSettings(), precision, device
    )
    pin = device.type == "cuda"
    batches = [
        collate(examples[i : i + args.batch_size], hop)
        for i in range(0, len(examples) - args.batch_size, args.batch_size)
    ]
    batches = [b.pin_memory() for b in batches] if pin else batches

    differences = {}
    if args.compile:
        sample = batches[0].to(device)
        sample_z = torch.randn(args.batch_size, model.config.flow_size, 32, device=device)
        differences = compile_parts(model, discriminator, args.compile, sample.audio[:, None, :8192], sample_z)
    records, first_s = [], []
    for index in range(args.burn_in + args.steps):
        times = timed_step(step, batches[index % len(batches)], device, sync, pin)
        if index >= args.burn_in:
            records.append(times)
        else:
            first_s.append(sum(times.values()))
        if args.compile:  # compilation can take minutes: show that it moves
            print(f"step {index + 1}: {sum(times.values()):.1f}s", flush=True)
    warm_up = {
        name: statistics.mean(
            warm_up_step(step, batches[i % len(batches)], device, sync, full) for i in range(max(1, args.steps // 2))
        )
        for name, full in (("whole generator forward (before)", True), ("segments only (now)", False))
    }

    kinds = {"learning": (True, True), "scoring": (False, True), "no duration": (True, False)}
    whole_s: dict[str, list[float]] = {kind: [] for kind in kinds}
    for i in range(max(1, args.steps // 2)):  # the kinds in turn, so that a slower minute slows each
        for kind, (learns, duration) in kinds.items():
            whole_s[kind].append(whole_step(step, batches[i % len(batches)], device, sync, learns, duration))

    total = statistics.mean(sum(r.values()) for r in records)
    print(f"machine: {describe()}")
    print(
        f"generator scratch:{args.size} ({sum(p.numel() for p in model.parameters()) / 1e6:.2f}M), discriminator width "
        f"{args.discriminator_width} ({parameter_count(discriminator) / 1e6:.2f}M), batch {args.batch_size}, "
        f"{precision.name}, {device.type}; {args.steps} steps timed after {args.burn_in} burn-in"
    )
    print(f"{'phase':<24} {'ms':>9} {'share':>7}")
    for phase in PHASES:
        ms = 1000 * statistics.mean(r[phase] for r in records)
        print(f"{phase:<24} {ms:>9.1f} {100 * ms / (1000 * total):>6.1f}%")
    print(f"{'step':<24} {1000 * total:>9.1f} {100.0:>6.1f}%   ({args.batch_size / total:.1f} samples/s)")
    if args.compile:
        print(
            f"compiled: {', '.join(args.compile)}; largest difference from eager {differences}; burn-in steps "
            f"(compilation included) {', '.join(f'{s:.1f}s' for s in first_s)}"
        )
    for name, seconds in warm_up.items():
        print(f"discriminator warm-up micro-batch, {name:<34} {1000 * seconds:>9.1f} ms")
    learning, scoring, no_duration = (statistics.mean(whole_s[kind]) for kind in kinds)
    print(f"whole step, {'the discriminator learning':<58} {1000 * learning:>9.1f} ms")
    print(f"whole step, {'the discriminator only scoring':<58} {1000 * scoring:>9.1f} ms")
    print(f"whole step, {'without the duration predictor':<58} {1000 * no_duration:>9.1f} ms")
    print(f"a step the discriminator sits out: x{scoring / learning:.2f} of one it learns in")
    print(f"a step the duration predictor sits out: x{no_duration / learning:.2f} of one it learns in")
    if device.type == "cuda":
        print(f"peak VRAM {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB")


if __name__ == "__main__":
    main()
