#!/usr/bin/env python3
"""Does a default round of corrections fix what the voice learnt wrong from its own recordings, on sentences no
round saw, and only that? A voice that learnt its mistakes (bench/learnt_voice.py), corrections recorded by other
people, rounds with exactly the flags a user runs, judged independently of the round.

    .venv/bin/python bench/bench_corrections.py --work_dir W            # three cases, about 2 h 15 min on 2 CPU cores
    .venv/bin/python bench/bench_corrections.py --work_dir W --mistakes z:s --round_flags "--acoustics embeddings"
    .venv/bin/python bench/bench_corrections.py --smoke                 # the pipeline with tiny budgets, no espeak-ng

1. The voice: a tiny voice pretrained on the demo corpus (--pretrain_hours; five readers who say every letter right),
   then fine-tuned (--voice_hours) on one reader's recordings of demo/sentences.txt that say every MISTAKE wrong
   while the transcripts keep them right (x said as k, ş as s, the word "min" as "man": --mistakes). Made once in
   W and reused.
2. For each mistake, a case: corrections of sentences with it (other readers, said right) in a copy of the voice's
   run folder, and one round: train_feedback.py with the user's flags (the paths; --round_flags adds others).
3. The judge, never seen by any run or round: stock transformers (one request a sentence, --judge_seeds seeds) on
   the case's unseen sentences, against the voice's own reader saying each right and with the mistake, nothing
   else changed (where espeak-ng's reading of the mistaken text changes more than the letter, as "xwe" -> "kwe"
   with another vowel, the right reading's phonemes with the letter's swapped: learnt_voice.mistaken_reading):
       mistake frames   where the reader's two readings differ (the_mistake), the voice's frames DTW pairs with
                        them: MCD to the right reading, and to the mistaken one. Fixed "half way" when nearer
                        the right reading than the mistaken one, beyond the paired noise
       the rest         the other frames of those sentences, against the right reading
   and the judge's other sentences (none holds a mistake, none is the round's): whole-sentence MCD to the reader.
   The rest and the other sentences must stay within their noise: non-inferiority, the margin being a clip's own
   noise between two seeds of the voice before the round.

4. On the round's own held-out corrections, three measures the round could decide by, before and after, each with
   its paired bound (bench/deciding_measures.py): which of them sees what the judge heard.

Printed: each round's decision and what decided it, the measures of its held-out corrections, each case's judge
table, one summary line a case. W/results.json holds it all.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

from bench import deciding_measures, learnt_voice
from bench.launcher import run_script
from bench.machine import describe
from finetune.feedback.focus import Focus

REPO = Path(__file__).resolve().parent.parent
DEMO_RECIPE = ["--discriminator_width", "0.0625", "--learning_rate", "2e-3", "--gradient_accumulation_steps", "1"]


def run(script: str, argv: list, log: Path, label: str) -> None:
    code = run_script(REPO / script, [str(a) for a in argv], log)
    if code != 0:
        raise SystemExit(f"{label} failed (exit {code}); see {log}")


# ---------------------------------------------------------------- the voice


def prepare(source: Path, data: Path, log: Path, held_out: list[str] = ()) -> Path:
    """An LJSpeech folder prepared at 16 kHz; `held_out` ids moved to metadata_val.csv (the voice's held-out clips:
    the round's gate), none drawn at random."""
    if not (data / "metadata.csv").is_file():
        argv = ["--input_dir", source, "--data_dir", data, "--model_name", "scratch:tiny", "--val_fraction", "0"]
        run("prepare_data.py", [*argv, "--num_workers", "1"], log, f"preparing {source.name}")
        if held_out:
            lines = (data / "metadata.csv").read_text(encoding="utf-8").splitlines()
            keep = [line for line in lines if line.split("|", 1)[0] not in set(held_out)]
            val = [line for line in lines if line.split("|", 1)[0] in set(held_out)]
            (data / "metadata.csv").write_text("".join(f"{line}\n" for line in keep), encoding="utf-8")
            (data / "metadata_val.csv").write_text("".join(f"{line}\n" for line in val), encoding="utf-8")
    return data


def train(data: Path, run_dir: Path, start: str, hours: float, smoke: bool, log: Path) -> Path:
    """train_vits.py with the demo's recipe into `run_dir` (reused when that run finished: a killed one restarts)."""
    if (run_dir / "final_model" / "config.json").is_file():
        print(f"reusing {run_dir}", flush=True)
        return run_dir
    shutil.rmtree(run_dir, ignore_errors=True)
    quick = ["--max_epochs", "1", "--val_samples", "2", "--benchmark_samples", "4"] if smoke else []
    run(
        "train_vits.py",
        [
            "--data_dir",
            data,
            "--checkpoint_dir",
            run_dir / "checkpoints",
            "--output_dir",
            run_dir / "final_model",
            "--model_name",
            start,
            "--target_hours",
            hours,
            *DEMO_RECIPE,
            "--log_every_seconds",
            "60",
            *quick,
        ],
        log,
        f"training {run_dir.name}",
    )
    return run_dir


def make_voice(args, work: Path, mistakes: list, roles, sentences: list[str]) -> tuple[Path, Path, dict]:
    """The recordings, the pretrained start, the voice fine-tuned on the mistaken recordings: (its run folder,
    its prepared corpus, the recordings' folders)."""
    folders = learnt_voice.make_sources(work / "recordings", mistakes, roles, sentences, espeak=not args.smoke)
    held = [f"s{i + 1:03d}" for i in roles.voice_held_out]
    if args.smoke:  # the voice from new weights: the pretraining is the same train() as the voice's (10 s saved)
        start = "scratch:tiny"
    else:
        demo = prepare(REPO / "demo" / "corpus", work / "demo_data", work / "prepare_demo.log", ())
        pretrained = train(demo, work / "pretrained", "scratch:tiny", args.pretrain_hours, False, work / "pretrain.log")
        start = str(pretrained / "final_model")
    data = prepare(folders["user_corpus"], work / "user_data", work / "prepare_user.log", held)
    for reading in ("right", "mistaken"):  # the judge's readings at the voice's rate, with their lists
        prepared = prepare(folders[f"judge_{reading}"], work / f"judge_{reading}", work / f"prepare_{reading}.log")
        for listing in folders[f"judge_{reading}"].glob("*.csv"):
            if listing.name != "metadata.csv":
                shutil.copy(listing, prepared / listing.name)
        folders[f"judge_{reading}"] = prepared
    voice = train(data, work / "voice", start, args.voice_hours, args.smoke, work / "voice.log")
    return voice, data, folders


# ---------------------------------------------------------------- a round


def feedback_round(voice: Path, data: Path, corrections: Path, case: Path, smoke: bool, flags: list[str]) -> dict:
    """A copy of the voice's run folder (the round replaces its final_model when it accepts), one round with the
    user's flags, its report; `candidate_dir` is the round's model, accepted or not."""
    run_dir = case / "run"
    shutil.rmtree(run_dir, ignore_errors=True)
    shutil.copytree(voice, run_dir, ignore=shutil.ignore_patterns("checkpoint_*.pt", "samples", "report*"))
    args = json.loads((run_dir / "checkpoints" / "training_args.json").read_text(encoding="utf-8"))
    args["output_dir"] = str(run_dir / "final_model")  # the app's folder, in the copy
    (run_dir / "checkpoints" / "training_args.json").write_text(json.dumps(args), encoding="utf-8")
    voices = case / "voices"
    shutil.rmtree(voices, ignore_errors=True)
    quick = ["--target_minutes", "1", "--max_epochs", "1", "--val_samples", "2", "--benchmark_samples", "4"]
    run(
        "train_feedback.py",
        [
            "--base_model",
            run_dir / "checkpoints" / "best_model",
            "--data_dir",
            data,
            "--feedback_dir",
            corrections,
            "--output_dir",
            voices,
            *(quick if smoke else []),
            *flags,
        ],
        case / "round.log",
        "the feedback round",
    )
    return round_report(case)


def round_report(case: Path) -> dict:
    """A case's round report, with `candidate_dir` (the round's model, accepted or not: its best evaluation
    after the start, else its last) and `app_dir` (the copy's final_model, which an accepted round replaced)."""
    round_dir = case / "voices" / "rounds" / "round_001"
    report = json.loads((round_dir / "feedback_report.json").read_text(encoding="utf-8"))
    best = round_dir / "checkpoints" / "best_model"
    trained = (best / "eval.json").is_file() and json.loads((best / "eval.json").read_text())["step"] > 0
    report["candidate_dir"] = str(best if trained else round_dir / "checkpoints" / "last_model")
    report["app_dir"] = str(case / "run" / "final_model")
    return report


# ---------------------------------------------------------------- the judge


def judge(model_dir: Path, readings: dict[str, Path], listing: str, seeds: int) -> dict:
    """Stock transformers, one request a sentence and seed, each clip against the reader's readings (`right`, and
    `mistaken` when given): the MCD on the mistake's frames to each reading, on the other frames to the right one,
    the whole sentence to the right one; each a mean over seeds, and per seed (the noise). The mistake's frames are
    where the two readings differ (the_mistake): the voice's frames the DTW path pairs with them."""
    import torch
    from transformers import VitsModel, VitsTokenizer

    from finetune.data.corpus import load_examples
    from finetune.data.features import FeatureConfig, Features
    from finetune.reporting.measures import mel_cepstrum

    model, tokenizer = VitsModel.from_pretrained(str(model_dir)).eval(), VitsTokenizer.from_pretrained(str(model_dir))
    features = Features(FeatureConfig())
    names = ("mistake_right", "mistake_mistaken", "rest", "sentence")
    by_seed = {name: [dict() for _ in range(seeds)] for name in names}
    recordings = {
        reading: {e.item_id: e for e in load_examples(folder, listing, tokenizer, 256, 16000)[0]}
        for reading, folder in readings.items()
    }
    for index, (item, right) in enumerate(recordings["right"].items()):
        cepstra = {reading: mel_cepstrum(mel_of(features, found[item])) for reading, found in recordings.items()}
        mistake = the_mistake(cepstra["right"], cepstra["mistaken"]) if "mistaken" in cepstra else None
        ids = torch.from_numpy(right.token_ids.astype(np.int64)).unsqueeze(0)
        for seed in range(seeds):
            torch.manual_seed(10_000 * seed + index)
            with torch.no_grad():
                out = model(input_ids=ids)
            voice = mel_cepstrum(features.mel(out.waveform[:, : int(out.sequence_lengths[0])])[0].numpy())
            for name, value in scores(voice, cepstra, mistake).items():
                by_seed[name][seed][item] = value
    found = {
        name: {item: float(np.mean([s[item] for s in by_seed[name] if item in s])) for item in by_seed[name][0]}
        for name in names
    }
    return {"mean": found, "by_seed": by_seed}


def the_mistake(right: np.ndarray, mistaken: np.ndarray) -> tuple[np.ndarray, dict] | None:
    """Where two readings of one sentence by one reader differ: the right reading's frames whose DTW partners in the
    mistaken one are further than the sentence's median by twice their spread ([frames] bool), and each right frame's
    partner in the mistaken reading. None where they do not differ."""
    import librosa

    from finetune.reporting.measures import MCD_SCALE

    _, path = librosa.sequence.dtw(X=right, Y=mistaken, metric="euclidean")
    distance = MCD_SCALE * np.linalg.norm(right[:, path[:, 0]] - mistaken[:, path[:, 1]], axis=0)
    per_frame, pairs = np.zeros(right.shape[1]), np.zeros(right.shape[1])
    np.add.at(per_frame, path[:, 0], distance)
    np.add.at(pairs, path[:, 0], 1.0)
    per_frame /= np.maximum(pairs, 1.0)
    differ = per_frame > np.median(per_frame) + 2 * per_frame.std()
    partner = {}
    for a, b in path[::-1]:
        partner.setdefault(int(a), int(b))
    return (differ, partner) if differ.any() else None


def scores(voice: np.ndarray, cepstra: dict, mistake) -> dict:
    """The voice's distances (dB) to the readings: the whole sentence to the right one, and, where the readings
    differ, on the voice's frames DTW pairs with the mistake (to the right reading, and to the mistaken one at the
    same place) and on the others (to the right reading)."""
    import librosa

    from finetune.reporting.measures import MCD_SCALE, cepstral_distance

    right = cepstra["right"]
    found = {"sentence": cepstral_distance(voice, right)}
    if mistake is None:
        return found
    differ, partner = mistake
    _, path = librosa.sequence.dtw(X=voice, Y=right, metric="euclidean")
    on = differ[path[:, 1]]
    if not on.any() or on.all():
        return found
    mistaken = cepstra["mistaken"][:, [partner[int(b)] for b in path[on, 1]]]
    to = lambda a, b: float(MCD_SCALE * np.linalg.norm(a - b, axis=0).mean())  # noqa: E731
    found["mistake_right"] = to(voice[:, path[on, 0]], right[:, path[on, 1]])
    found["mistake_mistaken"] = to(voice[:, path[on, 0]], mistaken)
    found["rest"] = to(voice[:, path[~on, 0]], right[:, path[~on, 1]])
    return found


def mel_of(features, example) -> np.ndarray:
    import torch

    return features.mel(torch.from_numpy(example.audio / 32768.0).float().unsqueeze(0))[0].numpy()


def paired(before: dict, after: dict) -> dict:
    """after - before over the clips both scored (negative: nearer), its one-sided 95% t bound, and whether it is
    an improvement or a worsening beyond it."""
    from finetune.training.selection import paired as paired_comparison

    better, worse = paired_comparison(before, after), paired_comparison(after, before)
    shared = [k for k in after if k in before]
    return {
        "before": float(np.mean([before[k] for k in shared])) if shared else math.nan,
        "after": float(np.mean([after[k] for k in shared])) if shared else math.nan,
        "change_db": -better.advantage_db,
        "noise_bound_db": better.bound_db,
        "clips": better.clips,
        "improved_beyond_noise": better.beyond_noise,
        "worse_beyond_noise": worse.beyond_noise,
    }


def nearer_right(judged: dict) -> dict:
    """Whether the voice is nearer the right reading than the mistaken one on the mistake's frames, beyond the
    noise: the clips' (to right - to mistaken), its mean and one-sided 95% bound; "half way" when below zero."""
    from finetune.training.selection import paired as paired_comparison

    right, mistaken = judged["mean"]["mistake_right"], judged["mean"]["mistake_mistaken"]
    comparison = paired_comparison(mistaken, right)  # how much lower (nearer) the right reading is
    return {
        "right_minus_mistaken_db": -comparison.advantage_db,
        "noise_bound_db": comparison.bound_db,
        "clips": comparison.clips,
        "half_way": comparison.beyond_noise,
    }


def non_inferior(before: dict, after: dict, noise_db: float) -> dict:
    """after - before against `noise_db` (non-inferiority, finetune/feedback/decision.py)."""
    from finetune.feedback.decision import non_inferiority

    test = non_inferiority(before["mean"], after["mean"], noise_db)
    return {
        "change_db": test.change,
        "upper_db": test.upper,
        "margin_db": noise_db,
        "clips": test.clips,
        "holds": test.holds,
    }


def retest_noise(judged: dict, name: str) -> float:
    """A clip's own noise in `name` between two seeds of the same model (the round's own rule, round_evaluator.py)."""
    from finetune.feedback.round_evaluator import retest_noise as between_draws

    seeds = judged["by_seed"][name]
    return between_draws(seeds[0], seeds[1]) if len(seeds) > 1 else math.nan


def judge_case(before_dir: Path, after_dir: Path, folders: dict, mistake, seeds: int) -> dict:
    from bench.learnt_voice import safe

    readings = {"right": folders["judge_right"], "mistaken": folders["judge_mistaken"]}
    listing = f"with_{safe(mistake.name)}.csv"
    unseen = {
        "before": judge(before_dir, readings, listing, seeds),
        "after": judge(after_dir, readings, listing, seeds),
    }
    other = {
        "before": judge(before_dir, {"right": folders["judge_right"]}, "other.csv", seeds),
        "after": judge(after_dir, {"right": folders["judge_right"]}, "other.csv", seeds),
    }
    part = lambda judged, name: {"mean": judged["mean"][name]}  # noqa: E731
    return {
        "mistake_to_right": paired(unseen["before"]["mean"]["mistake_right"], unseen["after"]["mean"]["mistake_right"]),
        "mistake_to_mistaken": paired(
            unseen["before"]["mean"]["mistake_mistaken"], unseen["after"]["mean"]["mistake_mistaken"]
        ),
        "half_way_before": nearer_right(unseen["before"]),
        "half_way_after": nearer_right(unseen["after"]),
        "rest": non_inferior(
            part(unseen["before"], "rest"), part(unseen["after"], "rest"), retest_noise(unseen["before"], "rest")
        ),
        "other_sentences": non_inferior(
            part(other["before"], "sentence"),
            part(other["after"], "sentence"),
            retest_noise(other["before"], "sentence"),
        ),
    }


# ---------------------------------------------------------------- the bench


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work_dir", default=None, help="keep everything here (a voice made there is reused)")
    parser.add_argument(
        "--mistakes", nargs="+", default=list(learnt_voice.DEFAULT_MISTAKES), help="RIGHT:SAID, each a case"
    )
    parser.add_argument(
        "--pretrain_hours", type=float, default=0.25, help="the start: the demo corpus, from new weights"
    )
    parser.add_argument(
        "--voice_hours", type=float, default=0.5, help="the voice: the start fine-tuned on its recordings"
    )
    parser.add_argument(
        "--only", nargs="*", default=[], help="run only these cases, RIGHT:SAID (the voice still says every --mistakes)"
    )
    parser.add_argument("--corrections", type=int, default=24, help="corrections a case (at most)")
    parser.add_argument(
        "--round_flags",
        default="",
        help='more train_feedback.py flags, one string (--round_flags="--acoustics embeddings")',
    )
    parser.add_argument("--judge_seeds", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="the pipeline with tiny budgets (figures mean nothing)")
    args = parser.parse_args()
    print(f"machine: {describe()}", flush=True)
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="bench_corrections_"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"work folder: {work}", flush=True)
    mistakes = learnt_voice.parse_mistakes(args.mistakes[:1] if args.smoke else args.mistakes)
    sentences = learnt_voice.read_sentences()[: 60 if args.smoke else None]
    roles = learnt_voice.assign_roles(
        sentences,
        mistakes,
        corrections=6 if args.smoke else args.corrections,
        unseen=3 if args.smoke else 20,
        held_out=3 if args.smoke else 16,
        other=3 if args.smoke else 20,
    )
    unknown = [name for name in args.only if name not in {m.name for m in mistakes}]
    if unknown:
        raise SystemExit(f"--only {' '.join(unknown)}: not among --mistakes {' '.join(m.name for m in mistakes)}")
    print(f"sentences: {json.dumps(learnt_voice.counts(roles))}", flush=True)
    voice, data, folders = make_voice(args, work, mistakes, roles, sentences)
    flags = shlex.split(args.round_flags)
    results = {}
    for mistake in [m for m in mistakes if not args.only or m.name in args.only]:
        case = work / f"case_{learnt_voice.safe(mistake.name)}"
        case.mkdir(parents=True, exist_ok=True)
        print(f"\n== {mistake.right!r} said as {mistake.said!r} ({mistake.kind}; {case})", flush=True)
        report = feedback_round(voice, data, folders[f"corrections_{mistake.name}"], case, args.smoke, flags)
        print(
            f"round: {'ACCEPTED' if report['accepted'] else 'REJECTED'} ({report['reason']})\n  decided by "
            f"{report['decided_by']}: {report['improvement']}\n  what it corrects: {report.get('focus')}",
            flush=True,
        )
        before = voice / "checkpoints" / "best_model"
        after = Path(report["app_dir"] if report["accepted"] else report["candidate_dir"])
        judged = judge_case(before, after, folders, mistake, 1 if args.smoke else args.judge_seeds)
        held = deciding_measures.held_corrections(
            folders[f"corrections_{mistake.name}"], case / "voices" / "history.json"
        )
        focus = Focus(letters=(mistake.right,)) if mistake.kind == "letter" else Focus(words=(mistake.right,))
        measures = deciding_measures.compared(before, after, held, focus, max(2, 1 if args.smoke else args.judge_seeds))
        print("what each measure of the round's held-out corrections saw (bench/deciding_measures.py):", flush=True)
        print("\n".join(deciding_measures.lines(measures)), flush=True)
        results[mistake.name] = {
            "round": {
                k: report.get(k)
                for k in (
                    "accepted",
                    "reason",
                    "decided_by",
                    "improvement",
                    "voice_check",
                    "focus",
                    "learning_rate",
                    "steps",
                )
            },
            **judged,
            "held_out_measures": measures,
        }
        print_case(mistake, results[mistake.name])
    print_summary(results)
    (work / f"results{'_' + '_'.join(map(learnt_voice.safe, args.only)) if args.only else ''}.json").write_text(
        json.dumps(results, indent=2, ensure_ascii=False), encoding="utf-8"
    )


