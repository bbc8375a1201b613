#!/usr/bin/env python3
"""Does a round of corrections, recorded by other people at their own tempo and timbre, fix what the voice says
wrong on sentences it did not train on, and only that? Planted mispronunciations, each corrected by other readers,
judged independently of the round.

    .venv/bin/python bench/bench_corrections.py --work_dir W          # three cases, about 75 min on 2 CPU cores
    .venv/bin/python bench/bench_corrections.py --work_dir W --cases x:k:stretch1.4   # one case
    .venv/bin/python bench/bench_corrections.py --smoke               # the pipeline with tiny budgets

A case is LETTER:SAID_AS:READERS: the voice says every LETTER as SAID_AS, and READERS record the corrections:
`stretch1.4` (each correction played 1.4 times longer or shorter, alternately: slower and lower, or faster and
higher, as a larger or smaller speaker's), or `espeak` (two espeak-ng voices the corpus does not hold read them:
other people altogether; needs espeak-ng). The default three cases: x:k:stretch1.4, ç:c:espeak, p:b:stretch1.25.
For each case, in W/case_LETTER/:

1. The demo corpus (every clip as one voice) is split by the letter: the clips whose text has none are the
   voice's corpus (a tenth of them held out: the voice's own clips); of those that have it, half are corrections
   and half are unseen sentences for the judge.
2. The voice is pretrained from scratch on its corpus (train_vits.py): it never saw the letter (reused when W
   holds it). Then the mispronunciation is planted: the letter joins its vocabulary with the embedding of
   SAID_AS, so the voice reads every LETTER exactly as SAID_AS.
3. The corrections are recorded by READERS, in the layout train_feedback.py takes.
4. One round: train_feedback.py with its defaults (--round_flags adds to them), --round_minutes, --round_lr.
5. The judge, before and after the round, never seen by the round: stock transformers (one request a sentence,
   --judge_seeds seeds) on the unseen sentences with the letter, against their recordings: the MCD on the frames
   the voice gives the letter's tokens (each mapped to the recording by the DTW path), the whole sentence's
   MCD-DTW and, with the judges' extra, the phonetic judge and the phone error rate; and the voice's own
   held-out clips: MCD, median length and the speaker judge's similarity to the voice's recordings, which must
   not move beyond their noise.

Printed: each round's decision and what decided it, each case's judge table ("after - before" with its paired
noise bound), then one line a case: fixed on unseen sentences (the letter's frames nearer beyond the noise), the
voice's other sentences within their bound, its identity held. W/results.json holds it all.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from bench.launcher import run_script
from bench.machine import describe

REPO = Path(__file__).resolve().parent.parent


def run(script: str, argv: list, log: Path, label: str) -> None:
    code = run_script(REPO / script, [str(a) for a in argv], log)
    if code != 0:
        raise SystemExit(f"{label} failed (exit {code}); see {log}")


# ---------------------------------------------------------------- the corpus, split by the letter


def prepare_all(work: Path, max_samples: int) -> Path:
    """The demo corpus prepared once (16 kHz WAVs, every clip in metadata.csv)."""
    data = work / "prepared"
    if not (data / "metadata.csv").is_file():
        run(
            "prepare_data.py",
            [
                "--input_dir",
                REPO / "demo" / "corpus",
                "--data_dir",
                data,
                "--model_name",
                "scratch:tiny",
                "--val_fraction",
                "0",
                "--num_workers",
                "1",
                "--max_samples",
                max_samples,
            ],
            work / "prepare.log",
            "preparing the demo corpus",
        )
    return data


def split(prepared: Path, work: Path, letter: str, readers: str) -> dict:
    """The voice's corpus (without the letter), the corrections (other readers), the judge's unseen sentences."""
    from finetune.data.metadata import read_rows

    rows = [(item, text) for item, _, text in read_rows(prepared / "metadata.csv")]
    with_letter = [r for r in rows if letter in r[1].lower()]
    without = [r for r in rows if letter not in r[1].lower()]
    held = without[::10]  # the voice's own held-out clips
    voice = work / "voice_data"
    shutil.rmtree(voice, ignore_errors=True)
    (voice / "wavs").mkdir(parents=True)
    for item, _ in without:
        (voice / "wavs" / f"{item}.wav").symlink_to(prepared / "wavs" / f"{item}.wav")
    write_rows(voice / "metadata.csv", [r for r in without if r not in held])
    write_rows(voice / "metadata_val.csv", held)
    corrections, unseen = with_letter[0::2], with_letter[1::2]
    record_corrections(prepared, corrections, work / "corrections", readers)
    judge = work / "judge_data"
    shutil.rmtree(judge, ignore_errors=True)
    (judge / "wavs").mkdir(parents=True)
    for item, _ in unseen + held:
        (judge / "wavs" / f"{item}.wav").symlink_to(prepared / "wavs" / f"{item}.wav")
    write_rows(judge / "with_letter.csv", unseen)
    write_rows(judge / "voice_held_out.csv", held)
    return {
        "voice": voice,
        "corrections": work / "corrections",
        "judge": judge,
        "counts": {
            "voice_train": len(without) - len(held),
            "voice_held_out": len(held),
            "corrections": len(corrections),
            "unseen_with_letter": len(unseen),
        },
    }


def write_rows(path: Path, rows: list[tuple[str, str]]) -> None:
    path.write_text("".join(f"{item}|{text}\n" for item, text in rows), encoding="utf-8")


# espeak-ng voices the demo corpus does not hold (demo/make_corpus.py's five are ku, ku+m3, ku+f2, ku+klatt and
# ku+f4): (voice, words a minute, pitch 0-99), one slower and lower, one faster and higher than the corpus's.
OTHER_READERS = (("ku+m1", 125, 20), ("ku+f3", 190, 80))


def record_corrections(prepared: Path, rows: list[tuple[str, str]], folder: Path, readers: str) -> None:
    """The corrections as other people record them, as wavs/ + metadata.csv: `stretchS`, each recording played
    S times longer or shorter, alternately (resampled: formants and pitch move with the tempo, as a larger or
    smaller speaker's would); `espeak`, each sentence read by one of OTHER_READERS, alternately."""
    import soundfile as sf
    import soxr

    shutil.rmtree(folder, ignore_errors=True)
    (folder / "wavs").mkdir(parents=True)
    for index, (item, text) in enumerate(rows):
        path = folder / "wavs" / f"{item}.wav"
        if readers == "espeak":
            voice, speed_wpm, pitch = OTHER_READERS[index % len(OTHER_READERS)]
            espeak = ["espeak-ng", "-v", voice, "-s", str(speed_wpm), "-p", str(pitch), "-w", str(path), text]
            try:
                subprocess.run(espeak, check=True, capture_output=True)
            except FileNotFoundError as error:
                raise SystemExit("the espeak readers need espeak-ng (apt-get install espeak-ng)") from error
            continue
        stretch = float(readers.removeprefix("stretch"))
        audio, rate = sf.read(prepared / "wavs" / f"{item}.wav", dtype="float32")
        times = stretch if index % 2 == 0 else 1 / stretch
        sf.write(path, soxr.resample(audio, rate, rate * times), rate, subtype="PCM_16")
    write_rows(folder / "metadata.csv", rows)


# ---------------------------------------------------------------- the voice, and the planted mispronunciation


def pretrain(data: Path, work: Path, hours: float, smoke: bool) -> Path:
    run_dir = work / "voice"
    best = run_dir / "checkpoints" / "best_model"
    if (best / "config.json").is_file():
        print(f"reusing the voice in {run_dir}", flush=True)
        return best
    shutil.rmtree(run_dir, ignore_errors=True)
    extra = (
        ["--max_epochs", "1", "--val_samples", "2", "--benchmark_samples", "4", "--discriminator_warmup_steps", "0"]
        if smoke
        else []
    )
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
            "scratch:tiny",
            "--target_hours",
            hours,
            "--discriminator_width",
            "0.0625",
            "--learning_rate",
            "2e-3",
            "--gradient_accumulation_steps",
            "1",
            "--log_every_seconds",
            "60",
            *extra,
        ],
        run_dir.with_suffix(".log"),
        "pretraining the voice",
    )
    return best if (best / "config.json").is_file() else run_dir / "final_model"


