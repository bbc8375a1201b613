"""What `train_feedback.py --find` finds on a voice that learnt its mistakes from its reader (issue 85).

bench_corrections.py's voice (bench/learnt_voice.py: a pretrained tiny voice fine-tuned on one reader's recordings
that say x as k, ş as s and the word "min" as "man" while their transcripts keep them right) is heard against a
crowd of readers neither corpus holds (--readers: 6 by default; 3 are learnt_voice.CORRECTORS), on the judge's
sentences: those no step of the voice's run or of any round saw (learnt_voice's unseen and other sentences). The
voice's own reader's clips are its readings of the same sentences, with its mistakes (judge/mistaken): what a
held-out clip of theirs says. Two crowds, the same voice and the same own clips:

    planted  the crowd says every sentence right: --find should rank x, ş and min first, beyond the noise
    none     the crowd says the sentences with the voice's mistakes, as its reader does: nothing to find, and
             whatever is reported beyond the noise is a false alarm

--nothing_planted adds a third, on another voice:

    clean    a voice that learnt nothing wrong: W's voice made again the same way (its pretrained start, its
             hours, its sentences and held-out clips) from its reader's recordings said right (W/clean_voice,
             made once); the crowd and its own reader say every sentence right: whatever is reported beyond the
             noise is a false alarm of a voice as a user has one, with its own faults and none planted

    .venv/bin/python bench/bench_corrections.py --work_dir W --only x:k   # the voice (made once there, then reused)
    .venv/bin/python bench/find_learnt.py --work_dir W                    # -> W/find_learnt.json

--find runs as a user runs it (train_feedback.py, its defaults but the clip count and time limit, which hold the
whole crowd here).

--round: the whole path, with no recording by the user. Half of each mistake's sentences (every other one) are
kept apart; --find hears the crowd on the rest, and its corrections/ (the crowd's clips of what it found) feed
a round from the voice at the user's defaults with `--focus` the first it found (--rounds N: each of the first N,
a round each; bench_corrections.feedback_round); bench_corrections' judge then hears the voice before and after on
that mistake's sentences kept apart, which neither --find nor the round saw.

--smoke (after bench_corrections.py --smoke): the crowd is the judge's right readings under three names, the
planted case (and clean, on W's voice: the smoke's recordings say nothing wrong); its figures mean nothing.

--crowds K: --find on K crowds of --crowd_size readers (3 by default) drawn from the six, each case: in how many
the planted letter and word rank in the top 3 and beyond the noise, and in how many a crowd with nothing to find
(none, and clean with --nothing_planted) has anything reported beyond the noise (its false alarms). The crowds
share readers and sentences: a spread over crowds, not independent trials.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import shutil
import sys
from pathlib import Path

from bench import learnt_voice
from bench.bench_corrections import feedback_round, judge_case, prepare, run, train
from bench.machine import describe
from finetune.data.metadata import read_rows

# case -> how the crowd says the judge's sentences, and the voice's own reader's clips of them (what its
# held-out clips say): the learnt voice's reader says its mistakes, the clean voice's reader says nothing wrong
CASES = {
    "planted": ("right", "judge_mistaken"),
    "none": ("mistaken", "judge_mistaken"),
    "clean": ("right", "judge_right"),  # --nothing_planted
}
# Readers beyond learnt_voice.CORRECTORS for a larger crowd (--readers): espeak-ng voices neither corpus nor the
# corrections hold. Common Voice Kurmanji has hundreds of readers; three is the fewest --find judges a word across.
MORE_READERS = (("ku+m4", 140, 35), ("ku+f1", 170, 70), ("ku+m6", 150, 48))
EVERY_READER = (*learnt_voice.CORRECTORS, *MORE_READERS)


def crowd_voices(count: int) -> tuple:
    if not len(learnt_voice.CORRECTORS) <= count <= len(EVERY_READER):
        raise SystemExit(f"--readers takes {len(learnt_voice.CORRECTORS)} to {len(EVERY_READER)}")
    return EVERY_READER[:count]


def reported(found: dict) -> list[str]:
    """The units --find reported beyond the noise, as "letter ş" / "word min", in its order."""
    return [f"{f['kind']} {f['unit']}" for f in found["findings"] if f["beyond_noise"]]


def crowd_readings(
    work: Path, reading: str, texts: dict[str, str], mistakes, smoke: bool, readers: int
) -> dict[str, Path]:
    """Each crowd reader's prepared folder (16 kHz, as prepare_data.py writes it) of the judge's sentences, said
    right (reading "right") or with the voice's mistakes ("mistaken"); recorded once."""
    if smoke:  # the judge's right readings, under `readers` names: no espeak-ng
        return {f"reader{n}": work / "judge_right" for n in range(readers)}
    prepared = {}
    for n, reader in enumerate(crowd_voices(readers)):
        name = f"reader{n}"
        folder = work / "find_recordings" / reading / name
        said = (lambda t: t) if reading == "right" else (lambda t: learnt_voice.mistaken_reading(t, mistakes, reader))
        learnt_voice.record(folder, [(item, said(text), reader) for item, text in texts.items()])
        learnt_voice.write_rows(folder / "metadata.csv", list(texts.items()))
        log = work / f"find_prepare_{reading}_{name}.log"
        prepared[name] = prepare(folder, work / "find_prepared" / reading / name, log)
    return prepared


