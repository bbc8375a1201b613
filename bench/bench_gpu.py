#!/usr/bin/env python3
"""Everything a GPU can tell this project, in one command: run it first whenever a GPU is at hand.

    .venv/bin/python bench/bench_gpu.py                   # on a CUDA machine: all parts, about 5-10 minutes
    .venv/bin/python bench/bench_gpu.py --smoke           # on the CPU, tiny model, seconds: the code path only
    .venv/bin/python bench/bench_gpu.py --parts flops     # the FLOP count and the cards' limits, CPU or GPU

Parts (each a table, ready for bench/RESULTS.md, and a JSON file with the same figures):
  step     MMS-size training step (scratch:mms generator, 36M; standard discriminator, 46.7M) in fp32,
           fp16 and bf16 at micro-batch 4, 8 and 16 on clips of --clip_seconds: seconds a step (timed
           after --burn_in steps), clips a second, peak VRAM allocated and reserved
  waits    where a training step makes the host wait for the GPU (CUDA's sync debug mode: each synchronising
           call counted by the line that made it, a step's worth): while it waits, the host queues no kernels
  fit      the largest micro-batch whose step (optimizer states, forward, backward, update: the same probe
           train_vits.py runs before training) fits in the user's RTX 2070, emulated on a larger card by
           capping this process's share of its memory (torch.cuda.set_per_process_memory_fraction) at
           --memory_limit_gib, on clips of --max_seconds (the longest a prepared corpus holds)
  data     the share of step time spent waiting for data with pinned memory and 0, 2, 4 loader workers
  compile  torch.compile of the discriminator and the generator's decoder, on and off (fp16, micro-batch 8)
  torchrun with 2 or more GPUs, a short train_vits.py run under torchrun (NCCL) on the demo corpus
  flops    the floating-point operations of one training step per clip of --clip_seconds (generator and
           discriminator, forward and backward: torch.utils.flop_counter, which counts matrix products and
           convolutions), and the clips a second each card's tensor peak (PEAK_TFLOPS) would allow; runs on a
           CPU too. On a GPU named in PEAK_TFLOPS, the step part's rows say what fraction of its peak they reach
           (the step part counts the FLOPs itself when this part does not run first)

Data is synthetic (random tokens, noise-and-tone audio of fixed length): step cost depends on lengths, not
on content. On a machine without CUDA (and without --smoke or --parts flops alone) it says so in one line and
exits 0.

It runs to its end whatever fails: each part on its own (one that raises is recorded as failed, with the
error, and the next part runs), the JSON rewritten after each part, and a configuration that does not fit
in memory reported as such, never timed.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from bench.machine import describe
from finetune.data.examples import Example, collate
from finetune.data.features import FeatureConfig, Features
from finetune.data.feed import MicroBatchFeed
from finetune.data.sampler import BucketSampler
from finetune.training.batch_fit import longest_batch, try_micro_batch
from finetune.training.precision import Precision
from finetune.training.step import StepSettings, TrainStep
from finetune.vits.discriminator import Discriminator, DiscriminatorConfig, parameter_count
from finetune.vits.generator import hop_length, ready_for_training, scratch_generator
from finetune.vits.losses import LossWeights

REPO = Path(__file__).resolve().parent.parent

PRECISIONS = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}
# Dense fp16/bf16 tensor-core peaks (TFLOPS) from the vendors' sheets, with FP32 accumulation (what PyTorch's
# autocast matrix products use). RTX 2070: 288 tensor cores x 64 FMA (128 FLOP) a clock x 1.62 GHz boost
# (reference card) = 59.7 TFLOPS with FP16 accumulation; GeForce Turing runs FP32 accumulation at half that
# rate. H100: NVIDIA's H100 datasheet, dense (without sparsity). Spec-sheet ceilings, never reached in practice.
PEAK_TFLOPS = {"RTX 2070": 29.9, "H100 SXM": 989.4, "H100 80GB HBM3": 989.4, "H100 PCIe": 756.0, "H200": 989.4}
LETTERS = list("abcçdeêfghiîjklmnopqrsştuûvwxyz '-")
CHARACTERS_PER_SECOND = 14  # read speech, about; MMS puts a blank between characters (2n + 1 tokens)
SAMPLE_RATE = 16_000


@dataclass
class Setup:
    device: torch.device
    size: str  # scratch generator size
    discriminator_width: float
    micro_batches: list[int]
    precisions: list[str]
    clip_seconds: float
    max_seconds: float
    steps: int
    burn_in: int
    fit_sizes: list[int]  # micro-batches tried for the memory fit, ascending
    fit_precisions: list[str]
    memory_limit_gib: float  # 0: no cap
    workers: list[int]
    compile: bool
    torchrun_target_hours: float
    parts: list[str] = field(default_factory=list)
    flops_per_clip: float | None = None  # counted by the flops part, when it ran


# ---------------------------------------------------------------- models and data


def synthetic_examples(count: int, seconds: float, hop: int, seed: int) -> list[Example]:
    """`count` clips of `seconds` each: random letters and a noisy tone (int16), like prepared clips."""
    rng = np.random.default_rng(seed)
    frames = int(seconds * SAMPLE_RATE) // hop
    characters = max(1, int(seconds * CHARACTERS_PER_SECOND))
    examples = []
    for index in range(count):
        tokens = np.zeros(2 * characters + 1, dtype=np.int32)
        tokens[1::2] = rng.integers(1, len(LETTERS) + 1, size=characters)
        t = np.arange(frames * hop) / SAMPLE_RATE
        wave = 0.3 * np.sin(2 * np.pi * rng.uniform(100, 300) * t) + 0.05 * rng.standard_normal(t.size)
        examples.append(Example(f"synthetic_{index}", tokens, (wave * 32767).astype(np.int16)))
    return examples


def build_step(setup: Setup, precision: str):
    """A fresh generator, discriminator and TrainStep at `precision` on the device."""
    torch.manual_seed(0)
    loaded = scratch_generator(setup.size, LETTERS, SAMPLE_RATE)
    model = ready_for_training(loaded.model).to(setup.device).train()
    discriminator = Discriminator(DiscriminatorConfig(width=setup.discriminator_width)).to(setup.device)
    hop = hop_length(model.config)
    features = Features(FeatureConfig(sample_rate=SAMPLE_RATE, hop_length=hop)).to(setup.device)
    step = TrainStep(
        model,
        discriminator,
        features,
        LossWeights(),
        StepSettings(),
        Precision(precision, PRECISIONS[precision]),
        setup.device,
    )
    return step, hop


def release() -> None:
    """After the caller dropped what it built: free it, so the next figure's peak memory is its own. Only a
    GPU's peak is measured; on a CPU a full collection only walked the whole heap (9.3 s in a profile of the
    suite, whose smoke run calls this in a test process holding every earlier test's objects)."""
    if torch.cuda.is_available():
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # a sync point: the step's kernels end before the clock is read


