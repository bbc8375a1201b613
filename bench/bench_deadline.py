#!/usr/bin/env python3
"""Does a run spend its budget, to within 1%, whatever its step size, its start and whatever else the machine does?

Runs of train_vits.py on the demo corpus (scratch:tiny), each timed from launch to exit against
--target_hours:

    fine         the demo's settings (a small discriminator, one micro-batch a step), from new weights: steps of
                 about half a second on 2 CPU cores
    coarse       every other flag at its default (the standard discriminator, 4 micro-batches of 8 clips
                 a step): steps of about a sixth of a 180 s budget on 2 CPU cores
    pretrained   fine steps from a pretrained tiny voice (the demo recipe for --pretrain_hours, made once in the
                 work folder), as a user's fine-tune starts: its discriminator is warmed up first
    NAME-busy    NAME with two busy processes (`while True: pass`) from half-way to the end
    NAME-busy90  NAME with the two busy processes from 90% of the budget: the machine gets busy as the run
                 ends, when the final save has been planned at an idle machine's cost
    resumed      (fine) SIGINT half-way through the budget, then --resume auto: the resumed process has
                 measured nothing yet (its first evaluation is its final one, cold)
    slow-eval    (fine) the final evaluation is slowed on purpose: each held-out clip takes --slow_clip_s
                 more (an injected sleep) than in the evaluations before it

A run is within 1% when launch-to-exit (summed over both processes for the resumed run) is within 1% of
the budget, either way: a run that ends early leaves the user's hours unused. The run's own account
(time_used_s in metrics.jsonl), its step time, how its last step ended and what its finish left out for
the deadline (last_model, its tempo fit, the last checkpoint) are printed beside it.

    .venv/bin/python bench/bench_deadline.py --cases fine coarse fine-busy coarse-busy    # 0.05 h each
    .venv/bin/python bench/bench_deadline.py --cases pretrained-busy pretrained-busy90 --target_hours 0.02
    .venv/bin/python bench/bench_deadline.py --smoke              # the slow-eval path, 2 epochs (CI smoke test)
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

from bench.machine import describe

REPO = Path(__file__).resolve().parent.parent

BUSY = "while True: pass"


@dataclass
class Settings:
    target_hours: float
    val_samples: int
    batch_size: int
    slow_clip_s: float
    max_epochs: int = 0  # 0: the run ends at its deadline (the measurement); the smoke run ends by its epochs
    start: str = "scratch:tiny"  # --model_name: new weights, or the pretrained voice's folder


STEPS = {  # train_vits.py flags of each step size
    "fine": ["--discriminator_width", "0.0625", "--learning_rate", "2e-3", "--gradient_accumulation_steps", "1"],
    "coarse": [],  # the standard discriminator, --gradient_accumulation_steps 4, --learning_rate 2e-5
}
RUNS = ("fine", "coarse", "pretrained")  # each alone, -busy (from half-way) or -busy90 (from 90% of the budget)
BUSY_FROM = {"busy": 0.5, "busy90": 0.9}
CASES = (*RUNS, *(f"{run}-{busy}" for run in RUNS for busy in BUSY_FROM), "resumed", "slow-eval")


def prepare(data_dir: Path, max_samples: int) -> None:
    command = [
        sys.executable,
        str(REPO / "prepare_data.py"),
        "--input_dir",
        str(REPO / "demo" / "corpus"),
        "--data_dir",
        str(data_dir),
        "--model_name",
        "scratch:tiny",
        "--val_fraction",
        "0.05",
    ]
    if max_samples:
        command += ["--max_samples", str(max_samples)]
    subprocess.run(command, check=True, capture_output=True)


def train_command(
    data_dir: Path, work: Path, settings: Settings, slow_clip_s: float = 0.0, steps: str = "fine"
) -> list[str]:
    flags = [
        "--data_dir",
        str(data_dir),
        "--checkpoint_dir",
        str(work / "checkpoints"),
        "--output_dir",
        str(work / "final_model"),
        "--model_name",
        settings.start,
        *STEPS[steps],
        "--target_hours",
        str(settings.target_hours),
        "--val_samples",
        str(settings.val_samples),
        "--log_every_seconds",
        "10",
        "--batch_size",
        str(settings.batch_size),
    ]
    if settings.max_epochs:
        flags += ["--max_epochs", str(settings.max_epochs)]
    if slow_clip_s:  # this script as the launcher: it slows the final evaluation down, then runs train_vits
        return [sys.executable, __file__, "--child_slow_clip_s", str(slow_clip_s), "--", *flags]
    return [sys.executable, str(REPO / "train_vits.py"), *flags]


def launch_until_exit(command: list[str], log: Path, at_half=None, half_s: float = 0.0) -> float:
    """Seconds from launch to exit; `at_half(process)` is called `half_s` after launch."""
    started = time.perf_counter()
    with open(log, "a", encoding="utf-8") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        if at_half is not None:
            while process.poll() is None and time.perf_counter() - started < half_s:
                time.sleep(0.1)
            if process.poll() is None:
                at_half(process)
        process.wait()
    return time.perf_counter() - started


def run_end(work: Path) -> dict:
    records = [json.loads(line) for line in (work / "checkpoints" / "metrics.jsonl").read_text().splitlines()]
    end = next((r for r in reversed(records) if r["kind"] == "end"), None)
    if end is None:  # it stopped before training (a budget too small for this machine): see run.log
        log = (work / "checkpoints" / "train.log").read_text().strip().splitlines()
        return {
            "stop": f"no training ({log[-1] if log else 'no log'})",
            "steps": 0,
            "time_used_s": float("nan"),
            "final_eval": "none",
            "eval_s": [],
        }
    evals = [r for r in records if r["kind"] == "eval"]
    skipped = [r for r in records if r["kind"] == "eval_skipped"]
    final = evals[-1] if evals else {}
    plan = next((r for r in reversed(records) if r["kind"] == "plan"), {})
    log = (work / "checkpoints" / "train.log").read_text()
    cut = next((line.split(": ", 1)[1] for line in log.splitlines() if "its last micro-batch cut to" in line), "")
    left_out = [r["part"] for r in records if r["kind"] == "left_out"]
    return {
        "left_out": left_out,
        "stop": end["stop_reason"],
        "steps": end["steps"],
        "time_used_s": end["time_used_s"],
        # the plan's step time; a run that never left its benchmark has no plan: its steps' mean time
        "step_s": plan.get("step_s", end.get("train_s", float("nan")) / max(1, end["steps"])),
        "last_step": cut.split(",")[0] if cut else "whole",
        "final_eval": (
            "skipped"
            if skipped and skipped[-1].get("final")
            else f"{final.get('clips_scored')}/{final.get('clips_planned')} clips"
            + (", cut short" if final.get("cut_short") else "")
        ),
        "eval_s": [round(r["seconds"], 1) for r in evals],
    }


def case_resumed(data_dir: Path, work: Path, settings: Settings) -> dict:
    command = train_command(data_dir, work, settings)
    first = launch_until_exit(
        command, work / "run.log", lambda p: p.send_signal(signal.SIGINT), settings.target_hours * 1800
    )
    second = launch_until_exit(command + ["--resume", "auto"], work / "run.log")
    return {"wall_s": first + second, "first_s": first, **run_end(work)}


def case_busy(data_dir: Path, work: Path, settings: Settings, steps: str = "fine", busy_from: float = 0.5) -> dict:
    """Two busy processes from `busy_from` of the budget to the run's exit."""
    busy: list[subprocess.Popen] = []

    def load_up(_process) -> None:
        busy.extend(subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(2))

    try:
        wall = launch_until_exit(
            train_command(data_dir, work, settings, steps=steps),
            work / "run.log",
            load_up,
            settings.target_hours * 3600 * busy_from,
        )
    finally:
        for process in busy:
            process.kill()
            process.wait()
    return {"wall_s": wall, **run_end(work)}