def plant(voice: Path, out: Path, letter: str, spoken_as: str) -> Path:
    """A copy of the voice whose vocabulary gains `letter`, embedded exactly as `spoken_as`: it says one
    as the other. Its discriminator comes along (the round continues from both)."""
    import torch
    from transformers import VitsModel

    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(voice, out)
    vocab = json.loads((out / "vocab.json").read_text(encoding="utf-8"))
    if letter in vocab or spoken_as not in vocab:
        raise SystemExit(f"the voice's vocabulary must lack {letter!r} and have {spoken_as!r}: {sorted(vocab)}")
    model = VitsModel.from_pretrained(str(voice))
    old = model.text_encoder.embed_tokens
    new = torch.nn.Embedding(old.num_embeddings + 1, old.embedding_dim)
    with torch.no_grad():
        new.weight[: old.num_embeddings] = old.weight
        new.weight[old.num_embeddings] = old.weight[vocab[spoken_as]]
    model.text_encoder.embed_tokens = new
    model.config.vocab_size = old.num_embeddings + 1
    vocab[letter] = old.num_embeddings
    model.save_pretrained(str(out))
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    return out


# ---------------------------------------------------------------- the judge


def judge(model_dir: Path, judge_dir: Path, listing: str, letter: str, seeds: int, judges: dict) -> dict:
    """Stock transformers, one request a sentence and seed: each clip's MCD (sentence, and on the letter's
    frames), mean over seeds, every request's length over the recording's, and each of `judges`' score (the
    phonetic judge against the recording; the speaker judge against the voice's recordings, set beforehand)."""
    import librosa
    import torch
    from transformers import VitsModel, VitsTokenizer

    from finetune.data.corpus import load_examples
    from finetune.data.features import FeatureConfig, Features
    from finetune.reporting.measures import MCD_SCALE, mcd_dtw, mel_cepstrum

    model, tokenizer = VitsModel.from_pretrained(str(model_dir)).eval(), VitsTokenizer.from_pretrained(str(model_dir))
    examples, _ = load_examples(judge_dir, listing, tokenizer, 256, 16000)
    letter_id = tokenizer.encoder.get(letter, -1)  # (get_vocab also lists <unk>, an added token, at the next id)
    features = Features(FeatureConfig())
    sentence, region, ratios, judged = {}, {}, [], {name: {} for name in judges}
    for index, example in enumerate(examples):
        real = features.mel(torch.from_numpy(example.audio / 32768.0).float().unsqueeze(0))[0].numpy()
        ids = torch.from_numpy(example.token_ids.astype(np.int64)).unsqueeze(0)
        scores, letter_scores = [], []
        for seed in range(seeds):
            torch.manual_seed(10_000 * seed + index)
            with torch.no_grad():
                out = model(input_ids=ids, output_hidden_states=False)
            samples = int(out.sequence_lengths[0])
            synthesised = features.mel(out.waveform[:, :samples])[0].numpy()
            scores.append(mcd_dtw(synthesised, real))
            ratios.append(samples / len(example.audio))
            wave, recording = out.waveform[0, :samples].numpy(), example.audio / 32768.0
            for name, one in judges.items():
                value = one.score(wave, 16000, item_id=example.item_id, reference=(recording, 16000))
                judged[name][example.item_id] = judged[name].get(example.item_id, 0.0) + value / seeds
            frames = letter_frames(model, ids, letter_id, 10_000 * seed + index, synthesised.shape[1])
            if frames.any():
                a, b = mel_cepstrum(synthesised), mel_cepstrum(real)
                _, path = librosa.sequence.dtw(X=a, Y=b, metric="euclidean")
                pairs = path[frames[path[:, 0]]]
                letter_scores.append(
                    float(MCD_SCALE * np.linalg.norm(a[:, pairs[:, 0]] - b[:, pairs[:, 1]], axis=0).mean())
                )
        sentence[example.item_id] = float(np.mean(scores))
        if letter_scores:
            region[example.item_id] = float(np.mean(letter_scores))
    return {
        "sentence": sentence,
        "letter": region,
        **judged,
        "length_ratio": float(np.median(ratios)) if ratios else math.nan,
    }


