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
               the voice's own durations): what decides a round with one
    relative   focus over the sentence's median frame: the timbre and channel that stay across speakers raise
               every frame alike, and fall out (hearing.py keeps a focus item from x1.2)

each paired after - before, with its one-sided 95% bound (finetune/reporting/selection.py, as the round's own
decision pairs) and the retest noise between two seeds of the voice before. A measure that decides should move
beyond its bound where the judge heard the fix, and not where it heard none.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

NAMES = ("sentence", "focus", "relative")


def held_corrections(corrections: Path, history: Path) -> list[tuple[str, str, Path]]:
    """(id, text, recording) of the corrections a round held out: their sentences are in the voices folder's
    history.json (finetune/feedback/versions.py), by corrections.sentence_key."""
    import json

    from finetune.feedback.corrections import sentence_key

    held = set(json.loads(history.read_text(encoding="utf-8")).get("held_out", [])) if history.is_file() else set()
    found = []
    for line in (corrections / "metadata.csv").read_text(encoding="utf-8").splitlines():
        item, text = line.split("|", 1)[0], line.split("|")[-1]
        recordings = sorted((corrections / "wavs").glob(f"{item}.*"))
        if sentence_key(text) in held and recordings:
            found.append((item, text, recordings[0]))
    return found


def readings(
    model_dir: Path, clips: list[tuple[str, str, Path]], focus, seeds: int, references: dict
) -> dict[str, list[dict]]:
    """Each measure, a dict clip id -> value per seed. `references`: each recording's warped cepstra by clip id,
    made on first use and kept for the next model's readings."""
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
    mel = lambda a: features.mel(torch.from_numpy(a).float().unsqueeze(0))[0].numpy()  # noqa: E731
    found = {name: [dict() for _ in range(seeds)] for name in NAMES}
    for index, (item, text, recording) in enumerate(clips):
        ids = np.array(tokenizer(text).input_ids)
        mask = focus.token_mask(ids, decoder)
        if item not in references:
            references[item] = measures.warped_references(librosa.load(recording, sr=rate)[0], rate, mel)
        for seed in range(seeds):
            speech = speak(model, [ids], torch.device("cpu"), 10_000 * seed + index, [ceiling_for_text(len(ids))])
            per_frame = differences.frame_distances(mel(speech.waveforms[0]), references[item])
            spoken = np.repeat(mask, speech.token_frames[0])[: len(per_frame)]
            found["sentence"][seed][item] = float(per_frame.mean())
            if spoken.any():
                found["focus"][seed][item] = float(per_frame[spoken].mean())
                found["relative"][seed][item] = differences.relative_distance(per_frame, speech.token_frames[0], mask)
    return found


def compared(before_dir: Path, after_dir: Path, clips: list, focus, seeds: int) -> dict:
    """Each measure on the held-out corrections: after - before (paired over clips, each a mean over seeds), its
    bound, whether beyond it either way, and the retest noise of a clip between the first two seeds before."""
    from bench.bench_corrections import paired
    from finetune.feedback.evaluator import retest_noise

    if not clips:
        return {"clips": 0}
    references = {}
    before = readings(before_dir, clips, focus, seeds, references)
    after = readings(after_dir, clips, focus, seeds, references)
    mean = lambda by_seed: {k: float(np.mean([s[k] for s in by_seed if k in s])) for k in by_seed[0]}  # noqa: E731
    found = {"clips": len(clips)}
    for name in NAMES:
        found[name] = paired(mean(before[name]), mean(after[name]))
        found[name]["retest_noise"] = retest_noise(before[name][0], before[name][1]) if seeds > 1 else math.nan
    return found


def lines(found: dict) -> list[str]:
    """The table, a line a measure."""
    if not found.get("clips"):
        return ["  no held-out correction (the round held none out)"]
    out = [f"  on {found['clips']} held-out corrections: measure, before -> after, change (bound), retest noise"]
    for name in NAMES:
        r = found[name]
        verdict = "better" if r["improved_beyond_noise"] else "worse" if r["worse_beyond_noise"] else "within noise"
        out.append(
            f"  {name:<9} {r['before']:.3f} -> {r['after']:.3f}  {r['change_db']:+.3f} ({r['noise_bound_db']:.3f}) "
            f"{verdict}; retest {r['retest_noise']:.3f}"
        )
    return out