def print_case(mistake, result: dict) -> None:
    print("\n| judged on unseen sentences | before | after | after - before | 95% bound | clips |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for key, label in (
        ("mistake_to_right", "mistake's frames to the right reading (dB)"),
        ("mistake_to_mistaken", "mistake's frames to the mistaken reading (dB)"),
    ):
        r = result[key]
        print(
            f"| {label} | {r['before']:.3f} | {r['after']:.3f} | {r['change_db']:+.3f} | {r['noise_bound_db']:.3f} | {r['clips']} |"
        )
    for key in ("half_way_before", "half_way_after"):
        r = result[key]
        print(
            f"| {key.replace('_', ' ')}: to right - to mistaken (dB) | | | {r['right_minus_mistaken_db']:+.3f} | {r['noise_bound_db']:.3f} | {r['clips']} |"
        )
    for key in ("rest", "other_sentences"):
        r = result[key]
        print(
            f"| {key.replace('_', ' ')}: after - before (at most), noise | | | {r['change_db']:+.3f} ({r['upper_db']:+.3f}) | {r['margin_db']:.3f} | {r['clips']} |",
            flush=True,
        )


def print_summary(results: dict) -> None:
    print("\n| case | round | nearer the right reading (half way) | rest of those sentences | other sentences |")
    print("| --- | --- | --- | --- | --- |")
    for case, r in results.items():
        half = r["half_way_after"]
        print(
            f"| {case} | {'accepted' if r['round']['accepted'] else 'rejected'} | "
            f"{'yes' if half['half_way'] else 'no'} ({half['right_minus_mistaken_db']:+.3f} dB, bound {half['noise_bound_db']:.3f}) | "
            f"{'within' if r['rest']['holds'] else 'MOVED'} | {'within' if r['other_sentences']['holds'] else 'MOVED'} |",
            flush=True,
        )


if __name__ == "__main__":
    sys.exit(main())
