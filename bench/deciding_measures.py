"""Which measure of a round's held-out corrections sees what the bench's judge hears? (bench_corrections.py)

A round is decided on the corrections held out of its training (finetune/feedback/decision.py), by a measure of
the voice saying each against its corrector's recording: another speaker's, so compared as one (normalised
cepstra at the frequency warp that fits the sentence best, DTW; finetune/feedback/differences.py). On a voice that
learnt x as k, a round that the judge heard move the letter half way to right on 20 unseen sentences was rejected:
its held-out corrections' measure moved +0.023 dB (bound 0.200; bench/log/2026-12-04.md). So, on the same
held-out corrections, the voice before the round and the round's model, each its per-frame distances to the
recording, reduced three ways:

    sentence   the mean over every frame: what decides a round without a focus
    focus      the mean over the frames of the tokens that say what the round corrects (focus.py's token mask,
               the voice's own durations): what decided a round with one before 2026-12-05
    relative   focus over the sentence's median frame: the timbre and channel that stay across speakers raise
               every frame alike, and fall out (hearing.py keeps a focus item from x1.2); the focus ratio, which
               decides a round with a focus since 2026-12-05, on 4 draws a clip (finetune/feedback/round_evaluator.py)

and, where hama is installed (requirements-judges.txt), by what a phoneme recogniser hears, whoever speaks:

    phonetic        the phonetic judge on the whole sentence (finetune/reporting/judges.py: DTW over the two
                    clips' phoneme posteriorgrams, blanks out)
    phonetic_focus  the same recogniser's posteriorgrams, blanks kept, DTW over the whole sentence, the cost
                    averaged over the pairs whose synthesised frame falls in the focus tokens' time (widened
                    by one 20 ms frame): how far what the voice says there is from what the recording says
    phone_errors    the greedy phone strings' edit distance over the recording's (a phone error rate)

each paired after - before, with its one-sided 95% bound (finetune/training/selection.py, as the round's own
decision pairs) and the retest noise between two seeds of the voice before. A measure that decides should move
beyond its bound where the judge heard the fix, and not where it heard none.

A measure that decides must also see a smaller, known change on this voice across these speakers: on the
corrections a round trained on (the voice says them right but for their mistake), the voice saying each text as it
is and with a common letter swapped for another (e before a, r before l, ...), each measure on that letter's frames
(letter_ladders): a ladder of two rungs, as bench/bench_judges.py ranks judges, with the gap against the retest
noise.

bench_corrections.py takes the measures after each round; again, with the ladders, on the rounds a work folder
holds:

    .venv/bin/python bench/deciding_measures.py --work_dir W [--seeds 3]     # -> W/deciding_measures.json
"""

from __future__ import annotations

import functools
import math
from pathlib import Path

import numpy as np

MEL_NAMES = ("sentence", "focus", "relative")
PHONETIC_NAMES = ("phonetic", "phonetic_focus", "phone_errors")
RECOGNISER_FPS = 50  # hama's frames a second (20 ms)


def measure_names() -> tuple[str, ...]:
    """The measures this environment can take (the phonetic ones need hama)."""
    from finetune.reporting.judges import available

    return MEL_NAMES + (PHONETIC_NAMES if available("phonetic") else ())


def focus_posteriorgram_distance(synthesised: np.ndarray, recorded: np.ndarray, marked: np.ndarray) -> float:
    """Mean DTW cost (-log of the probability both frames say the same phone, blank included, floored at 1e-4)
    between two full posteriorgrams [frames, phones], over the path's pairs whose synthesised frame is `marked`
    ([frames] bool); nan when none is."""
    import librosa

    cost = -np.log(np.clip(synthesised @ recorded.T, 1e-4, None))
    _, path = librosa.sequence.dtw(C=cost)
    on = marked[np.minimum(path[:, 0], len(marked) - 1)]
    return float(cost[path[on, 0], path[on, 1]].mean()) if on.any() else math.nan