def clean_voice(work: Path, smoke: bool) -> Path:
    """The voice with nothing planted (see the docstring's clean), made once in W/clean_voice. In the smoke run,
    W's voice itself: its recordings are the demo corpus's, where nothing is said wrong."""
    if smoke:
        return work / "voice" / "final_model"
    source, folder = work / "recordings" / "user_corpus", work / "recordings" / "user_corpus_right"
    rows = [(item, text) for item, _, text in read_rows(source / "metadata.csv")]
    learnt_voice.record(folder, [(item, text, learnt_voice.TARGET_READER) for item, text in rows])
    learnt_voice.write_rows(folder / "metadata.csv", rows)
    held = (source / "held_out.txt").read_text(encoding="utf-8").split()
    data = prepare(folder, work / "user_data_right", work / "prepare_user_right.log", held)
    learnt = json.loads((work / "voice" / "checkpoints" / "training_args.json").read_text(encoding="utf-8"))
    start = str(work / "pretrained" / "final_model")
    run_dir = train(data, work / "clean_voice", start, learnt["target_hours"], False, work / "clean_voice.log")
    return run_dir / "final_model"


def crowd_corpus(work: Path, case: str, own: Path, crowd: dict[str, Path], leave_out: set[str] = frozenset()) -> Path:
    """A multi-speaker corpus as prepare_data.py lays one out: the voice's reader ("target": its training clips in
    metadata.csv, its judge readings held out) and the crowd's readers (held out), each clip's wav linked in."""
    data = work / f"find_data_{case}"
    shutil.rmtree(data, ignore_errors=True)
    (data / "wavs").mkdir(parents=True)
    held = []
    for reader, folder in (("target", own), *crowd.items()):
        for item, _, text in read_rows(folder / "metadata.csv"):
            if item in leave_out:
                continue
            clip = f"{reader}_{item}"
            (data / "wavs" / f"{clip}.wav").symlink_to((folder / "wavs" / f"{item}.wav").resolve())
            held.append(f"{clip}|{reader}|{text}")
    trained = [f"t_{item}|target|{text}" for item, _, text in read_rows(work / "user_data" / "metadata.csv")]
    (data / "metadata.csv").write_text("".join(f"{row}\n" for row in trained), encoding="utf-8")
    (data / "metadata_val.csv").write_text("".join(f"{row}\n" for row in held), encoding="utf-8")
    return data


def kept_apart(work: Path, mistake) -> list[str]:
    """Every other sentence of the judge's with the mistake: the sentences the round's judge hears."""
    listing = work / "judge_right" / f"with_{learnt_voice.safe(mistake.name)}.csv"
    return [line.split("|", 1)[0] for line in listing.read_text(encoding="utf-8").splitlines() if line][1::2]


def judge_folders(work: Path, mistake, apart: set[str]) -> dict[str, Path]:
    """The judge's readings (right and mistaken) with the mistake's listing cut to the sentences kept apart."""
    folders, listing = {}, f"with_{learnt_voice.safe(mistake.name)}.csv"
    for reading in ("right", "mistaken"):
        source, folder = work / f"judge_{reading}", work / "find_round_judge" / f"judge_{reading}"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        for name in ("wavs", "metadata.csv", "other.csv"):
            (folder / name).symlink_to((source / name).resolve())
        rows = (source / listing).read_text(encoding="utf-8").splitlines()
        kept = "".join(f"{row}\n" for row in rows if row.split("|", 1)[0] in apart)
        (folder / listing).write_text(kept, encoding="utf-8")
        folders[f"judge_{reading}"] = folder
    return folders


