#!/usr/bin/env python3
"""Many voices in, one voice out: is a conditioned fine-tune on the whole crowd nearer the target speaker
than pooling the crowd into one voice, or than training on the target's few clips alone?

    .venv/bin/python bench/bench_speakers.py --base_model demo/work/checkpoints/best_model   # ~25 min, 2 cores
    .venv/bin/python bench/bench_speakers.py                    # pretrains voice A first (bench_finetune's way)
    .venv/bin/python bench/bench_speakers.py --smoke            # the whole pipeline with tiny budgets
    .venv/bin/python bench/bench_speakers.py --modes conditioned --train_flags="--target_share 0.9"  # a lever

1. Voice A, the pretrained small voice: --base_model, or a tiny VITS pretrained on the demo corpus.
2. A crowd made from the demo recordings, every sentence spoken by one speaker of four, each the demo
   voice resampled as a tape played slower or faster (tempo, pitch and formants move together) and some
   with noise. The target, T, is A 1.3x slower and has --target_share of the clips (a minority):

       T   1.30x longer, clean              (--target_share, 15%)
       F   0.80x (faster and higher), clean
       N   0.90x, white noise at 25 dB SNR
       A   1.00x (voice A itself), noise at 15 dB SNR

   --test_clips more of T's sentences are kept out of the crowd altogether: the test set, unseen by every run.
3. The crowd is prepared as a user prepares Common Voice (a validated.tsv with client_id, path, sentence),
   with A's vocabulary, and A is fine-tuned on it in each of --modes, the same budget each:
       (a) pooled       every clip as one voice (`--speakers pooled`; single-speaker training on a crowd)
       (b) target_only  T's clips alone (`--speakers target_only`)
       (c) conditioned  every clip under its speaker's embedding, T exported (`--speakers conditioned`)
       (d) crowd_then_target  conditioned for --schedule_split of the budget, then target_only from the T
                        voice it exported for the rest (the crowd first for the text, the target last)
   Each run says how many times it saw each of T's clips (T's epochs: the clips it drew of T over T's clips).
4. Each run's best_model and final_model, loaded by stock transformers (VitsModel.from_pretrained, no
   speaker id), are scored on the test set: MCD-DTW and the median length ratio (its length over the
   recording's; 1.0 is T's tempo, A speaks T's sentences at about 1/1.3 = 0.77), and, when the judges'
   extra is installed, the speaker judge's similarity to T's test recordings (finetune/reporting/judges.py).
5. Transcripts that do not match their audio: in a copy of the prepared crowd, the texts of --swapped
   training clips are rotated among themselves; check_transcripts.py, with the conditioned run's model,
   aligns every clip and flags outliers. Reported: how many swapped clips it flags, and how many others.
"""

from __future__ import annotations

import argparse
import csv
import json
import shlex
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

from bench.bench_finetune import prepare, pretrain_voice_a, run, score, train
from bench.machine import describe

REPO = Path(__file__).resolve().parent.parent

# name -> (how many times longer than voice A, SNR of added white noise in dB or None); T is the target.
SPEAKERS = {"T": (1.30, None), "F": (0.80, None), "N": (0.90, 25.0), "A": (1.00, 15.0)}
MODES = ("pooled", "target_only", "conditioned", "crowd_then_target")


def assign_speakers(ids: list[str], target_share: float, test_clips: int, seed: int) -> tuple[dict, list[str]]:
    """id -> speaker for the crowd, and the ids of the test set (T's, kept out). The others share what is
    left: F 40%, N 30%, A 30%."""
    order = list(np.random.default_rng(seed).permutation(sorted(ids)))
    test, crowd = order[:test_clips], order[test_clips:]
    n_target = max(2, round(target_share * len(crowd)))
    rest = crowd[n_target:]
    cut_f, cut_n = round(0.4 * len(rest)), round(0.7 * len(rest))
    speaker = {i: "T" for i in crowd[:n_target]}
    speaker.update({i: "F" for i in rest[:cut_f]})
    speaker.update({i: "N" for i in rest[cut_f:cut_n]})
    speaker.update({i: "A" for i in rest[cut_n:]})
    return speaker, sorted(test)


def speak_as(audio: np.ndarray, rate: int, name: str, seed: int) -> np.ndarray:
    """Voice A's recording as speaker `name`: resampled to play `stretch` times longer, then noise."""
    import librosa

    stretch, snr_db = SPEAKERS[name]
    out = (
        audio
        if stretch == 1.0
        else librosa.resample(audio, orig_sr=rate, target_sr=round(rate * stretch), res_type="soxr_hq")
    )
    if snr_db is not None:
        power = float(np.mean(out**2)) or 1e-8
        noise = np.random.default_rng(seed).standard_normal(len(out)).astype(np.float32)
        out = out + noise * np.sqrt(power / 10 ** (snr_db / 10))
    return np.clip(out, -1.0, 1.0).astype(np.float32)