def peak_gib() -> tuple[float | None, float | None]:
    if not torch.cuda.is_available():
        return None, None
    return torch.cuda.max_memory_allocated() / 2**30, torch.cuda.max_memory_reserved() / 2**30


class DoesNotFit(Exception):
    """A configuration ran out of memory: reported, never timed."""


def run_step(step: TrainStep, batch) -> None:
    """One training step, or DoesNotFit: TrainStep catches an out-of-memory error itself (it drops the
    window, or fails the update), so the bench asks its result, not for an exception."""
    result = step.run([batch])
    if not result.applied and "out of memory" in result.reason:
        raise DoesNotFit(result.reason.split(":")[0])


def timed_steps(step: TrainStep, host_batches: list, setup: Setup) -> float:
    """Mean seconds of a whole training step (batch to device, forward, backward, update) after burn-in;
    DoesNotFit when a step ran out of memory."""
    times = []
    for index in range(setup.burn_in + setup.steps):
        sync(setup.device)
        started = time.perf_counter()
        batch = host_batches[index % len(host_batches)].to(setup.device, non_blocking=setup.device.type == "cuda")
        run_step(step, batch)
        sync(setup.device)
        if index >= setup.burn_in:
            times.append(time.perf_counter() - started)
    return statistics.mean(times)


def host_batches(examples: list[Example], micro_batch: int, hop: int, device: torch.device) -> list:
    starts = range(0, len(examples) - micro_batch + 1, micro_batch)
    batches = [collate(examples[i : i + micro_batch], hop) for i in starts]
    return [b.pin_memory() for b in batches] if device.type == "cuda" else batches


# ---------------------------------------------------------------- parts