def letter_frames(model, ids, letter_id: int, seed: int, frames: int) -> np.ndarray:
    """Which synthesised frames belong to the letter's tokens, widened by 2 frames: the durations of the
    request's own draw (the text encoder draws nothing, so the duration predictor's noise is the first draw
    after the seed, in stock transformers as here)."""
    import torch

    from finetune.vits.inference import encode_text, predict_log_duration

    mask = np.zeros(frames, dtype=bool)
    if letter_id < 0 or not (ids == letter_id).any():
        return mask
    torch.manual_seed(seed)
    with torch.no_grad():
        _, hidden, token_mask = encode_text(model, [ids[0].numpy()], torch.device("cpu"))
        log_duration = predict_log_duration(model, hidden, token_mask, None, model.noise_scale_duration)
    durations = torch.ceil(torch.exp(log_duration) * token_mask / model.speaking_rate)[0, 0].long().numpy()
    ends = np.cumsum(durations)
    for position in np.nonzero(ids[0].numpy() == letter_id)[0]:
        start, end = int(ends[position] - durations[position]), int(ends[position])
        mask[max(0, start - 2) : min(frames, end + 2)] = True
    return mask


def paired(before: dict, after: dict, higher_is_better: bool = False) -> dict:
    """after - before over the clips both scored: the mean change (negative: nearer the recordings; for a measure
    where higher is better, positive), the one-sided 95% t bound of that mean, the clips, and whether the change
    is an improvement beyond it (`improved_beyond_noise`) or a worsening beyond it (`worse_beyond_noise`)."""
    from finetune.reporting.selection import paired as paired_comparison

    sign = -1.0 if higher_is_better else 1.0
    comparison = paired_comparison({k: sign * v for k, v in before.items()}, {k: sign * v for k, v in after.items()})
    worse = paired_comparison({k: sign * v for k, v in after.items()}, {k: sign * v for k, v in before.items()})
    shared = [k for k in after if k in before]
    return {
        "before": float(np.mean([before[k] for k in shared])) if shared else math.nan,
        "after": float(np.mean([after[k] for k in shared])) if shared else math.nan,
        "change_db": -sign * comparison.advantage_db,
        "noise_bound_db": comparison.bound_db,
        "clips": comparison.clips,
        "improved_beyond_noise": comparison.beyond_noise,
        "worse_beyond_noise": worse.beyond_noise,
    }


