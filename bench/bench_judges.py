#!/usr/bin/env python3
"""Which judges hear what a listener hears? Each judge of finetune/reporting/judges.py scores ladders whose order
is known, and may vote (decide which model is kept, whether a round of corrections is accepted) only where it
ranks every ladder of its kind right: Kendall tau >= 0.8 on each, its test-retest noise below half the smallest gap
between neighbouring rungs of each ladder.

    .venv/bin/python bench/bench_judges.py --model demo/work/checkpoints/best_model --data_dir demo/work/data \\
        --work_dir W                   # about 15 minutes on 2 CPU cores
    .venv/bin/python bench/bench_judges.py --smoke --work_dir W    # the pipeline on an untrained voice, 2 clips

The ladders, each worst rung first (for two voices: the model's own and, when --model has a multi_speaker/
folder, the crowd's speaker with the most held-out clips):
    checkpoints/V   new weights < early (--early, else a run of --early_seconds from new weights) < the kept
                    model (--model) < the recordings (the last only for judges that do not compare a clip
                    with its own recording: a recording against itself is no test)
    noise           the voice's recordings with white noise at 0, 10, 20, 30 dB SNR < clean
    lowpass         low-passed at 1, 2, 4 kHz < the whole band
    pitch           (speaker) shifted up 6, 4, 2 semitones < as recorded
    other_speaker   (speaker) another speaker's recordings < the voice's own (against the voice's centroid)
    text_swaps      (what is said) the kept model saying the text with 40, 20, 10 % of its letters swapped < 0 %
    words_dropped   (what is said) with 50, 25 % of its words dropped < all of them
Each judge is ranked on its kind's ladders: speaker on checkpoints, noise, lowpass, pitch, other_speaker;
phonetic, phone_errors, asr and spectral (MCD) on checkpoints, noise, lowpass, text_swaps, words_dropped;
naturalness on checkpoints, noise, lowpass. Tempo 0.7 and 1.4 (time-stretched recordings) is reported beside,
as how far each judge moves against a 20 dB noise step (a judge of who or what should barely move).
Test-retest: the kept model's two draws of each clip (seeds), scored twice; the noise is the standard deviation
of the per-clip difference. Written: W/results.json as
    {"judges": {NAME: {"kind": ..., "votes": bool, "ladders": {LADDER: {"kendall_tau": float, "clips": int,
      "means": [...]}}, "retest_sd": float, "tempo": {...}}}, "machine": ..., "voices": [...]}
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from bench.launcher import run_script
from bench.machine import describe
from finetune.reporting.judge_ladders import (
    LADDERS_OF,
    Clip,
    Ladder,
    Rung,
    as_recorded,
    held_out,
    rank_ladder,
    recording_ladders,
    render,
    retest_sd,
    score_rung,
    set_reference,
    tempo,
    text_ladders,
    votes,
    with_noise,
)

REPO = Path(__file__).resolve().parent.parent
JUDGES = ("speaker", "phonetic", "phone_errors", "asr", "mcd", "naturalness")


# ---------------------------------------------------------------- the voices and their clips


def pick_voices(model: Path, data_dir: Path) -> list[tuple[str, str | None]]:
    """(name, speaker to load from the multi-speaker folder or None) of the model's own voice and, in a crowd's
    model, the other speaker with the most held-out clips."""
    from collections import Counter

    from finetune.data.metadata import read_rows
    from finetune.vits.speaker_layers import MULTI_SPEAKER_DIR

    config = json.loads((model / "config.json").read_text(encoding="utf-8"))
    own = config.get("speaker")
    voices = [(own or "voice", None)]
    listing = model / MULTI_SPEAKER_DIR / "speakers.json"
    if listing.is_file():
        names = set(json.loads(listing.read_text(encoding="utf-8"))["speakers"])
        counts = Counter(who for _, who, _ in read_rows(data_dir / "metadata_val.csv") if who in names and who != own)
        if counts:
            voices.append((counts.most_common(1)[0][0], counts.most_common(1)[0][0]))
    return voices


def new_weights(model: Path, out: Path, seed: int) -> Path:
    """The model's architecture with new weights, as a folder like it: its single voice at the top and, when it has
    one, its multi-speaker model in multi_speaker/ (the same speakers.json)."""
    import torch
    from transformers import VitsConfig, VitsModel, VitsTokenizer

    from finetune.vits.speaker_layers import MULTI_SPEAKER_DIR

    shutil.rmtree(out, ignore_errors=True)
    for source, target in ((model, out), (model / MULTI_SPEAKER_DIR, out / MULTI_SPEAKER_DIR)):
        if not (source / "config.json").is_file():
            continue
        torch.manual_seed(seed)
        VitsModel(VitsConfig.from_pretrained(str(source))).save_pretrained(str(target))
        VitsTokenizer.from_pretrained(str(source)).save_pretrained(str(target))
        if (source / "speakers.json").is_file():
            shutil.copy(source / "speakers.json", target / "speakers.json")
    return out


def train_early(start: Path, data_dir: Path, work: Path, voice: str, seconds: float, smoke: bool) -> Path:
    """An early model: `start` (new weights) trained for `seconds` on the corpus, the recipe's way."""
    run = work / "early"
    shutil.rmtree(run, ignore_errors=True)
    argv = [
        "--data_dir",
        str(data_dir),
        "--checkpoint_dir",
        str(run / "checkpoints"),
        "--output_dir",
        str(run / "final_model"),
        "--model_name",
        str(start),
        "--target_hours",
        str(seconds / 3600),
        "--discriminator_width",
        "0.0625",
        "--learning_rate",
        "2e-3",
        "--gradient_accumulation_steps",
        "1",
        "--dropout",
        "on",
        "--discriminator_warmup_steps",
        "0",
        "--report_to",
        "none",
        "--log_every_seconds",
        "60",
        *(
            ["--max_epochs", "1", "--max_samples", "8", "--val_samples", "2", "--benchmark_samples", "4"]
            if smoke
            else []
        ),
    ]
    from finetune.data.metadata import read_rows

    if voice != "voice" and len({who for _, who, _ in read_rows(data_dir / "metadata.csv")}) > 1:
        argv += ["--speakers", "conditioned", "--target_speaker", voice]
    code = run_script(REPO / "train_vits.py", argv, work / "early.log")
    if code != 0:
        raise SystemExit(f"training the early model failed (exit {code}); see {work / 'early.log'}")
    return run / "final_model"