def pretrain(data_dir: Path, work: Path, hours: float) -> Path:
    """A tiny voice trained with the demo's recipe for `hours` (reused when the work folder holds it): the
    start of the pretrained cases, a fine-tune as a user's. Its folder is not the idle case's ("pretrained"): when it
    was, that case deleted its start, trained one in its own folder and was refused for those checkpoints."""
    folder = work / "pretrained_start"
    if not (folder / "final_model" / "config.json").is_file():
        shutil.rmtree(folder, ignore_errors=True)
        settings = Settings(hours, 16, 8, 0.0)
        command = train_command(data_dir, folder, settings)
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    return folder / "final_model"


def case_idle(data_dir: Path, work: Path, settings: Settings, steps: str = "fine") -> dict:
    wall = launch_until_exit(train_command(data_dir, work, settings, steps=steps), work / "run.log")
    return {"wall_s": wall, **run_end(work)}


def case_slow_eval(data_dir: Path, work: Path, settings: Settings) -> dict:
    wall = launch_until_exit(train_command(data_dir, work, settings, settings.slow_clip_s), work / "run.log")
    return {"wall_s": wall, **run_end(work)}


def child_slow_final_evaluation(slow_clip_s: float, argv: list[str]) -> int:
    """train_vits.main with its final evaluation slowed: each group of clips sleeps `slow_clip_s` a clip."""
    import train_vits
    from finetune.cli import run_script
    from finetune.reporting import evaluation
    from finetune.training import finishing

    final = {"on": False}
    real_finish, real_score = finishing.finish, evaluation.Evaluator.score_group

    def finish(self, reason):
        final["on"] = True
        return real_finish(self, reason)

    def score_group(self, model, group, *a, **k):
        if final["on"]:
            time.sleep(slow_clip_s * len(group))
        return real_score(self, model, group, *a, **k)

    finishing.finish, evaluation.Evaluator.score_group = finish, score_group
    return run_script(lambda: train_vits.main(argv))