def make_crowd(data_a: Path, out: Path, target_share: float, test_clips: int, seed: int) -> dict:
    """The crowd as a Common Voice style folder (validated.tsv, clips/) and T's test set as an LJSpeech
    folder, both from the prepared demo corpus. Returns clips per speaker."""
    import soundfile as sf

    from finetune.data.metadata import read_metadata

    rows = [r for name in ("metadata.csv", "metadata_val.csv") for r in read_metadata(data_a / name)]
    text = dict(rows)
    speaker, test = assign_speakers(list(text), target_share, test_clips, seed)
    for folder in (out / "crowd" / "clips", out / "test" / "wavs"):
        folder.mkdir(parents=True)
    with open(out / "crowd" / "validated.tsv", "w", newline="", encoding="utf-8") as tsv:
        writer = csv.writer(tsv, delimiter="\t")
        writer.writerow(["client_id", "path", "sentence"])
        for number, item in enumerate(sorted(speaker)):
            audio, rate = sf.read(data_a / "wavs" / f"{item}.wav", dtype="float32")
            sf.write(
                out / "crowd" / "clips" / f"{item}.wav",
                speak_as(audio, rate, speaker[item], seed + number),
                rate,
                subtype="PCM_16",
            )
            writer.writerow([speaker[item], f"{item}.wav", text[item]])
    for item in test:
        audio, rate = sf.read(data_a / "wavs" / f"{item}.wav", dtype="float32")
        sf.write(out / "test" / "wavs" / f"{item}.wav", speak_as(audio, rate, "T", seed), rate, subtype="PCM_16")
    (out / "test" / "metadata.csv").write_text("".join(f"{i}|{text[i]}\n" for i in test), encoding="utf-8")
    return {name: sum(1 for s in speaker.values() if s == name) for name in SPEAKERS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--base_model",
        default=None,
        help="the pretrained voice A, a folder (default: pretrain one on the demo corpus, --pretrain_hours)",
    )
    parser.add_argument("--pretrain_hours", type=float, default=0.1)
    parser.add_argument("--pretrain_lr", type=float, default=2e-3)
    parser.add_argument("--finetune_hours", type=float, default=0.1, help="each of the three fine-tunes' budget")
    parser.add_argument("--finetune_lr", type=float, default=5e-4)
    parser.add_argument("--target_share", type=float, default=0.15, help="the target's share of the crowd's clips")
    parser.add_argument("--test_clips", type=int, default=24, help="T's sentences kept out of the crowd, to score on")
    parser.add_argument(
        "--modes",
        nargs="+",
        choices=MODES,
        help=f"default: {' '.join(MODES[:3])}; with --smoke: pooled conditioned (this script runs the three alike, "
        "and target_only, a pretrained voice's default, runs end to end in tests/test_journey.py)",
    )
    parser.add_argument(
        "--schedule_split", type=float, default=0.5, help="crowd_then_target: the crowd's share of the budget"
    )
    parser.add_argument("--swapped", type=int, default=8, help="clips whose texts are rotated for the transcript check")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--train_flags",
        default="",
        help='more train_vits.py flags for every fine-tune, one string (e.g. --train_flags="--target_share 0.9")',
    )
    parser.add_argument("--work_dir", default=None, help="keep everything here (default: a temporary folder)")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="the whole pipeline on 32 clips from an untrained voice, one epoch each (figures mean nothing)",
    )
    args = parser.parse_args()
    print(f"machine: {describe()}", flush=True)
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="bench_speakers_"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"work folder: {work}", flush=True)
    if args.smoke:  # an untrained tiny voice A, one epoch of each fine-tune, the scoring
        args.smoke_samples, args.max_epochs, args.test_clips, args.target_share, args.swapped = 32, 1, 3, 0.25, 4
        args.base_model, args.finetune_hours = "scratch:tiny", 0.1  # room for start-up; the epoch cap ends each run
        args.modes = args.modes or ["pooled", "conditioned"]
    args.modes = args.modes or list(MODES[:3])
    samples = getattr(args, "smoke_samples", 0)
    if args.base_model:
        voice_a = Path(args.base_model) if Path(args.base_model).is_dir() else args.base_model
        shutil.rmtree(work / "data_a", ignore_errors=True)
        prepare(REPO / "demo" / "corpus", work / "data_a", str(voice_a), samples)
    else:
        args.reuse = False
        voice_a = pretrain_voice_a(args, work)
    for folder in ("crowd", "test", "data", "data_test"):
        shutil.rmtree(work / folder, ignore_errors=True)
    clips = make_crowd(work / "data_a", work, args.target_share, args.test_clips, args.seed)
    print(f"crowd: {clips} clips (T is the target); test set: {args.test_clips} clips of T", flush=True)
    prepare_crowd(work, voice_a, samples)
    rows = {"voice A (before)": voice_a} if isinstance(voice_a, Path) else {}
    epochs_of = {}
    for mode in args.modes:
        run_dir = work / mode
        shutil.rmtree(run_dir, ignore_errors=True)
        seconds, steps, epochs = fine_tune(args, work, run_dir, mode, voice_a, samples)
        print(f"({mode}) {steps} steps in {seconds:.0f}s; T's clips seen {epochs:.1f} times each", flush=True)
        best = run_dir / "checkpoints" / "best_model"
        if not samples:  # the smoke scores final_model alone (a copy of best_model, by the same code)
            rows[f"({mode}) best_model"] = best if (best / "config.json").is_file() else None
        rows[f"({mode}) final_model"] = run_dir / "final_model"
        epochs_of[mode] = epochs
    print(f"\nscored on {args.test_clips} clips of T never trained on; stock VitsModel, no speaker id")
    judge = speaker_judge(work / "data_test")
    print("| model | MCD vs T (dB) | length vs T | duration error | speaker similarity to T |")
    print("| --- | ---: | ---: | ---: | ---: |")
    results = {}
    for label, folder in rows.items():
        if folder is None:
            print(f"| {label} | (no model passed the timing rule) | | | |")
            continue
        results[label] = figures = score(folder, work / "data_test", "metadata.csv")
        figures["speaker_similarity"] = similarity(judge, folder, work / "data_test") if judge else None
        secs = f"{figures['speaker_similarity']:.3f}" if judge else "(judges not installed)"
        print(
            f"| {label} | {figures['mcd_db']:.2f} | {figures['stock_length_ratio']:.2f} | "
            f"{figures['duration_error']:.2f} | {secs} |",
            flush=True,
        )
    mismatches = (
        check_mismatches(work, work / "conditioned" / "final_model", args.swapped, args.seed)
        if "conditioned" in args.modes and args.swapped > 0
        else None
    )
    (work / "results.json").write_text(
        json.dumps({"clips": clips, "target_epochs": epochs_of, "scores": results, "mismatches": mismatches}, indent=2)
    )


