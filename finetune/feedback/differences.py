"""Which words the voice says differently from a recording of the same sentence by someone else: what a round's
report shows for each correction, before and after.

The voice speaks the sentence (its own durations say which frames are which token); the recording is compared
as another speaker's (finetune/reporting/measures.py: normalised cepstra at the frequency warp that fits the
sentence best), aligned frame by frame with DTW. Each synthesised frame's distance to the recording's frames
aligned to it, averaged over a word's frames, is that word's distance; a word is said differently when its
distance is at least DIFFERENT times the sentence's median word distance (the timbre and the channel that remain
across speakers raise every word alike; a word read otherwise stands out of its sentence).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from finetune.reporting.measures import focus_over_sentence

DIFFERENT = 1.5  # a word this many times the sentence's median word distance is said differently


@dataclass(frozen=True)
class Reading:
    """The voice saying one correction, against its recording: each synthesised frame's distance to the recording,
    and the frames each token got."""

    per_frame: np.ndarray  # [frames] dB
    token_frames: np.ndarray  # [tokens]


@dataclass(frozen=True)
class WordDistance:
    word: str
    distance_db: float  # mean over its synthesised frames
    relative: float  # over the sentence's median word distance


def word_spans(token_ids: np.ndarray, decoder: dict[int, str]) -> list[tuple[str, int, int]]:
    """(word, first token, last token + 1) for each word of a tokenised sentence (blanks between characters)."""
    chars = [decoder.get(int(t), "") for t in token_ids]
    positions = [i for i, c in enumerate(chars) if c and c != "<pad>"]
    text = "".join(chars[i] for i in positions)
    return [
        (match.group(0), positions[match.start()], positions[match.end() - 1] + 1)
        for match in re.finditer(r"\w+(?:['’-]\w+)*", text)
    ]


def word_distances(
    per_frame: np.ndarray, token_frames: np.ndarray, token_ids: np.ndarray, decoder: dict[int, str]
) -> list[WordDistance]:
    """Each word's mean frame distance, and that over the sentence's median (`token_frames`: frames a token)."""
    ends = np.cumsum(token_frames)
    starts = ends - token_frames
    found = []
    for word, first, last in word_spans(token_ids, decoder):
        frames = per_frame[int(starts[first]) : int(ends[last - 1])]
        if len(frames):
            found.append((word, float(frames.mean())))
    if not found:
        return []
    median = float(np.median([d for _, d in found])) or 1e-9
    return [WordDistance(word, distance, distance / median) for word, distance in found]


def relative_distance(per_frame: np.ndarray, token_frames: np.ndarray, mask: np.ndarray) -> float:
    """The mean frame distance on the tokens `mask` marks, over the sentence's median frame distance (nan when it
    marks no rendered frame): how differently from the recording the voice says them, against the rest."""
    return focus_over_sentence(per_frame, np.repeat(np.asarray(mask, dtype=bool), token_frames))


def said_differently(distances: list[WordDistance], factor: float = DIFFERENT) -> list[WordDistance]:
    return [d for d in distances if d.relative >= factor]


def describe(words: list[WordDistance]) -> str:
    return ", ".join(f"{d.word!r} (x{d.relative:.1f})" for d in words) or "nothing"