# ---------------------------------------------------------------- the round


def feedback_round(
    base: Path, data: Path, corrections: Path, work: Path, minutes: float, lr: float, smoke: bool, flags: list[str]
) -> dict:
    voices = work / "voices"
    shutil.rmtree(voices, ignore_errors=True)
    extra = ["--max_epochs", "1", "--val_samples", "2", "--benchmark_samples", "4"] if smoke else []
    run(
        "train_feedback.py",
        [
            "--base_model",
            base,
            "--data_dir",
            data,
            "--feedback_dir",
            corrections,
            "--output_dir",
            voices,
            "--target_minutes",
            minutes,
            "--learning_rate",
            lr,
            "--log_every_seconds",
            "60",
            *extra,
            *flags,
        ],
        work / "round.log",
        "the feedback round",
    )
    round_dir = voices / "rounds" / "round_001"
    report = json.loads((round_dir / "feedback_report.json").read_text(encoding="utf-8"))
    best = round_dir / "checkpoints" / "best_model"
    trained = (best / "eval.json").is_file() and json.loads((best / "eval.json").read_text())["step"] > 0
    # What the round made, accepted or not: its best model, else (the start was its best) its last one.
    report["candidate_dir"] = str(best if trained else round_dir / "checkpoints" / "last_model")
    return report


