#!/usr/bin/env python3
"""A corpus the size of the user's: the demo clips repeated to --clips clips (default 42,139, about the 23
hours of Common Voice Kurmanji), through prepare_data.py and into train_vits.py, each launched as a
process. Reports preparation time, load time, peak RSS against the RAM estimate, and the time from
launch to the first training step.

    .venv/bin/python bench/bench_scale.py                      # about 15-20 minutes on 2 CPU cores, ~3 GB of disk
    .venv/bin/python bench/bench_scale.py --clips 5000         # a smaller look

The corpus is an LJSpeech folder whose wavs/ are links to the demo's MP3s (each decoded and resampled
for real by preparation); texts repeat too, which changes nothing here.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.machine import describe

REPO = Path(__file__).resolve().parent.parent

DEMO = REPO / "demo" / "corpus"


def make_corpus(folder: Path, clips: int) -> None:
    rows = [line.split("|", 1) for line in (DEMO / "metadata.csv").read_text(encoding="utf-8").splitlines() if line]
    (folder / "wavs").mkdir(parents=True)
    lines = []
    for index in range(clips):
        source_id, text = rows[index % len(rows)]
        item_id = f"scale_{index:05d}"
        os.symlink(DEMO / "wavs" / f"{source_id}.mp3", folder / "wavs" / f"{item_id}.mp3")
        lines.append(f"{item_id}|{text}")
    (folder / "metadata.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")


def timed(command: list[str], log: Path) -> tuple[float, float]:
    """Wall seconds and peak RSS (GiB) of a command, via GNU time."""
    started = time.perf_counter()
    with open(log, "w") as out:
        done = subprocess.run(["/usr/bin/time", "-v", *command], stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{command[1]} failed (exit {done.returncode}); see {log}")
    peak_kib = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", log.read_text()).group(1))
    return wall, peak_kib / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clips", type=int, default=42139)
    parser.add_argument("--target_hours", type=float, default=0.1, help="train_vits.py's budget (loading included)")
    parser.add_argument("--precompute", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--work_dir", default=None)
    parser.add_argument(
        "--max_epochs",
        type=int,
        default=0,
        help="end the run after N epochs (0: at its deadline); "
        "a smoke run's end then does not depend on how fast the machine is",
    )
    args = parser.parse_args()
    print(f"machine: {describe()}", flush=True)
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="bench_scale_"))
    work.mkdir(parents=True, exist_ok=True)
    make_corpus(work / "corpus", args.clips)

    prepare_s, prepare_rss = timed(
        [
            sys.executable,
            "prepare_data.py",
            "--input_dir",
            str(work / "corpus"),
            "--data_dir",
            str(work / "data"),
            "--model_name",
            "scratch:tiny",
            "--num_workers",
            str(os.cpu_count()),
        ],
        work / "prepare.log",
    )
    report = json.loads((work / "data" / "prepare_report.json").read_text())
    hours = report["hours"]["kept"] if isinstance(report.get("hours"), dict) else report.get("hours")
    print(
        f"prepare_data.py: {args.clips} clips ({hours} h kept) in {prepare_s:.0f}s, peak RSS {prepare_rss:.2f} GiB",
        flush=True,
    )

    run = work / "run"
    train_s, train_rss = timed(
        [
            sys.executable,
            "train_vits.py",
            "--data_dir",
            str(work / "data"),
            "--checkpoint_dir",
            str(run / "checkpoints"),
            "--output_dir",
            str(run / "final_model"),
            "--model_name",
            "scratch:tiny",
            "--target_hours",
            str(args.target_hours),
            "--discriminator_width",
            "0.0625",
            "--gradient_accumulation_steps",
            "1",
            "--log_every_seconds",
            "0.001",
            "--precompute_mels" if args.precompute else "--no-precompute_mels",
            *(["--max_epochs", str(args.max_epochs)] if args.max_epochs else []),
        ],
        work / "train.log",
    )
    records = [json.loads(line) for line in (run / "checkpoints" / "metrics.jsonl").read_text().splitlines()]
    data = next(r for r in records if r["kind"] == "data")
    first = next(r for r in records if r["kind"] == "train")
    end = next(r for r in records if r["kind"] == "end")
    log = (run / "checkpoints" / "train.log").read_text()
    estimate = re.search(r"RAM for the corpus: about ([\d.]+) GiB", log)
    print(
        f"train_vits.py: {data['clips']} clips, {data['hours']:.2f} h, features "
        f"{'precomputed' if data['precomputed'] else 'per batch'}; loaded in {data['load_s']:.0f}s; corpus in RAM "
        f"{data['ram_bytes'] / 2**30:.2f} GiB against an estimate of {estimate.group(1) if estimate else '?'} GiB; "
        f"peak RSS {train_rss:.2f} GiB; first step done {first['time_used_s']:.0f}s after launch; "
        f"whole run {train_s:.0f}s of {args.target_hours * 3600:.0f}s ({end['stop_reason']}, {end['steps']} steps)",
        flush=True,
    )


if __name__ == "__main__":
    main()
