"""How close synthesised speech is to a recording of the same text: spectral distance and timing.
Pure functions of arrays, tested alone.

Spectral distance is mel-cepstral distortion after dynamic time warping (MCD-DTW, in dB, lower is
better): log-mel spectrograms of both -> real cepstrum of the log-mel amplitude (DCT-II / 2M over the M
mel bands, the convention the usual MCD constant assumes) -> coefficients 0..24 -> DTW alignment on
Euclidean distance -> (10 / ln 10) * sqrt(2 * sum_k (c_k - c'_k)^2) per aligned pair -> for each frame of
the recording, the mean over the synthesised frames aligned to it -> the mean over the recording's frames.

Each recording frame counts once. Averaging over the DTW path instead lets a long degenerate output
dilute its own error: a collapsed model that spoke 8.7 times too long, a constant signal, scored 7.1 dB
that way (better than any trained model) and 31.5 dB this way (bench/RESULTS.md). c0 (the frame's
energy) is kept, unlike the common c1..c24 variant: without it, a flat spectrum (silence or loud noise,
what an untrained model makes) has near-zero coefficients and scores better than speech with errors.

Across speakers (a correction recorded by someone else, judged in the voice's own speaking of it), the
distance must not reward the voice for sounding like that someone: plain MCD-DTW did (a voice moved half
way toward a corrector's lower, slower recording scored 2.1 dB nearer it; bench/RESULTS.md). So the
recording is compared as another speaker's (`mcd_across_speakers`): each cepstral coefficient's mean over
the utterance is taken out of both (the recording channel and the static part of the timbre), and the
recording is compared at the frequency warp, among WARPS (resampled: formants and pitch scaled together,
as a larger or smaller vocal tract), that matches the synthesised speech best. What is left is what was
said and how: the same voice moved toward the corrector scores no better (1.8 dB worse in the test
above), another sentence scores far worse (7.6 dB against 0.1).

DTW forgives timing by design: a voice speaking at 0.55x the recording's length scored about the same as
one at 0.95x (bench/RESULTS.md). So timing is measured apart, and judged by its own rule:

    length ratio     frames the model asks for / frames of the recording (1 = the recorded tempo; taken
                     before any synthesis cap, so a runaway duration predictor shows in full)
    duration error   sum over tokens of |predicted frames - aligned frames| / the recording's frames:
                     the share of the recording's frames the predicted rhythm puts under another token
                     (0 = the rhythm of the alignment; the alignment is the model's own monotonic
                     alignment search between the recording and the text)
    timing rule      a model whose median length ratio over the held-out clips lies outside
                     [1 / max_length_ratio, max_length_ratio] (default [0.8, 1.25]) has drifted: it is
                     never preferred to one inside, however good its MCD (and kept only while none is
                     inside, as the nearest: finetune/training/selection.py)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from finetune.data.held_out import HELD_OUT_FLOOR

MCD_SCALE = 10.0 / math.log(10.0) * math.sqrt(2.0)
DEFAULT_MAX_LENGTH_RATIO = 1.25


def mel_cepstrum(log_mel: np.ndarray, coefficients: int = 24) -> np.ndarray:
    """[n_mels, frames] natural-log mel amplitude -> real cepstrum c_0..c_coefficients [., frames]:
    c_k = (1 / M) sum_m log_mel[m] cos(pi k (m + 1/2) / M), i.e. scipy's unnormalised DCT-II / (2M)."""
    from scipy.fft import dct

    return dct(log_mel, type=2, axis=0)[: coefficients + 1] / (2 * log_mel.shape[0])


def mcd_dtw(log_mel_synthesised: np.ndarray, log_mel_real: np.ndarray, coefficients: int = 24) -> float:
    """Mel-cepstral distortion in dB between two log-mels [n_mels, frames] after DTW alignment,
    averaged over the frames of the real recording (see the module docstring). NaN when the
    synthesised audio is not finite."""
    if not np.isfinite(log_mel_synthesised).all():
        return float("nan")
    return cepstral_distance(mel_cepstrum(log_mel_synthesised, coefficients), mel_cepstrum(log_mel_real, coefficients))


