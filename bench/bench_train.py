#!/usr/bin/env python3
"""train_vits.py as a user runs it, on the demo corpus with the tiny model: how close the run ends to
its budget (launch to exit, against --target_hours), throughput, the share of step time spent waiting
for data, the learning rate of the last step, and load time and RAM per hour of audio, with features
precomputed into RAM or computed per batch.

    .venv/bin/python bench/bench_train.py --target_hours 0.05 --repeats 3
    .venv/bin/python bench/bench_train.py --target_hours 0.02 --features both
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.demo_data import prepare_demo
from bench.machine import describe

REPO = Path(__file__).resolve().parent.parent

PEAK_LR, FLOOR = 2e-3, 0.1


def one_run(
    data_dir: Path,
    work: Path,
    target_hours: float,
    precompute: bool,
    defaults: bool = False,
    processes: int = 1,
    max_epochs: int = 0,
) -> dict:
    command = [
        sys.executable,
        str(REPO / "train_vits.py"),
        "--data_dir",
        str(data_dir),
        "--checkpoint_dir",
        str(work / "checkpoints"),
        "--output_dir",
        str(work / "final_model"),
        "--model_name",
        "scratch:tiny",
        "--target_hours",
        str(target_hours),
        "--log_every_seconds",
        "5",
        "--precompute_mels" if precompute else "--no-precompute_mels",
    ]
    if not defaults:  # the demo's settings: a small discriminator, no accumulation, a from-scratch learning rate
        command += [
            "--discriminator_width",
            "0.0625",
            "--learning_rate",
            str(PEAK_LR),
            "--gradient_accumulation_steps",
            "1",
        ]
    if max_epochs:  # a run that ends by its epochs, whatever the machine's speed (the smoke test's)
        command += ["--max_epochs", str(max_epochs)]
    if processes > 1:  # data parallel on the CPU: torchrun, gloo
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={processes}",
            *command[1:],
        ]
    started = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True)
    wall = time.perf_counter() - started
    records = [json.loads(line) for line in (work / "checkpoints" / "metrics.jsonl").read_text().splitlines()]
    data = next(r for r in records if r["kind"] == "data")
    end = next(r for r in records if r["kind"] == "end")
    planned = [r["samples_per_s"] for r in records if r["kind"] == "train" and r["step"] > 25] or [
        r["samples_per_s"] for r in records if r["kind"] == "train" and r["step"] > 2
    ]
    peak = 2e-5 if defaults else PEAK_LR
    return {
        "target_s": target_hours * 3600,
        "wall_s": wall,
        "steps": end["steps"],
        "last_lr": end["last_lr"],
        "at_floor": abs(end["last_lr"] - peak * FLOOR) < 1e-12,
        "samples_per_s": statistics.mean(planned) if planned else float("nan"),
        "data_wait": end["data_wait_share"],
        "load_s_per_h": data["load_s"] / data["hours"],
        "ram_gib_per_h": data["ram_bytes"] / 2**30 / data["hours"],
        "precompute": data["precomputed"],
        "stop": end["stop_reason"],
        "ended_s": end["time_used_s"],
        # the step profile's phases against the loop's own clock around each optimizer step
        "profiled": sum(end["profile_s"].values()) / end["train_s"] if end.get("train_s") else float("nan"),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--target_hours", type=float, nargs="+", default=[0.05])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--features", choices=["precomputed", "per-batch", "both"], default="precomputed")
    parser.add_argument(
        "--defaults",
        action="store_true",
        help="every training flag at its default (46.7M discriminator, batch 8, accumulation 4, lr 2e-5)",
    )
    parser.add_argument("--processes", type=int, default=1, help="data-parallel processes (torchrun, gloo)")
    parser.add_argument(
        "--max_samples", type=int, default=0, help="demo clips prepared (0: all; a few for a smoke run)"
    )
    parser.add_argument(
        "--max_epochs",
        type=int,
        default=0,
        help="end each run after N epochs (0: at its deadline); "
        "a smoke run's end then does not depend on how fast the machine is",
    )
    args = parser.parse_args()
    modes = {"precomputed": [True], "per-batch": [False], "both": [True, False]}[args.features]
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = prepare_demo(
            Path(tmp) / "data", val_fraction=0.02, max_samples=args.max_samples
        )  # as users prepare: held-out clips to score
        train_clips = len((data_dir / "metadata.csv").read_text().splitlines())
        val_clips = len((data_dir / "metadata_val.csv").read_text().splitlines())
        print(f"machine: {describe()}")
        settings = (
            "every training flag at its default (discriminator width 1, batch 8, accumulation 4, lr 2e-5)"
            if args.defaults
            else "discriminator width 1/16, batch 8, no accumulation"
        )
        print(
            f"tiny scratch model, {settings}; {args.processes} process(es); demo corpus: {train_clips} "
            f"training clips, {val_clips} held out"
        )
        print(
            f"{'target s':>8} {'wall s':>7} {'error':>6} {'steps':>5} {'samples/s':>9} {'data wait':>9} "
            f"{'last lr':>9} {'at floor':>8} {'load s/h':>8} {'RAM GiB/h':>9} {'features':>11} {'ended s':>7} "
            f"{'profiled':>8}"
        )
        for target in args.target_hours:
            for precompute in modes:
                for repeat in range(args.repeats):
                    r = one_run(
                        data_dir,
                        Path(tmp) / f"run_{target}_{precompute}_{repeat}",
                        target,
                        precompute,
                        args.defaults,
                        args.processes,
                        args.max_epochs,
                    )
                    error = 100 * (r["wall_s"] - r["target_s"]) / r["target_s"]
                    print(
                        f"{r['target_s']:>8.0f} {r['wall_s']:>7.1f} {error:>5.1f}% {r['steps']:>5} "
                        f"{r['samples_per_s']:>9.1f} {100 * r['data_wait']:>8.2f}% {r['last_lr']:>9.2e} "
                        f"{str(r['at_floor']):>8} {r['load_s_per_h']:>8.1f} "
                        f"{r['ram_gib_per_h']:>9.3f} {'precomputed' if r['precompute'] else 'per batch':>11} "
                        f"{r['ended_s']:>7.1f} {100 * r['profiled']:>7.1f}%",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