def recogniser_frames(spoken: np.ndarray, seconds_a_frame: float, frames: int, widen: int = 1) -> np.ndarray:
    """[frames] bool at the recogniser's rate: those overlapping a marked synthesised frame (`spoken`, one a model
    frame of `seconds_a_frame`), widened by `widen` on both sides."""
    marked = np.zeros(frames, dtype=bool)
    for index in np.flatnonzero(spoken):
        first = int(index * seconds_a_frame * RECOGNISER_FPS)
        last = int((index + 1) * seconds_a_frame * RECOGNISER_FPS)
        marked[max(0, first - widen) : min(frames, last + widen + 1)] = True
    return marked


def corrections_of(corrections: Path) -> list[tuple[str, str, Path]]:
    """(id, text, recording) of every correction in a folder (metadata.csv and wavs/)."""
    found = []
    for line in (corrections / "metadata.csv").read_text(encoding="utf-8").splitlines():
        item, text = line.split("|", 1)[0], line.split("|")[-1]
        recordings = sorted((corrections / "wavs").glob(f"{item}.*"))
        if recordings:
            found.append((item, text, recordings[0]))
    return found


def held_sentences(history: Path) -> set[str]:
    """The sentences a voice's rounds held out (finetune/feedback/versions.py's history.json), by
    corrections.sentence_key."""
    import json

    return set(json.loads(history.read_text(encoding="utf-8")).get("held_out", [])) if history.is_file() else set()


def held_corrections(corrections: Path, history: Path) -> list[tuple[str, str, Path]]:
    """(id, text, recording) of the corrections a round held out."""
    from finetune.feedback.corrections import sentence_key

    held = held_sentences(history)
    return [c for c in corrections_of(corrections) if sentence_key(c[1]) in held]


def readings(
    model_dir: Path, clips: list[tuple[str, str, Path]], focus, seeds: int, references: dict, said: dict | None = None
) -> dict[str, list[dict]]:
    """Each measure, a dict clip id -> value per seed. `references`: each recording's warped cepstra by clip id,
    made on first use and kept for the next model's readings. `said`: clip id -> the text the voice speaks instead
    of the clip's (letters swapped one for one: the focus stays on the same tokens; a clip whose text then
    tokenises to another length is left out)."""
    import librosa
    import torch
    from transformers import VitsModel, VitsTokenizer

    from finetune.data.features import FeatureConfig, Features
    from finetune.feedback import differences
    from finetune.reporting import measures
    from finetune.vits.inference import ceiling_for_text, speak

    model, tokenizer = VitsModel.from_pretrained(str(model_dir)).eval(), VitsTokenizer.from_pretrained(str(model_dir))
    decoder = getattr(tokenizer, "decoder", {})
    features, rate = Features(FeatureConfig()), model.config.sampling_rate
    seconds_a_frame = math.prod(model.config.upsample_rates) / rate
    mel = lambda a: features.mel(torch.from_numpy(a).float().unsqueeze(0))[0].numpy()  # noqa: E731
    names = measure_names()
    phonetic = phonetic_judges() if PHONETIC_NAMES[0] in names else None
    found = {name: [dict() for _ in range(seeds)] for name in names}
    for index, (item, text, recording) in enumerate(clips):
        mask = focus.token_mask(np.array(tokenizer(text).input_ids), decoder)
        ids = np.array(tokenizer((said or {}).get(item, text)).input_ids)
        if len(ids) != len(mask):
            continue
        if item not in references:
            recorded = librosa.load(recording, sr=rate)[0]
            references[item] = (measures.warped_references(recorded, rate, mel), recorded)
        warped, recorded = references[item]
        for seed in range(seeds):
            speech = speak(model, [ids], torch.device("cpu"), 10_000 * seed + index, [ceiling_for_text(len(ids))])
            wave = speech.waveforms[0]
            per_frame = measures.frame_distances(mel(wave), warped)
            spoken = np.repeat(mask, speech.token_frames[0])
            found["sentence"][seed][item] = float(per_frame.mean())
            if spoken[: len(per_frame)].any():
                found["focus"][seed][item] = float(per_frame[spoken[: len(per_frame)]].mean())
                found["relative"][seed][item] = differences.relative_distance(per_frame, speech.token_frames[0], mask)
            if phonetic is not None:
                judge, errors = phonetic
                found["phonetic"][seed][item] = judge.score(wave, rate, (recorded, rate), item_id=item)
                found["phone_errors"][seed][item] = errors.score(wave, rate, (recorded, rate), item_id=item)
                voice_heard = np.exp(judge.recogniser.log_posteriors(wave, rate))
                recording_heard = np.exp(judge.recogniser.log_posteriors(recorded, rate))
                marked = recogniser_frames(spoken, seconds_a_frame, len(voice_heard))
                if marked.any():
                    found["phonetic_focus"][seed][item] = focus_posteriorgram_distance(
                        voice_heard, recording_heard, marked
                    )
    return found


