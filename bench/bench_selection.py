#!/usr/bin/env python3
"""Which evaluation's model should a run keep? The rule before (the lowest mean MCD) and the noise-aware
one (finetune/training/selection.py), each against an independent judgement of the same models.

    .venv/bin/python bench/bench_selection.py --work_dir W --voice_a demo/work/checkpoints/best_model
    .venv/bin/python bench/bench_selection.py --smoke             # the pipeline on a few clips, seconds a run

Scenarios (--scenarios), each run --seeds times:
  finetune  bench_finetune.py's: voice A fine-tuned onto B, A's recordings 1.25x slower and lower (B held
            out by id like A), --finetune_hours a run, --finetune_lr
  demo      `make demo`'s: a tiny voice from scratch on the crowd corpus, conditioned, speaking as ciya,
            --demo_hours a run

Each run is train_vits.py, launched by this script in a process of its own with two additions (a patch in
that process, not a flag of the tool): each whole evaluation's clip scores go to evaluations.jsonl (each
clip's MCD and the length ratio of each duration draw), and its model is saved to evaluated/step_N/.
The corpus is prepared with a large held-out share (--val_fraction); a run evaluates on the first
--val_samples held-out clips of its voice, as it would on its own, and the rest are the judge's.

  1. Independent judgement: every saved model through stock transformers (VitsModel.forward on the
     text, one duration draw a sentence as an app makes it, --judge_seeds seeds) on up to --judge_clips
     held-out clips no run evaluated on: the mean MCD-DTW against the recordings, and the median length
     ratio. The judge's best: the lowest mean MCD among the models whose median length is within the
     timing rule (all models when none is).
  2. Each rule replayed on the run's own evaluations, with their first k clips (k of --subsets, and all
     the run scored): which model it keeps. Eligibility is recomputed on those k clips.
  3. For each rule and k: how often the kept model is the judge's best; how often it is as good as the
     judge's best within the judge's own noise (a paired t bound at 95% over its clips); and how much
     worse, by the judge's mean MCD, it is than the judge's best (dB, mean over runs).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

from bench.launcher import run_script
from bench.machine import describe

REPO = Path(__file__).resolve().parent.parent

RULES = {
    "lowest mean (before)": None,
    "beyond noise, 80%": 0.80,
    "beyond noise, 90%": 0.90,
    "beyond noise, 95% (now)": 0.95,
    "beyond noise, 99%": 0.99,
}


# ---------------------------------------------------------------- the runs


def child(record_dir: str, argv: list[str]) -> int:
    """train_vits.main with every whole evaluation recorded and its model saved (runs in its own process)."""
    import train_vits
    from finetune.cli import run_script
    from finetune.training.run_evaluations import Evaluations
    from finetune.vits.voice_on_disk import export_model

    folder = Path(record_dir)
    folder.mkdir(parents=True, exist_ok=True)
    real = Evaluations.keep_if_best

    def keep_if_best(self, result, final=False):
        if result.clips_scored == result.clips_planned:
            export_model(self.model, self.exports.saver.tokenizer, folder / "evaluated" / f"step_{result.step:06d}")
            clips = {
                name: {"mcd": score.mcd_db, "draws": list(score.length_draws) or [score.length_ratio]}
                for name, score in result.per_clip.items()
            }
            with open(folder / "evaluations.jsonl", "a", encoding="utf-8") as out:
                out.write(json.dumps({"step": result.step, "clips": clips}) + "\n")
        return real(self, result, final)

    Evaluations.keep_if_best = keep_if_best
    return run_script(lambda: train_vits.main(argv))


def launch(flags: list[str], record_dir: Path, log: Path) -> None:
    """This script's child() in a process forked from bench/launcher.py's server (torch imported once)."""
    code = run_script(Path(__file__), ["--child_record", str(record_dir), "--", *flags], log)
    if code != 0:
        raise SystemExit(f"training failed (exit {code}); see {log}")


def prepare(flags: list[str], log: Path) -> None:
    code = run_script(REPO / "prepare_data.py", flags, log)
    if code != 0:
        raise SystemExit(f"preparation failed (exit {code}); see {log}")


def finetune_data(args, work: Path) -> tuple[Path, str, str]:
    """(B's prepared data, voice A, the target speaker: none) for the finetune scenario."""
    from bench.bench_finetune import make_voice_b

    data_b = work / "data_b"
    if not (data_b / "metadata.csv").is_file():
        shutil.rmtree(work / "data_a", ignore_errors=True)
        shutil.rmtree(work / "corpus_b", ignore_errors=True)
        prepare(
            [
                "--input_dir",
                str(REPO / "demo" / "corpus"),
                "--data_dir",
                str(work / "data_a"),
                "--model_name",
                args.voice_a,
                "--val_fraction",
                str(args.val_fraction),
                "--max_samples",
                str(args.max_samples),
                "--num_workers",
                "2",
            ],
            work / "data_a.log",
        )
        make_voice_b(work / "data_a", work / "corpus_b", 1.25, 0.0)
        prepare(
            [
                "--input_dir",
                str(work / "corpus_b"),
                "--data_dir",
                str(data_b),
                "--model_name",
                args.voice_a,
                "--val_fraction",
                str(args.val_fraction),
                "--num_workers",
                "2",
            ],
            work / "data_b.log",
        )
    return data_b, args.voice_a, ""


def demo_data(args, work: Path) -> tuple[Path, str, str]:
    data = work / "data_demo"
    if not (data / "metadata.csv").is_file():
        prepare(
            [
                "--dataset",
                str(REPO / "demo" / "corpus" / "validated.tsv"),
                "--data_dir",
                str(data),
                "--model_name",
                "scratch:tiny",
                "--val_fraction",
                str(args.val_fraction),
                "--num_workers",
                "2",
            ],
            work / "data_demo.log",
        )
    return data, "scratch:tiny", "ciya"


def run_flags(args, scenario: str, data: Path, model: str, target: str, folder: Path, seed: int) -> list[str]:
    flags = [
        "--data_dir",
        str(data),
        "--checkpoint_dir",
        str(folder / "checkpoints"),
        "--output_dir",
        str(folder / "final_model"),
        "--model_name",
        model,
        "--discriminator_width",
        "0.0625",
        "--gradient_accumulation_steps",
        "1",
        "--val_samples",
        str(args.val_samples),
        "--seed",
        str(seed),
        "--log_every_seconds",
        "60",
        "--device",
        "cpu",
        "--no-naturalness",
    ]
    if scenario == "finetune":
        flags += ["--target_hours", str(args.finetune_hours), "--learning_rate", str(args.finetune_lr)]
    else:
        flags += ["--target_hours", str(args.demo_hours), "--learning_rate", "2e-3", "--target_speaker", target]
    return flags + (["--max_epochs", str(args.max_epochs)] if args.max_epochs else [])


# ---------------------------------------------------------------- the judge


def held_out_rows(data: Path, target: str) -> list[tuple[str, str]]:
    """(id, text) of the held-out clips of the voice the runs speak as."""
    from finetune.data.metadata import read_rows

    return [
        (item, text) for item, speaker, text in read_rows(data / "metadata_val.csv") if not target or speaker == target
    ]


def judge_model(model_dir: Path, examples: list, seeds: int, panel=None) -> dict:
    """Stock transformers, one draw a sentence: each clip's MCD (mean over seeds) and every draw's length, and
    with `panel` (finetune/reporting/judges.py Panel, its voice set) each judge's mean over the clips. The draws
    run on the GPU where there is one (nine tenths of the judge's time on a CPU), so a figure is compared only
    with figures judged on the same machine."""
    import torch
    from transformers import VitsModel
    from transformers.utils import logging as transformers_logging

    from finetune.data.features import FeatureConfig, Features
    from finetune.reporting.measures import mcd_dtw

    transformers_logging.disable_progress_bar()  # a "Loading weights" bar a model judged, between the tables' lines
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    model = VitsModel.from_pretrained(str(model_dir)).eval().to(device)
    features = Features(FeatureConfig())
    mcd, ratios, judged = {}, [], {}
    for index, example in enumerate(examples):
        real = features.mel(torch.from_numpy(example.audio / 32768.0).float().unsqueeze(0))[0].numpy()
        scores = []
        for seed in range(seeds):
            torch.manual_seed(10_000 * seed + index)
            with torch.no_grad():
                out = model(input_ids=torch.from_numpy(example.token_ids.astype(np.int64)).unsqueeze(0).to(device))
            wave = out.waveform[0, : int(out.sequence_lengths[0])].float().cpu()
            scores.append(mcd_dtw(features.mel(wave.unsqueeze(0))[0].numpy(), real))
            ratios.append(int(out.sequence_lengths[0]) / len(example.audio))
            for name, value in (
                panel.score(wave.numpy(), 16000, example.item_id, example.audio / 32768.0) if panel else {}
            ).items():
                judged.setdefault(name, []).append(value)
        mcd[example.item_id] = float(np.mean(scores))
    return {
        "clips": mcd,
        "mcd_db": float(np.mean(list(mcd.values()))),
        "length_ratio": float(np.median(ratios)),
        **({"judges": {name: float(np.mean(values)) for name, values in judged.items()}} if judged else {}),
    }


def judge_run(run_dir: Path, data: Path, target: str, args) -> dict[int, dict]:
    """The judge's figures for every saved model of a run, on held-out clips the run did not evaluate."""
    from transformers import VitsTokenizer
    from transformers.utils import logging as transformers_logging

    from finetune.data.corpus import load_examples

    transformers_logging.disable_progress_bar()
    evaluated = {int(p.name.split("_")[1]): p for p in sorted((run_dir / "evaluated").glob("step_*"))}
    records = read_records(run_dir)
    seen = set(records[0]["clips"]) if records else set()
    judged_ids = [item for item, _ in held_out_rows(data, target) if item not in seen][: args.judge_clips]
    if not judged_ids or not evaluated:
        return {}
    listing = data / f"judge_{run_dir.name}.csv"
    listing.write_text(
        "".join(f"{i}|{t}\n" for i, t in held_out_rows(data, target) if i in set(judged_ids)), encoding="utf-8"
    )
    tokenizer = VitsTokenizer.from_pretrained(str(next(iter(evaluated.values()))))
    examples, _ = load_examples(data, listing.name, tokenizer, 256, 16000)
    return {step: judge_model(folder, examples, args.judge_seeds) for step, folder in evaluated.items()}


def read_records(run_dir: Path) -> list[dict]:
    path = run_dir / "evaluations.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()] if path.is_file() else []


# ---------------------------------------------------------------- the rules, replayed


def standings(records: list[dict], k: int, max_length_ratio: float) -> list:
    """Each evaluation as the rule saw it with its first k clips."""
    from finetune.reporting.measures import TimingRule
    from finetune.training.selection import standing

    rule, out = TimingRule(max_length_ratio), []
    for record in records:
        names = list(record["clips"])[:k]
        clips = {n: record["clips"][n]["mcd"] for n in names}
        ratio = float(np.median([r for n in names for r in record["clips"][n]["draws"]]))
        score = float(np.mean(list(clips.values())))
        out.append(standing(rule.accepts(ratio), ratio, score, max_length_ratio, clips, record["step"]))
    return out


def replay(candidates: list, confidence: float | None) -> int:
    """The step a rule keeps: the lowest mean (confidence None), or the noise-aware rule at `confidence`."""
    from finetune.training.selection import NONE_YET, judge_candidate

    kept = NONE_YET
    for candidate in candidates:
        if candidate is None:
            continue
        if confidence is None:
            if candidate.key() < kept.key():
                kept = candidate
        elif judge_candidate(candidate, kept, confidence).replace:
            kept = candidate
    return kept.step


def judge_best(judged: dict[int, dict], max_length_ratio: float) -> int:
    inside = {s: j for s, j in judged.items() if 1 / max_length_ratio <= j["length_ratio"] <= max_length_ratio}
    pool = inside or judged
    return min(pool, key=lambda s: pool[s]["mcd_db"])


def as_good(judged: dict[int, dict], step: int, best: int) -> bool:
    """The kept model is not worse than the judge's best beyond the judge's own noise (paired, 95%)."""
    from finetune.training.selection import Standing, compare

    a = Standing(True, 0.0, judged[best]["mcd_db"], judged[best]["clips"], best)
    b = Standing(True, 0.0, judged[step]["mcd_db"], judged[step]["clips"], step)
    return step == best or not compare(a, b).beyond_noise


# ---------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenarios", nargs="*", default=["finetune", "demo"], choices=["finetune", "demo"])
    parser.add_argument("--seeds", type=int, default=3, help="runs a scenario (seeds 1..N)")
    parser.add_argument(
        "--voice_a",
        default=str(REPO / "demo" / "work" / "checkpoints" / "best_model"),
        help="the finetune scenario's starting voice (default: make demo's)",
    )
    parser.add_argument("--finetune_hours", type=float, default=0.05)
    parser.add_argument("--finetune_lr", type=float, default=5e-4)
    parser.add_argument("--demo_hours", type=float, default=0.1)
    parser.add_argument(
        "--val_fraction", type=float, default=0.4, help="held out at preparation (the runs' and the judge's)"
    )
    parser.add_argument("--val_samples", type=int, default=12, help="held-out clips each run evaluates on")
    parser.add_argument(
        "--subsets", type=int, nargs="*", default=[2, 5], help="rules replayed on the first k clips too"
    )
    parser.add_argument("--judge_clips", type=int, default=40)
    parser.add_argument("--judge_seeds", type=int, default=3)
    parser.add_argument(
        "--max_samples", type=int, default=0, help="the finetune scenario on the first N clips (0: all)"
    )
    parser.add_argument("--max_epochs", type=int, default=0)
    parser.add_argument("--max_length_ratio", type=float, default=1.25)
    parser.add_argument("--work_dir", default=None)
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="finetune only, from an untrained tiny voice, 24 clips, 1 epoch: the pipeline, not a measurement",
    )
    parser.add_argument("--child_record", default=None, help=argparse.SUPPRESS)
    parser.add_argument("rest", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_record:
        sys.exit(child(args.child_record, args.rest))
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="bench_selection_"))
    work.mkdir(parents=True, exist_ok=True)
    if args.smoke:
        args.scenarios, args.seeds, args.max_samples, args.max_epochs = ["finetune"], 1, 24, 1
        args.finetune_hours, args.val_samples, args.subsets, args.judge_clips, args.judge_seeds = 0.1, 4, [2], 4, 1
        args.voice_a = "scratch:tiny"
    print(f"machine: {describe()}", flush=True)
    rows = []
    for scenario in args.scenarios:
        data, model, target = (finetune_data if scenario == "finetune" else demo_data)(args, work)
        for seed in range(1, args.seeds + 1):
            folder = work / f"{scenario}_{seed}"
            if not (folder / "evaluations.jsonl").is_file():
                shutil.rmtree(folder, ignore_errors=True)
                launch(
                    run_flags(args, scenario, data, model, target, folder, seed), folder, work / f"{folder.name}.log"
                )
            rows.append(score_run(args, scenario, seed, folder, data, target))
    summarise(rows, args)
    (work / "results.json").write_text(json.dumps(rows, indent=2))
    print(f"work folder: {work}")