def voice_of(folder: Path, speaker: str | None):
    import torch

    from finetune.vits.synthesis import load_voice

    return load_voice(folder, torch.device("cpu"), speaker=speaker)


# ---------------------------------------------------------------- the ladders


def espeak_voice(spec: str):
    """A render() stand-in for a good voice: espeak-ng with the settings of `espeak:VOICE:WPM:PITCH` (the demo
    crowd's speakers are espeak-ng voices: demo/make_corpus.py's SPEAKERS)."""
    import soundfile as sf

    _, voice, speed_wpm, pitch = spec.split(":")

    def say(clips: list, texts: list[str] | None = None, seed: int = 0) -> list[Clip]:
        said = []
        with tempfile.TemporaryDirectory() as folder:
            for index, (item, text, audio, rate) in enumerate(clips):
                path = Path(folder) / f"{index}.wav"
                words = texts[index] if texts else text
                subprocess.run(
                    ["espeak-ng", "-v", voice, "-s", speed_wpm, "-p", pitch, "-w", str(path), words],
                    check=True,
                    capture_output=True,
                )
                wave, wave_rate = sf.read(path, dtype="float32")
                said.append(Clip(item, wave, wave_rate, (audio, rate), text))
        return said

    return say


def build_ladders(
    kept: Path, early: Path, fresh: Path, voices, data_dir: Path, count: int, seed: int, good_voice: str | None = None
) -> list:
    ladders = []
    for name, speaker in voices:
        clips = held_out(data_dir, None if name == "voice" else name, count)
        rungs = [
            Rung("new weights", render(voice_of(fresh, speaker), clips, seed=seed)),
            Rung("early", render(voice_of(early, speaker), clips, seed=seed)),
            Rung("kept", render(voice_of(kept, speaker), clips, seed=seed)),
            Rung("recordings", as_recorded(clips), is_recording=True),
        ]
        ladders.append(Ladder(f"checkpoints/{name}", "checkpoints", name, rungs))
    name, speaker = voices[0]
    clips = held_out(data_dir, None if name == "voice" else name, count)
    kept_voice = voice_of(kept, speaker)
    # Who says the altered texts: a good voice (--good_voice: what a judge of what is said must hear in clear
    # speech), else the kept model.
    say = (
        espeak_voice(good_voice)
        if good_voice
        else (lambda clips, texts=None, seed=0: render(kept_voice, clips, texts, seed))
    )

    ladders += recording_ladders(clips, name, seed, {"noise", "lowpass", "pitch"})
    if len(voices) > 1:
        other = held_out(data_dir, voices[1][0], count)
        ladders.append(
            Ladder(
                "other_speaker",
                "other_speaker",
                name,
                [Rung(voices[1][0], as_recorded(other)), Rung(name, as_recorded(clips))],
            )
        )
    ladders += text_ladders(say, clips, name, seed, {"text_swaps", "words_dropped"})
    return ladders