@functools.cache
def phonetic_judges():
    """The phonetic judge and the phone error rate, sharing one recogniser (one a process: the recordings'
    posteriors are remembered from one model's readings to the next)."""
    from finetune.reporting.content_judges import PhoneErrorJudge, PhonemeRecogniser, PhoneticJudge

    recogniser = PhonemeRecogniser()
    return PhoneticJudge(recogniser), PhoneErrorJudge(recogniser)


def seed_mean(by_seed: list[dict]) -> dict[str, float]:
    """Clip id -> its value's mean over the seeds that took it."""
    return {k: float(np.mean([s[k] for s in by_seed if k in s])) for k in by_seed[0]}


def compared(before_dir: Path, after_dir: Path, clips: list, focus, seeds: int) -> dict:
    """Each measure on the held-out corrections: after - before (paired over clips, each a mean over seeds), its
    bound, whether beyond it either way, and the retest noise of a clip between the first two seeds before."""
    from bench.bench_corrections import paired
    from finetune.feedback.round_evaluator import retest_noise

    if not clips:
        return {"clips": 0}
    references = {}
    before = readings(before_dir, clips, focus, seeds, references)
    after = readings(after_dir, clips, focus, seeds, references)
    found = {"clips": len(clips)}
    for name in before:
        if not before[name][0]:
            continue  # not taken on any clip (no focus frame rendered)
        found[name] = paired(seed_mean(before[name]), seed_mean(after[name]))
        found[name]["retest_noise"] = retest_noise(before[name][0], before[name][1]) if seeds > 1 else math.nan
    return found


SWAPS = (("e", "a"), ("r", "l"), ("n", "m"), ("d", "t"), ("b", "p"), ("i", "u"))  # a letter said as another


def letter_ladders(voice_dir: Path, clips: list, avoid: str, seeds: int, pairs: int = 3) -> dict:
    """Does each measure see a letter said as another, across speakers, on this voice? On `clips` (corrections the
    voice says right but for their mistake), for the `pairs` most frequent SWAPS whose letters are not in `avoid`:
    the voice saying each text as it is and with every such letter swapped for the other, each measure on that
    letter's frames (the whole sentence for `sentence`, `phonetic`, `phone_errors`), paired swapped - as is; a
    measure that sees it moves beyond its bound, its gap well above the retest noise."""
    from bench.bench_corrections import paired
    from finetune.feedback.focus import Focus
    from finetune.feedback.round_evaluator import retest_noise

    joined = " ".join(text.lower() for _, text, _ in clips)
    usable = [(a, b) for a, b in SWAPS if a not in avoid and b not in avoid]
    chosen = sorted(usable, key=lambda pair: -joined.count(pair[0]))[:pairs]
    found, references = {}, {}
    for right, wrong in chosen:
        focus = Focus(letters=(right,))
        swapped = {item: text.lower().replace(right, wrong) for item, text, _ in clips if right in text.lower()}
        subset = [c for c in clips if c[0] in swapped]
        as_is = readings(voice_dir, subset, focus, seeds, references)
        changed = readings(voice_dir, subset, focus, seeds, references, said=swapped)
        found[f"{right}->{wrong}"] = {
            name: {
                **paired(seed_mean(as_is[name]), seed_mean(changed[name])),
                "retest_noise": retest_noise(as_is[name][0], as_is[name][1]) if seeds > 1 else math.nan,
            }
            for name in as_is
            if as_is[name][0]
        }
    return found