def round_from_the_crowd(
    work: Path, texts: dict, mistakes, voice: Path, smoke: bool, readers: int, rounds: int
) -> dict:
    """--find on the crowd without the sentences kept apart (half of each mistake's), then for each of the first
    `rounds` units it found beyond the noise, a round from the voice on its corrections with that unit as the
    focus, and the judge on that mistake's sentences kept apart."""
    apart = {item for m in mistakes for item in kept_apart(work, m)}
    crowd = crowd_readings(work, "right", texts, mistakes, smoke, readers)
    data = crowd_corpus(work, "round", work / "judge_mistaken", crowd, leave_out=apart)
    found = find(work, "round", data, voice)
    beyond = [f for f in found["findings"] if f["beyond_noise"]]
    corrections = work / "find_round" / "corrections"  # what --find wrote
    if smoke:  # figures mean nothing: the smoke crowd is too small to correct; bench_corrections' own corrections
        corrections = work / "recordings" / f"corrections_{learnt_voice.safe(mistakes[0].name)}"
        chosen = [mistakes[0]]
    else:
        named = {(m.kind, m.right): m for m in mistakes}
        chosen = [named.get((f["kind"], f["unit"]), f"{f['kind']} {f['unit']}") for f in beyond[:rounds]]
    results = {"found": reported(found), "rounds": []}
    for mistake in chosen:
        if isinstance(mistake, str):  # reported, but nothing the voice was made to say wrong: no judge for it
            results["rounds"].append({"focus": mistake, "round": "none: what was found is no planted mistake"})
            continue
        results["rounds"].append(one_round(work, mistake, corrections, smoke))
        print(f"  round on {mistake.name}: {json.dumps(results['rounds'][-1])}", flush=True)
    return results


def one_round(work: Path, mistake, corrections: Path, smoke: bool) -> dict:
    """A round from the voice at the user's defaults on --find's corrections, `--focus` the mistake's letter or
    word, judged before and after on the mistake's sentences kept apart."""
    focus = mistake.right if mistake.kind == "letter" else f"word:{mistake.right}"
    case = work / f"find_round_case_{learnt_voice.safe(mistake.name)}"
    report = feedback_round(work / "voice", work / "user_data", corrections, case, smoke, ["--focus", focus])
    before = work / "voice" / "checkpoints" / "best_model"
    after = Path(report["app_dir"] if report["accepted"] else report["candidate_dir"])
    mine = set(kept_apart(work, mistake))
    judged = judge_case(before, after, judge_folders(work, mistake, mine), mistake, 1 if smoke else 3)
    return {
        "focus": focus,
        "kept_apart": len(mine),
        "round": {k: report.get(k) for k in ("accepted", "reason", "decided_by", "improvement", "steps")},
        **judged,
    }


def many_crowds(work: Path, texts: dict, mistakes, cases: dict, count: int, size: int, smoke: bool) -> dict:
    """--find on `count` crowds of `size` readers each, drawn from the six (every reader's recordings made once),
    for each case (name -> (its crowd's reading, its own reader's clips, its voice)): how often each planted
    mistake ranks in the top 3 and beyond the noise, and how often a crowd with nothing to find has anything
    reported beyond the noise (the false-alarm rate). The crowds share readers and sentences, so they are not
    independent draws: a spread, not a confidence."""
    voices = EVERY_READER
    subsets = list(itertools.combinations(range(len(voices)), size))
    random.Random(0).shuffle(subsets)
    results = {}
    for case, (reading, own, voice) in cases.items():
        everyone = crowd_readings(work, reading, texts, mistakes, smoke, len(voices))
        heard = []
        for number, subset in enumerate(subsets[:count]):
            crowd = {f"reader{n}": everyone[f"reader{n}"] for n in subset}
            found = find(work, f"{case}_crowd{number}", crowd_corpus(work, f"{case}_crowd", work / own, crowd), voice)
            beyond = reported(found)
            heard.append(
                {"readers": [voices[n][0] for n in subset], "beyond_noise": beyond, "planted": placed(found, mistakes)}
            )
            print(
                f"  {case} crowd {number + 1}/{min(count, len(subsets))} ({', '.join(heard[-1]['readers'])}): "
                f"beyond the noise {beyond}",
                flush=True,
            )
        crowds = len(heard)
        if case != "planted":
            results[case] = {
                "crowds": crowds,
                "false_alarms": sum(bool(h["beyond_noise"]) for h in heard),
                "reported": sorted({u for h in heard for u in h["beyond_noise"]}),
            }
        else:
            results[case] = {
                "crowds": crowds,
                **{
                    m.name: {
                        "top3": sum((h["planted"][m.name].get("place") or 99) <= 3 for h in heard),
                        "beyond_noise": sum(bool(h["planted"][m.name].get("beyond_noise")) for h in heard),
                    }
                    for m in mistakes
                },
                "others_beyond_noise": sum(
                    any(u.split(" ", 1)[1] not in {m.right for m in mistakes} for u in h["beyond_noise"]) for h in heard
                ),
            }
        results[f"{case}_each"] = heard
    return results