def part_step(setup: Setup) -> list[dict]:
    rows = []
    if card_peak(setup.device) and setup.flops_per_clip is None:  # the share of the peak needs the count
        setup.flops_per_clip = flops_per_clip(setup, setup.clip_seconds)["total"]
    for precision in setup.precisions:
        step, hop = build_step(setup, precision)
        examples = synthetic_examples(2 * max(setup.micro_batches), setup.clip_seconds, hop, seed=1)
        for micro_batch in setup.micro_batches:
            release()
            row = {"precision": precision, "micro_batch": micro_batch, "clip_s": setup.clip_seconds}
            try:
                step_s = timed_steps(step, host_batches(examples, micro_batch, hop, setup.device), setup)
                allocated, reserved = peak_gib()
                row.update(
                    step_s=round(step_s, 4),
                    clips_per_s=round(micro_batch / step_s, 2),
                    peak_allocated_gib=allocated and round(allocated, 2),
                    peak_reserved_gib=reserved and round(reserved, 2),
                )
                peak = card_peak(setup.device)
                if peak and setup.flops_per_clip and precision != "fp32":
                    row["of_tensor_peak"] = round(micro_batch / step_s * setup.flops_per_clip / (peak[1] * 1e12), 4)
            except DoesNotFit as error:
                row.update(out_of_memory=str(error))
            rows.append(row)
            print(f"  step {row}", flush=True)
        del step
        release()
    return rows