def set_voice(judge, data_dir: Path, voice: str, count: int) -> None:
    """The speaker judge's reference: the voice's held-out recordings."""
    set_reference(judge, held_out(data_dir, voice if voice != "voice" else None, count))


def validate(judge, ladders: list, data_dir: Path, count: int) -> dict:
    """Every ladder of the judge's kind ranked; whether it may vote (finetune/reporting/judge_ladders.py votes)."""
    results = {}
    for ladder in ladders:
        if ladder.kind_of not in LADDERS_OF[judge.kind]:
            continue
        set_voice(judge, data_dir, ladder.voice, count)
        results[ladder.name] = rank_ladder(judge, ladder)
    return results


def retest_draws(kept: Path, voice, data_dir: Path, count: int, seed: int) -> tuple[Rung, Rung]:
    """Two seeded draws of the kept model saying the voice's held-out clips (every judge scores the same two)."""
    name, speaker = voice
    clips = held_out(data_dir, name if name != "voice" else None, count)
    said = voice_of(kept, speaker)
    return Rung("a", render(said, clips, seed=seed + 1000)), Rung("b", render(said, clips, seed=seed + 2000))


def retest(judge, draws: tuple[Rung, Rung], data_dir: Path, voice: str, count: int) -> float:
    """The standard deviation of the per-clip difference between the judge's scores of the two draws."""
    set_voice(judge, data_dir, voice, count)
    return retest_sd(judge, draws)


def tempo_rungs(data_dir: Path, voice: str, count: int) -> list[Rung]:
    """The voice's recordings stretched to 0.7x and 1.4x their length, as recorded and at 20 dB SNR (the step a
    judge of who or what should move more than for a tempo)."""
    clips = held_out(data_dir, voice if voice != "voice" else None, count)
    return [
        Rung("as recorded", as_recorded(clips)),
        Rung("x0.7", as_recorded(clips, tempo(0.7))),
        Rung("x1.4", as_recorded(clips, tempo(1.4))),
        Rung("20 dB SNR", as_recorded(clips, with_noise(20, 0))),
    ]