DEFAULT_CASES = ("x:k:stretch1.4", "ç:c:espeak", "p:b:stretch1.25")


def parse_case(text: str) -> tuple[str, str, str]:
    letter, said_as, readers = text.split(":")
    if readers != "espeak" and not (readers.startswith("stretch") and float(readers.removeprefix("stretch")) > 0):
        raise SystemExit(f"--cases {text}: READERS is stretchS (S > 0) or espeak")
    return letter, said_as, readers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--work_dir",
        default=None,
        help="keep everything here (default: a temporary folder); a voice already pretrained there is reused",
    )
    parser.add_argument(
        "--cases", nargs="+", default=list(DEFAULT_CASES), help="LETTER:SAID_AS:READERS, each a planted case"
    )
    parser.add_argument("--pretrain_hours", type=float, default=0.17)
    parser.add_argument("--round_minutes", type=float, default=6.0)
    parser.add_argument(
        "--round_lr",
        type=float,
        default=5e-4,
        help="the round's learning rate (the demo voice's: make demo-feedback uses 5e-4)",
    )
    parser.add_argument(
        "--round_flags",
        default="",
        help='more train_feedback.py flags for the round, one string (--round_flags="--acoustics trained")',
    )
    parser.add_argument("--judge_seeds", type=int, default=3)
    parser.add_argument(
        "--smoke", action="store_true", help="the pipeline on 32 clips with tiny budgets (figures mean nothing)"
    )
    args = parser.parse_args()
    print(f"machine: {describe()}", flush=True)
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="bench_corrections_"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"work folder: {work}", flush=True)
    prepared = prepare_all(work, 32 if args.smoke else 0)
    cases = [parse_case(text) for text in (args.cases[:1] if args.smoke else args.cases)]
    if args.smoke:
        cases = [(letter, said_as, "stretch1.4") for letter, said_as, _ in cases]  # no espeak-ng in the tests
    results = {}
    for letter, said_as, readers in cases:
        results[f"{letter}:{said_as}:{readers}"] = one_case(
            args, prepared, work / f"case_{letter}", letter, said_as, readers
        )
    print_summary(results)
    (work / "results.json").write_text(json.dumps(results, indent=2, ensure_ascii=False), encoding="utf-8")


def one_case(args, prepared: Path, work: Path, letter: str, said_as: str, readers: str) -> dict:
    """One planted case: split, voice, plant, round, judge."""
    work.mkdir(parents=True, exist_ok=True)
    print(f"\n== {letter!r} said as {said_as!r}, corrections read by {readers} ({work})", flush=True)
    parts = split(prepared, work, letter, readers)
    print(f"clips: {json.dumps(parts['counts'])}", flush=True)
    voice = pretrain(parts["voice"], work, 0.1 if args.smoke else args.pretrain_hours, args.smoke)
    planted = plant(voice, work / "planted", letter, said_as)
    print(f"planted: {letter!r} is said as {said_as!r} by {planted}", flush=True)
    report = feedback_round(
        planted,
        parts["voice"],
        parts["corrections"],
        work,
        1.0 if args.smoke else args.round_minutes,
        args.round_lr,
        args.smoke,
        shlex.split(args.round_flags),
    )
    print(
        f"round: {'ACCEPTED' if report['accepted'] else 'REJECTED'} ({report['reason']})\n  decided by "
        f"{report['decided_by']}: {report['improvement']}",
        flush=True,
    )
    seeds = 1 if args.smoke else args.judge_seeds
    results = {
        "counts": parts["counts"],
        "round": {k: report[k] for k in ("accepted", "reason", "decided_by", "improvement", "before", "after")},
    }
    from finetune.reporting import judges as judging

    phonetic = judging.load_judges(["phonetic", "phone_errors"]) if judging.available("phonetic") else {}
    speaker = judging.load_judges(["speaker"]) if judging.available("speaker") else {}
    if speaker:
        held = voice_recordings(parts["judge"], "voice_held_out.csv")
        speaker["speaker"].set_voice(held)
    for name, listing, asked in (
        ("unseen sentences with the letter", "with_letter.csv", phonetic),
        ("the voice's own held-out clips", "voice_held_out.csv", speaker),
    ):
        before = judge(planted, parts["judge"], listing, letter, seeds, asked)
        after = judge(Path(report["candidate_dir"]), parts["judge"], listing, letter, seeds, asked)
        results[name] = {
            "sentence": paired(before["sentence"], after["sentence"]),
            "letter_frames": paired(before["letter"], after["letter"]),
            **{j: paired(before[j], after[j], higher_is_better=asked[j].higher_is_better) for j in asked},
            "length_ratio": [before["length_ratio"], after["length_ratio"]],
        }
    print_table(results)
    results["verdict"] = verdict(results)
    return results