def part_waits(setup: Setup) -> list[dict]:
    """Where a step makes the host wait for the GPU, by the line that asked: CUDA's sync debug mode warns at
    each synchronising call, over `setup.steps` steps after the burn-in. A step that waits often cannot
    queue the next kernels while the GPU works: on a fast card, the GPU idles (the H200's MMS-size step
    was host-bound: bench/RESULTS.md). On the CPU nothing waits: the part runs its code and finds none."""
    cuda = setup.device.type == "cuda"
    precision = "fp16" if cuda else "fp32"
    micro_batch = setup.micro_batches[len(setup.micro_batches) // 2]
    step, hop = build_step(setup, precision)
    examples = synthetic_examples(2 * micro_batch, setup.clip_seconds, hop, seed=6)
    batches = [b.to(setup.device) for b in host_batches(examples, micro_batch, hop, setup.device)]
    for index in range(max(1, setup.burn_in)):
        run_step(step, batches[index % len(batches)])
    sync(setup.device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if cuda:
            torch.cuda.set_sync_debug_mode("warn")
        try:
            for index in range(setup.steps):
                run_step(step, batches[index % len(batches)])
        finally:
            if cuda:
                torch.cuda.set_sync_debug_mode("default")
    where = Counter(
        f"{w.filename.split('site-packages/')[-1].replace(str(REPO) + '/', '')}:{w.lineno}"
        for w in caught
        if "synchroniz" in str(w.message).lower()
    )
    del step
    release()
    rows = [{"where": "all", "waits_per_step": round(where.total() / setup.steps, 2)}]
    rows += [{"where": place, "waits_per_step": round(count / setup.steps, 2)} for place, count in where.most_common()]
    for row in rows:
        row.update(precision=precision, micro_batch=micro_batch)
        print(f"  waits {row}", flush=True)
    return rows


def part_fit(setup: Setup) -> list[dict]:
    """The largest micro-batch whose probe step fits under the memory cap, per precision."""
    capped = setup.device.type == "cuda" and setup.memory_limit_gib > 0
    if capped:
        total = torch.cuda.get_device_properties(setup.device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, setup.memory_limit_gib * 2**30 / total), setup.device.index)
    rows = []
    try:
        for precision in setup.fit_precisions:
            step, hop = build_step(setup, precision)
            examples = synthetic_examples(max(setup.fit_sizes), setup.max_seconds, hop, seed=2)
            largest, peak, error = 0, None, ""
            for micro_batch in setup.fit_sizes:
                release()
                error = try_micro_batch(step, longest_batch(examples, micro_batch, hop, setup.device))
                if error:
                    break
                largest, peak = micro_batch, peak_gib()[1]
            rows.append(
                {
                    "precision": precision,
                    "memory_limit_gib": setup.memory_limit_gib if capped else None,
                    "clip_s": setup.max_seconds,
                    "largest_micro_batch": largest,
                    "peak_reserved_gib": peak and round(peak, 2),
                    "first_failure": error or None,
                }
            )
            print(f"  fit {rows[-1]}", flush=True)
            del step
            release()
    finally:
        if capped:
            torch.cuda.set_per_process_memory_fraction(1.0, setup.device.index)  # an index: torch refuses "cuda"
    return rows


def part_data(setup: Setup) -> list[dict]:
    """Share of step time spent in the feed (loader, pinned copy, transfer) with 0, 2, 4 workers."""
    precision = "fp16" if setup.device.type == "cuda" else "fp32"
    micro_batch = setup.micro_batches[len(setup.micro_batches) // 2]
    step, hop = build_step(setup, precision)
    examples = synthetic_examples(micro_batch * (setup.burn_in + setup.steps + 2), setup.clip_seconds, hop, seed=3)
    rows = []
    for workers in setup.workers:
        sampler = BucketSampler([e.frame_count(hop) for e in examples], micro_batch, seed=0)
        feed = MicroBatchFeed(examples, sampler, hop, workers, 0, setup.device)
        total_s = wait_before = 0.0
        for index in range(setup.burn_in + setup.steps):
            if index == setup.burn_in:
                wait_before = feed.wait_s  # worker start-up is left out, like the first steps
            started = time.perf_counter()
            batch, _ = feed.take()
            run_step(step, batch)
            sync(setup.device)
            if index >= setup.burn_in:
                total_s += time.perf_counter() - started
        wait_s = feed.wait_s - wait_before
        rows.append(
            {
                "workers": workers,
                "pinned": setup.device.type == "cuda",
                "micro_batch": micro_batch,
                "precision": precision,
                "data_wait_share": round(wait_s / total_s, 4),
                "step_s": round(total_s / setup.steps, 4),
            }
        )
        print(f"  data {rows[-1]}", flush=True)
        feed.restart()
    del step
    release()
    return rows


def part_compile(setup: Setup) -> list[dict]:
    """Step time with the discriminator and the decoder compiled, against plain; the first steps
    (compilation) timed apart."""
    precision = "fp16" if setup.device.type == "cuda" else "fp32"
    micro_batch = setup.micro_batches[len(setup.micro_batches) // 2]
    rows = []
    for compiled in (False, True):
        step, hop = build_step(setup, precision)
        if compiled:
            step.discriminator_module = step.discriminator = torch.compile(step.discriminator)
            step.model.decoder = torch.compile(step.model.decoder)
        batches = host_batches(
            synthetic_examples(2 * micro_batch, setup.clip_seconds, hop, seed=4), micro_batch, hop, setup.device
        )
        row = {"compile": compiled, "precision": precision, "micro_batch": micro_batch}
        try:
            started = time.perf_counter()
            for batch in batches[: setup.burn_in] or batches[:1]:
                run_step(step, batch.to(setup.device))
            sync(setup.device)
            row.update(
                first_steps_s=round(time.perf_counter() - started, 2),
                step_s=round(timed_steps(step, batches, setup), 4),
            )
        except DoesNotFit as error:
            row.update(out_of_memory=str(error))
        rows.append(row)
        print(f"  compile {row}", flush=True)
        del step
        release()
    return rows


def part_torchrun(setup: Setup) -> list[dict]:
    """A short train_vits.py run under torchrun on every GPU (NCCL), on the prepared demo corpus."""
    gpus = torch.cuda.device_count() if setup.device.type == "cuda" else 0
    if gpus < 2:
        return [{"processes": gpus, "skipped": "needs 2 or more GPUs"}]
    with tempfile.TemporaryDirectory() as tmp:
        data, run = Path(tmp) / "data", Path(tmp) / "run"
        subprocess.run(
            [
                sys.executable,
                "prepare_data.py",
                "--input_dir",
                "demo/corpus",
                "--data_dir",
                str(data),
                "--model_name",
                "scratch",
                "--num_workers",
                "4",
            ],
            cwd=REPO,
            check=True,
            capture_output=True,
        )
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nproc_per_node={gpus}",
            "train_vits.py",
            "--data_dir",
            str(data),
            "--checkpoint_dir",
            str(run / "checkpoints"),
            "--output_dir",
            str(run / "final_model"),
            "--model_name",
            "scratch:small",
            "--discriminator_width",
            "0.25",
            "--target_hours",
            str(setup.torchrun_target_hours),
            "--benchmark_samples",
            "64",
            "--val_samples",
            "4",
        ]
        started = time.perf_counter()
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
        wall_s = time.perf_counter() - started
        end = (
            [
                json.loads(line)
                for line in (run / "checkpoints" / "metrics.jsonl").read_text().splitlines()
                if '"kind": "end"' in line
            ]
            if (run / "checkpoints" / "metrics.jsonl").is_file()
            else []
        )
        row = {
            "processes": gpus,
            "backend": "nccl",
            "exit_status": done.returncode,
            "wall_s": round(wall_s, 1),
            "budget_s": setup.torchrun_target_hours * 3600,
        }
        if end:
            row.update(steps=end[0]["steps"], stop_reason=end[0]["stop_reason"], time_used_s=end[0]["time_used_s"])
        if done.returncode:
            row["stderr_tail"] = done.stderr[-2000:]
        print(f"  torchrun {row}", flush=True)
        return [row]


def flops_per_clip(setup: Setup, clip_seconds: float) -> dict:
    """FLOPs of one training step (both updates, forward and backward) on one clip, counted by
    torch.utils.flop_counter in fp32 on the setup's device (a count, not a timing: precision does not change
    it), split by model."""
    from torch.utils.flop_counter import FlopCounterMode

    step, hop = build_step(setup, "fp32")
    batch = host_batches(synthetic_examples(1, clip_seconds, hop, seed=5), 1, hop, setup.device)[0].to(setup.device)
    run_step(step, batch)  # the first step builds what is built once (optimizer states)
    counter = FlopCounterMode(display=False)
    with counter:
        run_step(step, batch)
    by_module = counter.get_flop_counts()  # keys: module paths, e.g. "GeneratorObjective.model.decoder"
    parts = {name for name, _ in step.model.named_children()}
    generator = sum(
        sum(counts.values())
        for key, counts in by_module.items()
        if key.split(".")[-1] in parts and key.split(".")[-2:-1] == ["model"]
    )
    total = counter.get_total_flops()
    del step
    release()
    return {"total": total, "generator": generator, "discriminator": total - generator}


def card_peak(device: torch.device) -> tuple[str, float] | None:
    """The PEAK_TFLOPS entry of this CUDA card, if it is named there."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next(((card, peak) for card, peak in PEAK_TFLOPS.items() if card in name), None)


def part_flops(setup: Setup) -> list[dict]:
    counted = flops_per_clip(setup, setup.clip_seconds)
    here = card_peak(setup.device)
    shown = ["RTX 2070", "H100 SXM", "H100 PCIe"]  # the user's card and the lent one (the other names match it)
    cards = {card: PEAK_TFLOPS[card] for card in ([here[0]] if here else []) + shown}
    rows = []
    for card, peak in cards.items():
        rows.append(
            {
                "card": card,
                "peak_tflops": peak,
                "clip_s": setup.clip_seconds,
                "gflops_per_clip": round(counted["total"] / 1e9, 1),
                "generator_gflops": round(counted["generator"] / 1e9, 1),  # its modules, forward and backward
                "discriminator_gflops": round(counted["discriminator"] / 1e9, 1),  # and the rest (mels)
                "clips_per_s_at_peak": round(peak * 1e12 / counted["total"], 1),
            }
        )
        print(f"  flops {rows[-1]}", flush=True)
    setup.flops_per_clip = counted["total"]
    return rows


PARTS = {
    "flops": part_flops,
    "step": part_step,
    "waits": part_waits,
    "fit": part_fit,
    "data": part_data,
    "compile": part_compile,
    "torchrun": part_torchrun,
}


# ---------------------------------------------------------------- report


def cell(value) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def table(rows: list[dict], columns: list[str]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(row.get(c)) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def markdown(results: dict) -> str:
    columns = {
        "flops": [
            "card",
            "peak_tflops",
            "clip_s",
            "gflops_per_clip",
            "generator_gflops",
            "discriminator_gflops",
            "clips_per_s_at_peak",
        ],
        "step": [
            "precision",
            "micro_batch",
            "clip_s",
            "step_s",
            "clips_per_s",
            "of_tensor_peak",
            "peak_allocated_gib",
            "peak_reserved_gib",
            "out_of_memory",
        ],
        "waits": ["where", "waits_per_step", "precision", "micro_batch"],
        "fit": ["precision", "memory_limit_gib", "clip_s", "largest_micro_batch", "peak_reserved_gib", "first_failure"],
        "data": ["workers", "pinned", "micro_batch", "precision", "data_wait_share", "step_s"],
        "compile": ["compile", "precision", "micro_batch", "first_steps_s", "step_s", "out_of_memory"],
        "torchrun": [
            "processes",
            "backend",
            "exit_status",
            "steps",
            "stop_reason",
            "time_used_s",
            "budget_s",
            "wall_s",
            "skipped",
        ],
    }
    out = [
        f"Machine: {results['machine']}",
        f"Date: {results['date']}",
        f"Command: `{results['command']}`",
        f"Generator scratch:{results['size']} ({results['generator_m']:.1f}M parameters), discriminator width "
        f"{results['discriminator_width']} ({results['discriminator_m']:.1f}M)",
    ]
    for name in results["parts"]:
        rows = results.get(name, [])
        failed = [row["failed"] for row in rows if "failed" in row]
        out += ["", f"**{name}**", ""] + ([f"failed: {failed[0]}"] if failed else [table(rows, columns[name])])
    return "\n".join(out)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny model, one step a figure: the code path only")
    parser.add_argument("--parts", nargs="+", default=list(PARTS), choices=list(PARTS))
    parser.add_argument("--clip_seconds", type=float, default=6.0, help="clip length of the step-time figures")
    parser.add_argument(
        "--max_seconds",
        type=float,
        default=15.0,
        help="clip length of the memory fit (prepare_data's default --max_seconds: the longest clips)",
    )
    parser.add_argument(
        "--memory_limit_gib",
        type=float,
        default=7.3,
        help="the memory cap of the fit: an 8 GB RTX 2070 has 7.79 GiB, less about 0.5 GiB that the "
        "CUDA context and cuDNN take outside PyTorch's allocator (0: no cap)",
    )
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--burn_in", type=int, default=3)
    parser.add_argument("--torchrun_target_hours", type=float, default=0.05)
    parser.add_argument("--json", default="bench_gpu.json", help="where the figures go as JSON")
    return parser.parse_args(argv)


def setup_for(args: argparse.Namespace) -> Setup:
    if args.smoke:
        return Setup(
            device=torch.device("cpu"),
            size="tiny",
            discriminator_width=0.0625,
            micro_batches=[1, 2],
            precisions=["fp32", "bf16"],
            clip_seconds=1.0,
            max_seconds=1.5,
            steps=1,
            burn_in=0,
            fit_sizes=[1, 2],
            fit_precisions=["fp32"],
            memory_limit_gib=0.0,
            workers=[0, 2],
            compile=False,
            torchrun_target_hours=args.torchrun_target_hours,
            parts=[p for p in args.parts if p != "compile"],
        )  # compiling on a CPU takes minutes
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    return Setup(
        device=device,
        size="mms",
        discriminator_width=1.0,
        micro_batches=[4, 8, 16],
        precisions=list(PRECISIONS),
        clip_seconds=args.clip_seconds,
        max_seconds=args.max_seconds,
        steps=args.steps,
        burn_in=args.burn_in,
        fit_sizes=[1, 2, 3, 4, 6, 8, 12, 16, 24, 32],
        fit_precisions=["fp16", "fp32"],
        memory_limit_gib=args.memory_limit_gib,
        workers=[0, 2, 4],
        compile=True,
        torchrun_target_hours=args.torchrun_target_hours,
        parts=list(args.parts),
    )


def run_part(name: str, setup: Setup) -> list[dict]:
    """A part's rows; one that fails is one row saying how (with its traceback printed), and the bench goes on."""
    try:
        return PARTS[name](setup)
    except Exception as error:  # any failure: the other parts still run and report
        traceback.print_exc()
        print(f"  {name} failed: {type(error).__name__}: {error}", flush=True)
        return [{"failed": f"{type(error).__name__}: {str(error)[:300]}"}]
    finally:
        release()


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if not args.smoke and not torch.cuda.is_available() and args.parts != ["flops"]:
        print(
            f"bench_gpu.py: no CUDA device on this machine ({describe()}): nothing measured; run it where a GPU "
            "is (--smoke runs its code path on the CPU)"
        )
        return 0
    setup = setup_for(args)
    step, _ = build_step(setup, "fp32")
    results = {
        "machine": describe(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": " ".join(["bench/bench_gpu.py", *(argv if argv is not None else sys.argv[1:])]),
        "size": setup.size,
        "discriminator_width": setup.discriminator_width,
        "generator_m": sum(p.numel() for p in step.model.parameters()) / 1e6,
        "discriminator_m": parameter_count(step.discriminator) / 1e6,
        "parts": setup.parts,
        "setup": {k: (str(v) if k == "device" else v) for k, v in asdict(setup).items()},
    }
    del step
    release()
    print(f"machine: {results['machine']}", flush=True)
    for name in setup.parts:
        print(f"{name} ...", flush=True)
        results[name] = run_part(name, setup)
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")  # as each part ends
    print()
    print(markdown(results))
    print(f"\nfigures also in {args.json}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
