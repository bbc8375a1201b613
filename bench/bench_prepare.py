#!/usr/bin/env python3
"""Preparation throughput on the demo corpus at 1 and 2 workers, and the speed-up of a second run.

Each configuration runs prepare_data.py as a user would (a fresh process, timed from launch to exit)
into a fresh folder, then runs it again on the same folder. Figures: clips/s, hours of (source) audio
per minute, and first-run / second-run time.

    .venv/bin/python bench/bench_prepare.py [--workers 1 2] [--repeats 1]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import soundfile as sf

from bench.machine import describe

REPO = Path(__file__).resolve().parent.parent

CORPUS = REPO / "demo" / "corpus"


def timed_run(data_dir: Path, workers: int, max_samples: int) -> float:
    command = [
        sys.executable,
        str(REPO / "prepare_data.py"),
        "--input_dir",
        str(CORPUS),
        "--data_dir",
        str(data_dir),
        "--model_name",
        "scratch:tiny",
        "--num_workers",
        str(workers),
        "--max_samples",
        str(max_samples),
    ]
    started = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--max_samples", type=int, default=0, help="clips prepared (0: all; a few for a smoke run)")
    args = parser.parse_args()
    files = sorted((CORPUS / "wavs").glob("*"))[: args.max_samples or None]
    audio_hours = sum(sf.info(str(f)).duration for f in files) / 3600
    print(f"machine: {describe()}")
    print(f"corpus: {len(files)} clips, {audio_hours * 60:.1f} min of source audio (demo/corpus)")
    print(f"{'workers':>7} {'first s':>8} {'clips/s':>8} {'audio h/min':>11} {'rerun s':>8} {'speed-up':>8}")
    for workers in args.workers:
        for _ in range(args.repeats):
            with tempfile.TemporaryDirectory() as tmp:
                first = timed_run(Path(tmp) / "data", workers, args.max_samples)
                second = timed_run(Path(tmp) / "data", workers, args.max_samples)
            print(
                f"{workers:>7} {first:>8.2f} {len(files) / first:>8.1f} {audio_hours / (first / 60):>11.3f} "
                f"{second:>8.2f} {first / second:>7.1f}x"
            )


if __name__ == "__main__":
    main()
