"""Which clips a prepared corpus holds out (metadata_val.csv): a share of each voice's clips, at least a floor that
can tell two models apart, chosen by the hash of each clip's id (stable across runs, whatever the source's order).
"""

from __future__ import annotations

import hashlib

MIN_SPEAKER_CLIPS = 10  # a speaker with fewer gives none to the held-out split of a multi-speaker corpus
# Clips held out of a voice at least, where it has 10 times as many: the standard error of a mean MCD over n
# clips is their spread / sqrt(n), and models a few percent apart need n in the tens to be told apart
# (finetune/training/selection.py). A smaller corpus gives a tenth of its clips, and is warned.
HELD_OUT_FLOOR = 16


def held_out_count(clips: int, fraction: float) -> int:
    """How many of a voice's `clips` to hold out: `fraction` of them, at least 1 and at least
    min(HELD_OUT_FLOOR, a tenth); 0 when fraction is 0. A floor in clips, not only a fraction: 2% of 121
    clips is 2, which cannot decide between two models."""
    if fraction <= 0 or clips < 2:
        return 0
    return min(clips - 1, max(1, round(fraction * clips), min(HELD_OUT_FLOOR, clips // 10)))


def split_validation(ids: list[str], fraction: float) -> set[str]:
    """Held-out ids: held_out_count of them, those whose hashes come first. Hash order makes the choice
    stable across runs and independent of source order."""
    return set(hash_ranked(ids)[: held_out_count(len(ids), fraction)])


def hash_ranked(ids: list[str]) -> list[str]:
    return sorted(ids, key=lambda i: hashlib.blake2b(i.encode(), digest_size=8).hexdigest())


def split_by_speaker(kept: dict, fraction: float) -> set[str]:
    """Held-out ids of a corpus (`kept`: each clip by id, with its `speaker`): one speaker's as split_validation;
    with several, each speaker's own share (every voice a run may be asked to speak in has held-out clips of it):
    held_out_count of each speaker with at least MIN_SPEAKER_CLIPS clips."""
    by_speaker: dict[str, list[str]] = {}
    for item_id, clip in kept.items():
        by_speaker.setdefault(clip.speaker, []).append(item_id)
    if len(by_speaker) < 2:
        return split_validation(sorted(kept), fraction)
    held = set()
    for ids in by_speaker.values():
        if len(ids) >= MIN_SPEAKER_CLIPS:
            held.update(hash_ranked(ids)[: held_out_count(len(ids), fraction)])
    return held