def score_run(args, scenario: str, seed: int, folder: Path, data: Path, target: str) -> dict:
    records = read_records(folder)
    judged = judge_run(folder, data, target, args)
    if not judged:
        raise SystemExit(f"{folder}: no evaluation to judge (see its log)")
    best = judge_best(judged, args.max_length_ratio)
    scored = len(records[0]["clips"])
    row = {
        "scenario": scenario,
        "seed": seed,
        "evaluations": len(records),
        "clips": scored,
        "judge_best": best,
        "judge": {
            str(s): {"mcd_db": round(j["mcd_db"], 3), "length_ratio": round(j["length_ratio"], 3)}
            for s, j in judged.items()
        },
        "kept": {},
    }
    for k in sorted({*[k for k in args.subsets if k < scored], scored}):
        candidates = standings(records, k, args.max_length_ratio)
        for name, confidence in RULES.items():
            step = replay(candidates, confidence)
            row["kept"][f"{name} | {k}"] = {
                "step": step,
                "agrees": step == best,
                "as_good": as_good(judged, step, best),
                "excess_db": judged[step]["mcd_db"] - judged[best]["mcd_db"],
            }
    print(
        f"{scenario} seed {seed}: {len(records)} evaluations on {scored} clips; the judge's best: step {best} "
        f"(MCD {judged[best]['mcd_db']:.3f}, length x{judged[best]['length_ratio']:.2f}); kept: "
        + ", ".join(
            f"{key} -> {v['step']}" for key, v in row["kept"].items() if key.startswith(("lowest", "beyond noise, 95"))
        ),
        flush=True,
    )
    return row


def summarise(rows: list[dict], args) -> None:
    print(
        f"\n{len(rows)} runs; the judge: stock transformers, one draw a sentence, {args.judge_seeds} seeds, "
        f"up to {args.judge_clips} held-out clips no run evaluated on"
    )
    print(
        "| rule | clips the run judged on | kept = the judge's best | as good within the judge's noise | "
        "judge's MCD above its best (mean, dB) |\n| --- | ---: | ---: | ---: | ---: |"
    )
    keys = sorted(
        {key for row in rows for key in row["kept"]},
        key=lambda k: (int(k.split(" | ")[1]), list(RULES).index(k.split(" | ")[0])),
    )
    for key in keys:
        cells = [row["kept"][key] for row in rows if key in row["kept"]]
        rule, k = key.split(" | ")
        print(
            f"| {rule} | {k} | {sum(c['agrees'] for c in cells)}/{len(cells)} | {sum(c['as_good'] for c in cells)}/{len(cells)} | "
            f"{np.mean([c['excess_db'] for c in cells]):.3f} |"
        )
    if not all(math.isfinite(c["excess_db"]) for row in rows for c in row["kept"].values()):
        print("(a kept model's judge score is not finite)")


if __name__ == "__main__":
    main()