def cepstral_distance(a: np.ndarray, b: np.ndarray, focus: np.ndarray | None = None) -> float:
    """MCD-DTW in dB between cepstra a [coefficients, frames] (synthesised) and b (the recording), averaged
    over b's frames; with `focus` (a bool per frame of a), over the path's pairs on those frames alone."""
    import librosa

    _, path = librosa.sequence.dtw(X=a, Y=b, metric="euclidean")  # path: [pairs, 2] (synthesised, real)
    distances = np.linalg.norm(a[:, path[:, 0]] - b[:, path[:, 1]], axis=0)
    if focus is not None:
        return float(MCD_SCALE * distances[focus[path[:, 0]]].mean())
    per_real = np.zeros(b.shape[1])
    pairs = np.zeros(b.shape[1])
    np.add.at(per_real, path[:, 1], distances)
    np.add.at(pairs, path[:, 1], 1.0)
    return float(MCD_SCALE * (per_real / pairs).mean())


WARPS = tuple(1.06**k for k in range(-7, 8))  # 0.67 .. 1.50 in steps of 6%: the vocal-tract scalings tried


def normalised_cepstrum(log_mel: np.ndarray, coefficients: int = 24) -> np.ndarray:
    """[n_mels, frames] -> cepstra [coefficients + 1, frames] with each coefficient's mean over the frames
    taken out (cepstral mean normalisation: the channel and the static part of the timbre)."""
    cepstra = mel_cepstrum(log_mel, coefficients)
    return cepstra - cepstra.mean(axis=1, keepdims=True)


def warped_references(
    audio: np.ndarray, sample_rate: int, log_mel, warps: tuple[float, ...] = WARPS
) -> list[np.ndarray]:
    """A recording [samples] as another speaker's: its normalised cepstra at each warp (the audio resampled
    to play `warp` times longer, which scales its formants and pitch by 1 / warp). `log_mel(audio)` gives
    [n_mels, frames]."""
    import soxr

    return [
        normalised_cepstrum(log_mel(audio if warp == 1.0 else soxr.resample(audio, sample_rate, sample_rate * warp)))
        for warp in warps
    ]


def mcd_across_speakers(
    log_mel_synthesised: np.ndarray, references: list[np.ndarray], focus: np.ndarray | None = None
) -> float:
    """MCD-DTW in dB between synthesised speech and a recording by another speaker (`warped_references`):
    normalised cepstra, at the warp that fits best (see the module docstring). With `focus` (a bool per
    synthesised frame, some true), the distance on those frames alone, at the warp the whole sentence fits
    best. NaN when the synthesised audio is not finite."""
    if not np.isfinite(log_mel_synthesised).all():
        return float("nan")
    synthesised = normalised_cepstrum(log_mel_synthesised)
    distances = [cepstral_distance(synthesised, reference) for reference in references]
    if focus is None:
        return min(distances)
    return cepstral_distance(synthesised, references[int(np.argmin(distances))], focus)


def frame_distances(synthesised_log_mel: np.ndarray, references: list[np.ndarray]) -> np.ndarray:
    """[frames] of the synthesised speech: each frame's cepstral distance (dB) to the recording's frames the DTW
    path pairs it with (`warped_references`), at the warp whose path costs least over the whole sentence."""
    return aligned_frames(synthesised_log_mel, references)[0]