def tempo_effect(judge, rungs: list[Rung], data_dir: Path, voice: str, count: int) -> dict:
    """The judge's mean on each of tempo_rungs."""
    set_voice(judge, data_dir, voice, count)
    return {rung.label: round(float(np.mean(score_rung(judge, rung))), 4) for rung in rungs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--model", help="the kept model: a folder train_vits.py wrote (its multi_speaker/ gives a second voice)"
    )
    parser.add_argument("--data_dir", help="its prepared corpus (held-out clips in metadata_val.csv)")
    parser.add_argument(
        "--work_dir", default=None, help="results.json and the early model here (default: a temporary folder)"
    )
    parser.add_argument(
        "--early", default=None, help="an early model folder of the same voices (default: trained here)"
    )
    parser.add_argument("--early_seconds", type=float, default=90.0, help="the early model's budget, start-up included")
    parser.add_argument("--clips", type=int, default=8, help="held-out clips of each voice on every rung")
    parser.add_argument("--judges", nargs="+", default=list(JUDGES), choices=JUDGES)
    parser.add_argument(
        "--asr_model", default=None, help="a transformers CTC model (hub id or folder) for the asr judge"
    )
    parser.add_argument(
        "--good_voice",
        default=None,
        help="who says the text ladders' altered sentences: espeak:VOICE:WPM:PITCH (an espeak-ng voice; the demo "
        "crowd's ciya is espeak:ku+f2:140:62), else the kept model",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--smoke", action="store_true", help="an untrained tiny voice on 2 demo clips (figures mean nothing)"
    )
    args = parser.parse_args()
    print(f"machine: {describe()}", flush=True)
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="bench_judges_"))
    work.mkdir(parents=True, exist_ok=True)
    if args.smoke:
        args.model, args.data_dir, args.clips = smoke_voice(work), str(work / "smoke_data"), 2
    if not args.model or not args.data_dir:
        parser.error("--model and --data_dir are needed (or --smoke)")
    from finetune.reporting import judges as judging

    kept, data_dir = Path(args.model), Path(args.data_dir)
    voices = pick_voices(kept, data_dir)
    counts = [len(held_out(data_dir, None if name == "voice" else name, args.clips)) for name, _ in voices]
    print("voices: " + ", ".join(f"{name} ({n} held-out clips)" for (name, _), n in zip(voices, counts)), flush=True)
    fresh = new_weights(kept, work / "new_weights", args.seed)
    early = (
        Path(args.early)
        if args.early
        else train_early(fresh, data_dir, work, voices[0][0], args.early_seconds, args.smoke)
    )
    ladders = build_ladders(kept, early, fresh, voices, data_dir, args.clips, args.seed, args.good_voice)
    made = judging.load_judges(args.judges, args.asr_model)
    draws = retest_draws(kept, voices[0], data_dir, args.clips, args.seed)
    stretched = tempo_rungs(data_dir, voices[0][0], args.clips)
    results = {}
    for name, judge in made.items():
        ranked = validate(judge, ladders, data_dir, args.clips)
        noise = retest(judge, draws, data_dir, voices[0][0], args.clips)
        results[name] = {
            "kind": judge.kind,
            "higher_is_better": judge.higher_is_better,
            "votes": votes(ranked, noise),
            "ladders": ranked,
            "retest_sd": round(noise, 4),
            "tempo": tempo_effect(judge, stretched, data_dir, voices[0][0], args.clips),
        }
        print_judge(name, results[name])
    missing = [n for n in args.judges if n not in made]
    record = {
        "machine": describe(),
        "voices": [n for n, _ in voices],
        "clips": args.clips,
        "judges": results,
        "not_run": missing,
    }
    (work / "results.json").write_text(json.dumps(record, indent=2, ensure_ascii=False), encoding="utf-8")
    print(
        f"\nvoting: {', '.join(n for n, r in results.items() if r['votes']) or 'none'}; not run here: {', '.join(missing) or 'none'}"
    )
    print(f"results: {work / 'results.json'}")


def print_judge(name: str, result: dict) -> None:
    print(
        f"\n{name} ({result['kind']}, {'higher' if result['higher_is_better'] else 'lower'} is nearer): "
        f"votes {result['votes']}; test-retest SD {result['retest_sd']}"
    )
    for ladder, r in result["ladders"].items():
        rungs = ", ".join(f"{label} {mean}" for label, mean in zip(r["rungs"], r["means"]))
        print(f"  {ladder}: tau {r['kendall_tau']:+.2f} ({r['clips']} clips): {rungs}")
    print(f"  tempo: {result['tempo']}", flush=True)


def smoke_voice(work: Path) -> str:
    """An untrained tiny voice and its held-out clips, from the demo corpus as one voice."""
    import torch

    from finetune.vits.generator import scratch_generator

    data = work / "smoke_data"
    shutil.rmtree(data, ignore_errors=True)
    code = run_script(
        REPO / "prepare_data.py",
        [
            "--input_dir",
            str(REPO / "demo" / "corpus"),
            "--data_dir",
            str(data),
            "--model_name",
            "scratch:tiny",
            "--max_samples",
            "60",
            "--val_fraction",
            "0.3",
            "--num_workers",
            "1",
        ],
        work / "smoke_prepare.log",
    )
    if code != 0:
        raise SystemExit(f"preparing the smoke voice's clips failed (exit {code}); see {work / 'smoke_prepare.log'}")
    from finetune.data.metadata import read_rows

    texts = [t for name in ("metadata.csv", "metadata_val.csv") for _, _, t in read_rows(data / name)]
    torch.manual_seed(0)
    loaded = scratch_generator("tiny", sorted(set("".join(texts))), 16000)
    folder = work / "smoke_voice"
    shutil.rmtree(folder, ignore_errors=True)
    loaded.model.save_pretrained(str(folder))
    loaded.tokenizer.save_pretrained(str(folder))
    return str(folder)


if __name__ == "__main__":
    main()