def fine_tune(args, work: Path, run_dir: Path, mode: str, voice_a, samples: int) -> tuple[float, int, float]:
    """One mode's fine-tune of voice A on the crowd: (seconds, steps, T's epochs). crowd_then_target is two runs:
    conditioned for --schedule_split of the budget, then target_only from the T voice it exported."""
    if mode == "crowd_then_target":
        first = run_dir / "crowd"
        hours = args.finetune_hours * args.schedule_split
        a = one_run(args, work, first, "conditioned", str(voice_a), hours, samples)
        b = one_run(
            args, work, run_dir, "target_only", str(first / "final_model"), args.finetune_hours - hours, samples
        )
        return a[0] + b[0], a[1] + b[1], a[2] + b[2]
    return one_run(args, work, run_dir, mode, str(voice_a), args.finetune_hours, samples)


def one_run(args, work: Path, run_dir: Path, mode: str, start: str, hours: float, samples: int) -> tuple:
    extra = ["--target_speaker", "T", "--speakers", mode, "--val_samples", "16", "--device", "cpu"]
    extra += shlex.split(args.train_flags)
    if samples:
        extra += [
            "--max_epochs",
            str(args.max_epochs),
            "--val_samples",
            "2",
            "--discriminator_warmup_steps",
            "1",
            "--discriminator_warmup_margin",
            "1e9",
            "--report_to",
            "none",
            "--benchmark_samples",
            "8",
        ]
        if mode == "conditioned":  # an epoch of a few steps: at the default 0.9, the target's clips 9 times
            extra += ["--target_share", "0.5"]
    run_dir.parent.mkdir(parents=True, exist_ok=True)  # crowd_then_target's first run logs beside its second's
    seconds = train(work / "data", run_dir, start, hours, args.finetune_lr, extra=extra)
    records = [json.loads(line) for line in (run_dir / "checkpoints" / "metrics.jsonl").read_text().splitlines()]
    end = next(r for r in reversed(records) if r.get("kind") == "end")
    return seconds, end["steps"], target_epochs(run_dir, work / "data", end["samples_seen"])


def target_epochs(run_dir: Path, data: Path, samples_seen: int) -> float:
    """How many times the run drew each of T's training clips: its draws of T (all of them for target_only; the
    share train.log names for a conditioned run, whose T clips are repeated to --target_share of the draws, or
    T's natural share when it says they are drawn once) over T's clips."""
    import re

    from finetune.data.metadata import read_rows

    rows = read_rows(data / "metadata.csv")
    mine = sum(1 for _, who, _ in rows if who == "T")
    log = (run_dir / "checkpoints" / "train.log").read_text(encoding="utf-8")
    drawn = re.search(r"drawn \d+ times an epoch: (\d+)% of the draws", log)
    if "--speakers target_only" in log:
        share = 1.0
    elif drawn:
        share = int(drawn.group(1)) / 100
    else:
        share = mine / max(1, len(rows))
    return samples_seen * share / max(1, mine)