def ladder_lines(found: dict) -> list[str]:
    """A line a swap and measure: how far the swapped letter moved each measure, against its bound and noise."""
    out = ["  a letter said as another (the voice before the round, its trained corrections): swapped - as is"]
    for swap, by_measure in found.items():
        for name in [n for n in MEL_NAMES + PHONETIC_NAMES if n in by_measure]:
            r = by_measure[name]
            noise = r["retest_noise"]
            out.append(
                f"  {swap} {name:<14} {r['before']:.3f} -> {r['after']:.3f}  {r['change_db']:+.3f} "
                f"({r['noise_bound_db']:.3f}{', seen' if r['worse_beyond_noise'] else ', NOT seen'}); retest {noise:.3f}"
                + (f"; gap/noise {r['change_db'] / noise:.1f}" if noise and math.isfinite(noise) else "")
            )
    return out


def trained_corrections(corrections: Path, history: Path) -> list[tuple[str, str, Path]]:
    """(id, text, recording) of the corrections a round did not hold out (those it trained on)."""
    from finetune.feedback.corrections import sentence_key

    held = held_sentences(history)
    return [c for c in corrections_of(corrections) if sentence_key(c[1]) not in held]


def lines(found: dict) -> list[str]:
    """The table, a line a measure."""
    if not found.get("clips"):
        return ["  no held-out correction (the round held none out)"]
    out = [f"  on {found['clips']} held-out corrections: measure, before -> after, change (bound), retest noise"]
    for name in [n for n in MEL_NAMES + PHONETIC_NAMES if n in found]:
        r = found[name]
        verdict = "better" if r["improved_beyond_noise"] else "worse" if r["worse_beyond_noise"] else "within noise"
        out.append(
            f"  {name:<14} {r['before']:.3f} -> {r['after']:.3f}  {r['change_db']:+.3f} ({r['noise_bound_db']:.3f}) "
            f"{verdict}; retest {r['retest_noise']:.3f}"
        )
    return out


def main() -> None:
    """Each case's round in a bench_corrections.py work folder, measured again."""
    import argparse
    import json

    from bench import learnt_voice
    from bench.bench_corrections import round_report
    from bench.machine import describe
    from finetune.feedback.focus import Focus

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work_dir", required=True, help="a bench_corrections.py work folder")
    parser.add_argument("--mistakes", nargs="+", default=list(learnt_voice.DEFAULT_MISTAKES))
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument(
        "--ladders",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also each measure on a letter said as another (letter_ladders)",
    )
    parser.add_argument("--pairs", type=int, default=3, help="letter ladders a case (the most frequent swaps)")
    args = parser.parse_args()
    print(f"machine: {describe()}", flush=True)
    work, found = Path(args.work_dir), {}
    before = work / "voice" / "checkpoints" / "best_model"
    for mistake in learnt_voice.parse_mistakes(args.mistakes):
        case = work / f"case_{learnt_voice.safe(mistake.name)}"
        if not (case / "voices" / "rounds" / "round_001" / "feedback_report.json").is_file():
            print(f"{mistake.name}: no round in {case}", flush=True)
            continue
        report = round_report(case)
        after = Path(report["app_dir"] if report["accepted"] else report["candidate_dir"])
        corrections = work / "recordings" / f"corrections_{learnt_voice.safe(mistake.name)}"
        held = held_corrections(corrections, case / "voices" / "history.json")
        focus = Focus(letters=(mistake.right,)) if mistake.kind == "letter" else Focus(words=(mistake.right,))
        found[mistake.name] = compared(before, after, held, focus, max(2, args.seeds))
        print(f"{mistake.name} (round {'accepted' if report['accepted'] else 'rejected'}):", flush=True)
        print("\n".join(lines(found[mistake.name])), flush=True)
        if args.ladders:
            trained = trained_corrections(corrections, case / "voices" / "history.json")
            ladders = letter_ladders(before, trained, mistake.right + mistake.said, max(2, args.seeds), args.pairs)
            found[mistake.name]["letter_ladders"] = ladders
            print("\n".join(ladder_lines(ladders)), flush=True)
    (work / "deciding_measures.json").write_text(json.dumps(found, indent=2, ensure_ascii=False), encoding="utf-8")


if __name__ == "__main__":
    main()