def aligned_frames(synthesised_log_mel: np.ndarray, references: list[np.ndarray]) -> tuple:
    """frame_distances, with where they were found: (per-frame distances, for each synthesised frame the first
    recording frame the path pairs it with, the recording's normalised cepstra at the warp that fits best)."""
    import librosa

    synthesised = normalised_cepstrum(synthesised_log_mel)
    best = None
    for reference in references:
        cost, path = librosa.sequence.dtw(X=synthesised, Y=reference, metric="euclidean")
        if best is None or cost[-1, -1] < best[0]:
            best = (cost[-1, -1], path, reference)
    _, path, reference = best
    distances = MCD_SCALE * np.linalg.norm(synthesised[:, path[:, 0]] - reference[:, path[:, 1]], axis=0)
    per_frame, pairs = np.zeros(synthesised.shape[1]), np.zeros(synthesised.shape[1])
    np.add.at(per_frame, path[:, 0], distances)
    np.add.at(pairs, path[:, 0], 1.0)
    paired = np.zeros(synthesised.shape[1], dtype=int)
    paired[path[:, 0]] = path[:, 1]  # librosa's path runs from the end: the last write is each frame's first pair
    return per_frame / np.maximum(pairs, 1.0), paired, reference


def focus_over_sentence(per_frame: np.ndarray, spoken: np.ndarray) -> float:
    """The mean of `per_frame` distances on the frames `spoken` marks (a bool per frame) over the sentence's median
    frame distance; nan when it marks none. How much further from the recording the voice is where it says what
    a round corrects than in the rest of the sentence: the timbre and channel left across speakers raise every
    frame alike and fall out, and so does a synthesis draw that is a little off everywhere."""
    spoken = np.asarray(spoken, dtype=bool)[: len(per_frame)]
    if not spoken.any():
        return float("nan")
    return float(per_frame[spoken].mean() / max(float(np.median(per_frame)), 1e-9))


def focus_frames(token_mask: np.ndarray, token_frames: np.ndarray, frames: int, widen: int = 2):
    """Which of `frames` synthesised frames speak the tokens `token_mask` marks ([tokens] bool; each token's
    rendered frames, widened by `widen` on both sides); None when it marks none that was rendered."""
    spoken = np.repeat(np.asarray(token_mask, dtype=bool), token_frames)
    if not spoken.any():
        return None
    mask = np.zeros(frames, dtype=bool)
    for index in np.flatnonzero(spoken):
        mask[max(0, index - widen) : min(frames, index + widen + 1)] = True
    return mask if mask.any() else None


def length_ratio(requested_frames: float, recording_frames: int) -> float:
    """Frames the model asked for over the recording's frames (inf for a runaway predictor)."""
    return float(requested_frames) / max(1, recording_frames)


def duration_error(predicted: np.ndarray, aligned: np.ndarray) -> float:
    """Frames per token [tokens] as predicted and as aligned -> share of the recording's frames
    misplaced (see the module docstring)."""
    predicted, aligned = np.asarray(predicted, dtype=np.float64), np.asarray(aligned, dtype=np.float64)
    return float(np.abs(predicted - aligned).sum() / max(1.0, aligned.sum()))


@dataclass(frozen=True)
class TimingRule:
    """Which models speak at the recordings' tempo closely enough to be kept as the best."""

    max_length_ratio: float = DEFAULT_MAX_LENGTH_RATIO  # median ratio must lie in [1 / this, this]

    def __post_init__(self):
        if self.max_length_ratio < 1.0:
            raise ValueError(f"max_length_ratio {self.max_length_ratio}: must be 1 or more (1.25 allows 0.8-1.25)")

    def accepts(self, median_length_ratio: float) -> bool:
        return 1.0 / self.max_length_ratio <= median_length_ratio <= self.max_length_ratio

    def describe(self) -> str:
        return f"{1.0 / self.max_length_ratio:.2f}-{self.max_length_ratio:.2f}"


# Held-out clips below which evaluations cannot tell close models apart: the floor preparation holds out.
MIN_DECIDING_CLIPS = HELD_OUT_FLOOR


def few_held_out(clips: int, fix: str, whose: str = "") -> str | None:
    """The warning for evaluations on `clips` held-out clips (`whose`: " of SPEAKER"), naming what fixes it;
    None when enough."""
    if clips >= MIN_DECIDING_CLIPS:
        return None
    return (
        f"warning: {clips} held-out clip{'s' if clips != 1 else ''}{whose} judge every evaluation: too few to tell "
        f"close models apart (each evaluation reports its MCD's standard error, ±); {fix} "
        f"(at least {MIN_DECIDING_CLIPS})"
    )