def speaker_judge(test_data: Path):
    """The speaker judge with T's test recordings as the voice (None when the judges' extra is not installed)."""
    import soundfile as sf

    from finetune.reporting import judges

    if not judges.available("speaker"):
        print(f"speaker similarity not measured: {judges.INSTALL_HINT}", flush=True)
        return None
    judge = judges.SpeakerJudge()
    items = [line.split("|", 1)[0] for line in (test_data / "metadata.csv").read_text().splitlines() if line]
    judge.set_voice({item: sf.read(test_data / "wavs" / f"{item}.wav", dtype="float32") for item in items})
    return judge


def similarity(judge, model_dir: Path, test_data: Path) -> float:
    """Mean similarity of the model's speech (stock transformers, one seeded request a sentence) to T's recordings
    of the other test sentences."""
    import torch
    from transformers import VitsModel, VitsTokenizer

    model = VitsModel.from_pretrained(str(model_dir)).eval()
    tokenizer = VitsTokenizer.from_pretrained(str(model_dir))
    scores = []
    for index, line in enumerate(l for l in (test_data / "metadata.csv").read_text().splitlines() if l):
        item, text = line.split("|", 1)
        torch.manual_seed(index)
        with torch.no_grad():
            out = model(**tokenizer(text, return_tensors="pt"))
        wave = out.waveform[0, : int(out.sequence_lengths[0])].numpy()
        scores.append(judge.score(wave, int(model.config.sampling_rate), item_id=item))
    return float(np.mean(scores))


def check_mismatches(work: Path, model: Path, count: int, seed: int) -> dict:
    """Rotate the texts of `count` training clips in a copy of the crowd (the audio untouched), run
    check_transcripts.py on the copy, and count what it flags."""
    from finetune.data.metadata import read_rows
    from finetune.reporting.transcripts import read_report

    copy = work / "data_swapped"
    shutil.rmtree(copy, ignore_errors=True)
    copy.mkdir()
    (copy / "wavs").symlink_to((work / "data" / "wavs").resolve())
    shutil.copy(work / "data" / "metadata_val.csv", copy / "metadata_val.csv")
    rows = read_rows(work / "data" / "metadata.csv")
    chosen = sorted(np.random.default_rng(seed).choice(len(rows), size=min(count, len(rows)), replace=False))
    texts = [rows[i][2] for i in chosen]
    for position, index in enumerate(chosen):  # each chosen clip gets the next one's text
        item_id, speaker, _ = rows[index]
        rows[index] = (item_id, speaker, texts[(position + 1) % len(texts)])
    (copy / "metadata.csv").write_text("".join(f"{i}|{s}|{t}\n" for i, s, t in rows), encoding="utf-8")
    run(
        [
            sys.executable,
            str(REPO / "check_transcripts.py"),
            "--model",
            str(model),
            "--data_dir",
            str(copy),
            "--device",
            "cpu",
        ],
        "checking transcripts",
        work / "check_transcripts.log",
    )
    report = read_report(copy)
    swapped = {rows[i][0] for i in chosen}
    flagged = {r["id"] for r in report if r["flagged"] == "1"}
    result = {
        "swapped": len(swapped),
        "swapped_flagged": len(swapped & flagged),
        "others": len(report) - len(swapped),
        "others_flagged": len(flagged - swapped),
        "swapped_median_z": float(np.median([float(r["z"]) for r in report if r["id"] in swapped])),
    }
    print(
        f"\ntranscripts: {result['swapped_flagged']} of {result['swapped']} swapped clips flagged (median z "
        f"{result['swapped_median_z']:.1f}); {result['others_flagged']} of {result['others']} other clips flagged",
        flush=True,
    )
    return result


def prepare_crowd(work: Path, voice_a: Path, samples: int) -> None:
    """The crowd as a user prepares Common Voice (`--dataset validated.tsv`, speakers found by client_id,
    10% of each speaker held out), and the test set with the same vocabulary."""
    run(
        [
            sys.executable,
            str(REPO / "prepare_data.py"),
            "--dataset",
            str(work / "crowd" / "validated.tsv"),
            "--data_dir",
            str(work / "data"),
            "--model_name",
            str(voice_a),
            "--val_fraction",
            "0.1",
            "--num_workers",
            "1" if samples else "2",
        ],
        "preparing the crowd",
        work / "data.log",
    )
    prepare(work / "test", work / "data_test", str(voice_a), 0, val_fraction=0.0)


if __name__ == "__main__":
    main()