def find(work: Path, case: str, data: Path, voice: Path) -> dict:
    out = work / f"find_{case}"
    argv = ["--base_model", voice, "--data_dir", data, "--target_speaker", "target", "--find", 1000]
    argv += ["--find_minutes", 20, "--find_dir", out, "--output_dir", work / "find_voices"]
    run("train_feedback.py", argv, work / f"find_{case}.log", f"--find ({case})")
    return json.loads((out / "findings.json").read_text(encoding="utf-8"))


def placed(found: dict, mistakes) -> dict:
    """Each planted letter's and word's place in the ranked list (1: first), its figures, and whether beyond the
    noise."""
    ranked = found["findings"]
    where = {}
    for mistake in mistakes:
        unit = mistake.right
        index = next((i for i, f in enumerate(ranked) if f["kind"] == mistake.kind and f["unit"] == unit), None)
        where[mistake.name] = (
            {"place": index + 1, **{k: ranked[index][k] for k in ("z", "ratio", "sentences", "readers", "own_clips")}}
            | {"beyond_noise": ranked[index]["beyond_noise"]}
            if index is not None
            else {"place": None, "why": "not judged (too few sentences, readers or own clips hold it)"}
        )
    return where


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work_dir", required=True, help="bench_corrections.py's work folder (its voice)")
    parser.add_argument("--mistakes", nargs="+", default=list(learnt_voice.DEFAULT_MISTAKES), help="as the voice's")
    parser.add_argument(
        "--smoke", action="store_true", help="after bench_corrections.py --smoke (figures mean nothing)"
    )
    parser.add_argument("--round", action="store_true", help="and a round from the crowd's corrections, judged apart")
    parser.add_argument(
        "--nothing_planted",
        action="store_true",
        help="and the clean case: a voice made the same way from recordings said right (W/clean_voice, made once)",
    )
    parser.add_argument(
        "--crowds", type=int, default=0, help="and --find on this many crowds of --crowd_size readers of the six"
    )
    parser.add_argument("--rounds", type=int, default=1, help="--round on each of the first N units found (1)")
    parser.add_argument("--crowd_size", type=int, default=3, help="readers in each of --crowds (3 to 6)")
    parser.add_argument("--readers", type=int, default=6, help="how many readers the crowd has (3 to 6; 6)")
    args = parser.parse_args()
    print(f"machine: {describe()}", flush=True)
    crowd_voices(args.readers), crowd_voices(args.crowd_size)  # a count it cannot make refused before any work
    work = Path(args.work_dir)
    voice = work / "voice" / "final_model"
    if not (voice / "config.json").is_file():
        sys.exit(f"no voice in {work}: run bench/bench_corrections.py --work_dir {work} first")
    mistakes = learnt_voice.parse_mistakes(args.mistakes)
    texts = {item: text for item, _, text in read_rows(work / "judge_right" / "metadata.csv")}
    results = {"crowd_readers": args.readers}
    cases = {case: (*CASES[case], voice) for case in (["planted"] if args.smoke else ["planted", "none"])}
    if args.nothing_planted:
        cases["clean"] = (*CASES["clean"], clean_voice(work, args.smoke))
    for case, (reading, own, case_voice) in cases.items():
        crowd = crowd_readings(work, reading, texts, mistakes, args.smoke, args.readers)
        found = find(work, case, crowd_corpus(work, case, work / own, crowd), case_voice)
        beyond = reported(found)
        results[case] = {
            "clips_heard": found["clips_heard"],
            "own_clips": found["own_clips"],
            "readers": found["readers"],
            "seconds": found["seconds"],
            "judged": len(found["findings"]),
            "bound_z": found["bound_z"],
            "beyond_noise": beyond,
            "planted": placed(found, mistakes),
            "top5": [{k: f[k] for k in ("kind", "unit", "z", "ratio", "beyond_noise")} for f in found["findings"][:5]],
        }
        print(f"\n== {case}: {found['clips_heard']} clips heard in {found['seconds']} s; beyond the noise: {beyond}")
        for name, where in results[case]["planted"].items():
            print(f"  {name}: {where}")
        for line in results[case]["top5"]:
            print(f"  top: {line}")
    if args.crowds:
        results["crowds"] = many_crowds(work, texts, mistakes, cases, args.crowds, args.crowd_size, args.smoke)
        print(
            f"\n== {args.crowds} crowds of {args.crowd_size}: {json.dumps({k: v for k, v in results['crowds'].items() if not k.endswith('_each')})}"
        )
    if args.round:
        results["round"] = round_from_the_crowd(work, texts, mistakes, voice, args.smoke, args.readers, args.rounds)
        print(
            f"\n== a round from the crowd's corrections, judged on sentences kept apart: {json.dumps(results['round'])}"
        )
    (work / "find_learnt.json").write_text(json.dumps(results, indent=2, ensure_ascii=False), encoding="utf-8")


if __name__ == "__main__":
    main()