def describe_case(case: str, result: dict, target_s: float) -> str:
    """One line: launch to exit against the budget, the run's own account, how its final evaluation went."""
    over = 100 * (result["wall_s"] - target_s) / target_s
    verdict = "within 1%" if abs(over) <= 1.0 else ("OVER by more than 1%" if over > 0 else "EARLY by more than 1%")
    line = f"{case:11s} budget {target_s:.1f}s: launch to exit {result['wall_s']:.1f}s ({over:+.2f}%, {verdict})"
    if not result["steps"]:
        return f"{line}; {result['stop']}"
    line += (
        f"; run's own account {result['time_used_s']:.1f}s; {result['steps']} steps of {result['step_s']:.2f}s "
        f"({100 * result['step_s'] / target_s:.1f}% of the budget), the last {result['last_step']}; stop "
        f"{result['stop']}; final evaluation {result['final_eval']}; evaluations took {result['eval_s']} s"
    )
    if result["left_out"]:
        line += f"; left out for the deadline: {', '.join(result['left_out'])}"
    return line + (f"; first process {result['first_s']:.1f}s" if "first_s" in result else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target_hours", type=float, default=0.05)
    parser.add_argument("--cases", nargs="*", default=["fine", "coarse", "fine-busy", "coarse-busy"], choices=CASES)
    parser.add_argument(
        "--pretrain_hours", type=float, default=0.05, help="the pretrained cases' start: the demo recipe for this long"
    )
    parser.add_argument("--val_samples", type=int, default=16)
    parser.add_argument("--slow_clip_s", type=float, default=1.0, help="extra seconds a clip in the final evaluation")
    parser.add_argument("--max_samples", type=int, default=0, help="prepare only the first N demo clips (0: all)")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="the slow-eval case's code path: 40 clips, 2 epochs "
        "inside a budget that leaves room for any machine (it measures nothing)",
    )
    parser.add_argument(
        "--data_dir", default=None, help="an already prepared corpus (default: the demo, prepared here)"
    )
    parser.add_argument("--batch_size", type=int, default=8, help="clips per micro-batch (train_vits.py's default: 8)")
    parser.add_argument("--work_dir", default=None)
    parser.add_argument("--child_slow_clip_s", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("rest", nargs="*", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.child_slow_clip_s:
        sys.exit(child_slow_final_evaluation(options.child_slow_clip_s, options.rest))
    max_epochs = 0
    if options.smoke:
        options.target_hours, options.cases, options.val_samples, options.max_samples = 0.05, ["slow-eval"], 2, 40
        options.slow_clip_s, max_epochs = 0.2, 2
    print(f"machine: {describe()}")
    work = Path(options.work_dir or tempfile.mkdtemp(prefix="bench_deadline_"))
    data_dir = Path(options.data_dir) if options.data_dir else work / "data"
    if not (data_dir / "metadata.csv").is_file():
        prepare(data_dir, options.max_samples)
    settings = Settings(options.target_hours, options.val_samples, options.batch_size, options.slow_clip_s, max_epochs)
    target_s = options.target_hours * 3600
    for case in options.cases:
        folder = work / case
        shutil.rmtree(folder, ignore_errors=True)  # a run folder of an earlier bench would be resumed or refused
        folder.mkdir(parents=True)
        run, _, busy = case.partition("-")
        start = pretrain(data_dir, work, options.pretrain_hours) if run == "pretrained" else "scratch:tiny"
        case_settings = replace(settings, start=str(start))
        steps = "coarse" if run == "coarse" else "fine"
        if case == "resumed":
            result = case_resumed(data_dir, folder, case_settings)
        elif case == "slow-eval":
            result = case_slow_eval(data_dir, folder, case_settings)
        elif busy:
            result = case_busy(data_dir, folder, case_settings, steps, BUSY_FROM[busy])
        else:
            result = case_idle(data_dir, folder, case_settings, steps)
        print(describe_case(case, result, target_s), flush=True)
        if options.smoke and not result["steps"]:
            sys.exit(f"the smoke run trained nothing: {result['stop']}")
    print(f"work folder: {work}")


if __name__ == "__main__":
    main()
