"""What the voice says unlike most readers, found from the corpus's own recordings (train_feedback.py --find).

The voice speaks the sentences of clips it did not train on; each is compared with its recording frame by frame
(differences.py: the recording taken as another speaker's, DTW over normalised cepstra at the warp that fits,
each synthesised frame's distance to the frames aligned with it). The voice's own durations say which frames
say which letter, so each letter and word of a sentence gets a figure: the log of its frames' mean distance over
the sentence's median (the reader's timbre and channel raise every frame alike and fall out).

A letter can stand out of its sentence for reasons that are no mistake, so each unit is set against two
references. The voice's own reader (clips held out of its training), whose way of saying each letter the voice
learnt: what the voice renders badly on any sentence stands out there too. And the crowd's readers against each
other, on the same sentences (crowd.between_readers): a unit any two people say apart (a short word whose reading
follows the reader's pace, a sound that differs between any two voices) stands out there too. Per letter or word,
Welch's t (as the normal z of the same one-sided chance: a few clips weigh less) three times: the crowd's figures
one a sentence (the mean over its readers) against the own reader's, one a reader (the mean over their sentences)
against the own reader's (one reader's accent is one figure among theirs), and one a sentence against the
readers' figures between them; the smallest z is the unit's. A unit is reported beyond the noise when it passes
the one-sided bound of FALSE_ALARM spread over every unit tested (Bonferroni: half over the letters, half over
the words). A unit without MIN_OWN of the own reader's clips is not judged; one without MIN_SENTENCES sentences
read by two of the crowd is judged against the own reader alone (`across_readers` false: a corpus whose readers
each read their own sentences, as the demo's, has nothing to compare them by). What this finds is what the voice
says as its reader does and unlike most people: what it learnt from its data. A mistake the voice makes on its own
reader's sentences too cancels out here.

Statistics on distances alone (numpy, scipy's t): the renders and the recordings are finetune/feedback/crowd.py's.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from statistics import NormalDist

import numpy as np

from finetune.feedback.differences import word_spans
from finetune.reporting.measures import focus_frames

LETTER, WORD = "letter", "word"
FALSE_ALARM = 0.05  # the chance, with nothing to find, that any unit is reported (spread over all units tested)
MIN_SENTENCES = 3  # a unit judged on fewer of the crowd's sentences is not judged
MIN_READERS = 3  # and readers: one figure a reader is the second z
MIN_OWN = 3  # and of the own reader's clips: a unit it never read has nothing to be set against
SPREAD_FLOOR = 0.05  # a figure's spread is taken as at least this (log units): a few equal figures are not certainty


@dataclass(frozen=True)
class Heard:
    """The voice saying one clip's sentence, compared with that clip: each letter's and word's log relative
    distance (the mean over its occurrences in the sentence)."""

    clip: str
    reader: str
    sentence: str
    own: bool  # the recording is by the voice's own reader
    units: dict[tuple[str, str], float]  # (LETTER or WORD, the unit) -> log(distance / the sentence's median)
    between: bool = False  # two of the crowd's readers compared with each other (crowd.between_readers), not the voice


def units_heard(per_frame: np.ndarray, token_frames: np.ndarray, token_ids, decoder: dict[int, str]) -> dict:
    """Each letter's and word's log relative distance in one comparison (`per_frame`: each synthesised frame's
    distance to the recording; `token_frames`: the frames the voice gave each token)."""
    median = max(float(np.median(per_frame)), 1e-9)
    frames, found = len(per_frame), defaultdict(list)
    chars = [decoder.get(int(t), "") for t in token_ids]
    for index, char in enumerate(chars):
        if len(char) == 1 and char.isalpha():
            mask = focus_frames(np.arange(len(chars)) == index, token_frames, frames)
            if mask is not None:
                found[(LETTER, char.lower())].append(float(per_frame[mask].mean()))
    ends = np.cumsum(token_frames)
    for word, first, last in word_spans(np.asarray(token_ids), decoder):
        span = per_frame[int(ends[first] - token_frames[first]) : int(ends[last - 1])]
        if len(span):
            found[(WORD, word.lower())].append(float(span.mean()))
    return {unit: float(np.log(max(np.mean(values), 1e-9) / median)) for unit, values in found.items()}


@dataclass
class Finding:
    kind: str  # LETTER or WORD
    unit: str
    z: float  # the crowd's figures above the references', in standard errors (the smallest of the three)
    ratio: float  # how many times further from the crowd than from the own reader (geometric means)
    sentences: int  # the crowd's sentences that hold it
    readers: int  # the crowd's readers who read it
    readers_further: int  # of them, those the voice says it further from than from its own reader
    own_clips: int  # the own reader's clips it was judged against
    across_readers: bool  # also against the crowd's readers between them (MIN_SENTENCES read by two of them)
    beyond_noise: bool = False
    clips: list[str] = field(default_factory=list)  # the crowd's clips that hold it, furthest first

    def to_dict(self) -> dict:
        return {
            "kind": self.kind,
            "unit": self.unit,
            "z": round(self.z, 2),
            "ratio": round(self.ratio, 3),
            "sentences": self.sentences,
            "readers": self.readers,
            "readers_further": self.readers_further,
            "own_clips": self.own_clips,
            "across_readers": self.across_readers,
            "beyond_noise": self.beyond_noise,
            "clips": self.clips[:5],
        }


def welch_z(crowd: list[float], own: list[float]) -> float:
    """How far the crowd's mean lies above the own reader's: Welch's t (spreads floored), as the normal z of the same
    one-sided chance (a t on a few of the own reader's clips is worth less than on many: its degrees of freedom)."""
    from scipy.stats import norm, t

    spread = lambda values: max(float(np.std(values, ddof=1)) if len(values) > 1 else 0.0, SPREAD_FLOOR)  # noqa: E731
    parts = [spread(crowd) ** 2 / len(crowd), spread(own) ** 2 / len(own)]
    statistic = (np.mean(crowd) - np.mean(own)) / np.sqrt(sum(parts))
    freedom = sum(parts) ** 2 / (parts[0] ** 2 / max(1, len(crowd) - 1) + parts[1] ** 2 / max(1, len(own) - 1))
    return float(norm.isf(t.sf(statistic, freedom)))


def bound_z(tested: int, false_alarm: float = FALSE_ALARM) -> float:
    """The one-sided z a unit must pass for `false_alarm` to hold over `tested` units (Bonferroni)."""
    return NormalDist().inv_cdf(1.0 - false_alarm / max(1, tested))


def rank(heard: list[Heard], false_alarm: float = FALSE_ALARM) -> list[Finding]:
    """Every letter and word read in enough of the crowd's sentences (MIN_SENTENCES, by MIN_READERS) and of the own
    reader's clips (MIN_OWN), by how far the voice says it from the crowd against its own reader, furthest first;
    those beyond the noise marked (see the module docstring)."""
    crowd: dict[tuple, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))  # unit -> sentence -> figures
    by_reader: dict[tuple, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    clips: dict[tuple, list[tuple[float, str]]] = defaultdict(list)
    own: dict[tuple, list[float]] = defaultdict(list)
    between: dict[tuple, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for h in heard:
        for unit, value in h.units.items():
            if h.between:
                between[unit][h.sentence].append(value)
            elif h.own:
                own[unit].append(value)
            else:
                crowd[unit][h.sentence].append(value)
                by_reader[unit][h.reader].append(value)
                clips[unit].append((value, h.clip))
    findings = []
    for unit, sentences in crowd.items():
        readers = by_reader[unit]
        if len(sentences) < MIN_SENTENCES or len(readers) < MIN_READERS:
            continue
        against = own[unit]
        apart = [float(np.mean(values)) for values in between[unit].values()]
        if len(against) < MIN_OWN:  # against a typical letter, a letter harder for any two people would stand out
            continue
        per_sentence = [float(np.mean(values)) for values in sentences.values()]
        per_reader = [float(np.mean(values)) for values in readers.values()]
        baseline = float(np.mean(against))
        further = sum(value > baseline for value in per_reader)
        findings.append(
            Finding(
                unit[0],
                unit[1],
                min(
                    welch_z(per_sentence, against),
                    welch_z(per_reader, against),
                    *([welch_z(per_sentence, apart)] if len(apart) >= MIN_SENTENCES else []),
                ),
                float(np.exp(np.mean(per_sentence) - baseline)),
                len(sentences),
                len(readers),
                int(further),
                len(against),
                len(apart) >= MIN_SENTENCES,
                clips=[clip for _, clip in sorted(clips[unit], reverse=True)],
            )
        )
    for kind in (LETTER, WORD):
        of_kind = [f for f in findings if f.kind == kind]
        bound = bound_z(len(of_kind), false_alarm / 2)  # half of the chance to the letters, half to the words
        for f in of_kind:
            f.beyond_noise = f.z > bound
    return sorted(findings, key=lambda f: (not f.beyond_noise, -f.z))