def voice_recordings(judge_dir: Path, listing: str) -> dict:
    import soundfile as sf

    items = [line.split("|", 1)[0] for line in (judge_dir / listing).read_text(encoding="utf-8").splitlines() if line]
    return {item: sf.read(judge_dir / "wavs" / f"{item}.wav", dtype="float32") for item in items}


def verdict(results: dict) -> dict:
    """What the case shows: the letter fixed on unseen sentences (its frames nearer beyond the noise), the voice's
    other sentences not worse beyond their noise, its identity held (the speaker judge: not worse beyond noise)."""
    unseen, own = results["unseen sentences with the letter"], results["the voice's own held-out clips"]
    return {
        "accepted": results["round"]["accepted"],
        "fixed_on_unseen": bool(unseen["letter_frames"]["improved_beyond_noise"]),
        "voice_unmoved": not own["sentence"]["worse_beyond_noise"],
        "identity_held": not own["speaker"]["worse_beyond_noise"] if "speaker" in own else None,
    }


def print_summary(results: dict) -> None:
    print(
        "\n| case | round | letter on unseen sentences (change, bound) | fixed | voice's other sentences | identity |"
    )
    print("| --- | --- | ---: | --- | --- | --- |")
    for case, r in results.items():
        v, frames = r["verdict"], r["unseen sentences with the letter"]["letter_frames"]
        identity = {None: "(not judged)", True: "held", False: "MOVED"}[v["identity_held"]]
        print(
            f"| {case} | {'accepted' if v['accepted'] else 'rejected'} | {frames['change_db']:+.3f} dB, "
            f"{frames['noise_bound_db']:.3f} | {'yes' if v['fixed_on_unseen'] else 'no'} | "
            f"{'unmoved' if v['voice_unmoved'] else 'MOVED'} | {identity} |",
            flush=True,
        )


def print_table(results: dict) -> None:
    print("\n| judged on | measure | before | after | after - before | 95% noise bound | clips |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for name in ("unseen sentences with the letter", "the voice's own held-out clips"):
        for measure in ("sentence", "letter_frames", "phonetic", "phone_errors", "speaker"):
            r = results[name].get(measure)
            if not r or not r["clips"]:
                continue
            label = (
                f"{measure.replace('_', ' ')} MCD (dB)"
                if measure in ("sentence", "letter_frames")
                else f"{measure} judge"
            )
            print(
                f"| {name} | {label} | {r['before']:.3f} | {r['after']:.3f} | "
                f"{r['change_db']:+.3f} | {r['noise_bound_db']:.3f} | {r['clips']} |"
            )
        lengths = results[name]["length_ratio"]
        print(f"| {name} | median length vs recordings | x{lengths[0]:.3f} | x{lengths[1]:.3f} | | | |", flush=True)


if __name__ == "__main__":
    main()
