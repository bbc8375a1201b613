"""What every judge hears a clip as: a float waveform at 16 kHz in [-1, 1] (to_judge_rate), and what a model
computed from a clip remembered by its digest (AudioMemo), so that the same clip judged again is not run through
the model again.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

import numpy as np

JUDGE_RATE = 16_000


def to_judge_rate(waveform: np.ndarray, sample_rate: int) -> np.ndarray:
    audio = np.nan_to_num(np.asarray(waveform, dtype=np.float32))
    if sample_rate != JUDGE_RATE:
        import soxr

        audio = soxr.resample(audio, sample_rate, JUDGE_RATE)
    return np.clip(audio, -1.0, 1.0)


class AudioMemo:
    """What a model computed from a clip, by a digest of the clip: the same audio judged again (the recordings on
    every ladder of bench/bench_judges.py, one clip by the phonetic judge and the phone error rate sharing a
    recogniser) is not run through the model again. The last `size` results are kept; each is read-only."""

    def __init__(self, size: int = 128):
        self.size = size
        self.results: OrderedDict = OrderedDict()

    def get(self, waveform: np.ndarray, sample_rate: int, compute):
        audio = np.ascontiguousarray(waveform, dtype=np.float32)
        key = (hashlib.blake2b(audio.tobytes(), digest_size=16).digest(), audio.shape, sample_rate)
        if key in self.results:
            self.results.move_to_end(key)
            return self.results[key]
        result = compute(waveform, sample_rate)
        if isinstance(result, np.ndarray):
            result.setflags(write=False)
        self.results[key] = result
        if len(self.results) > self.size:
            self.results.popitem(last=False)
        return result
