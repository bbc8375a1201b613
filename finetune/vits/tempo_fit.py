"""The inference settings an exported voice carries, fitted to its recordings: the tempo a listener hears.

The stock pipeline (`pipeline("text-to-speech")`, `VitsModel.forward`) reads three settings from
config.json, and an app makes one draw a sentence with them:

    speaking_rate          every duration is scaled by 1 / rate: the pace, evenly
    noise_scale_duration   the stochastic duration predictor's noise: how much a sentence's length varies
                           from one request to the next (and, after a short training, its typical length)
    noise_scale            the prior's noise: variation of timbre and intonation, not of length (kept)

A voice fine-tuned for a few hours often speaks its recordings' sentences a little fast or slow at the
model's own settings, and a sentence's length can vary several-fold between requests (one draw of the
duration predictor is a sum of exponentials, skewed long). `fit_tempo` sets the first two from held-out
recordings, using only the duration predictor (no flow, no decoder: a small share of one synthesis; the
texts encoded once and each grid drawn in one pass, inference.DurationSampler):

    1. for each noise_scale_duration of NOISE_SCALE_GRID (the model's own among them), `draws` draws of
       every clip at speaking_rate 1: the clips' median draw spread (geometric_spread)
    2. the largest noise_scale_duration whose spread is at most `max_spread` (the most variation that
       still keeps one request's tempo near the next's); if none is, the one with the smallest spread
    3. speaking_rate = the median single-draw length ratio there, so that the typical draw is as long as
       the recordings; refined on fresh draws (durations are rounded up a token at a time, so the
       length is not exactly proportional to 1 / rate), within [MIN_RATE, MAX_RATE]

The "after" figures are measured on clips the settings were not fitted on (measured on the clips they
were fitted on, the length would be x1.00 by construction): the clips are split in two halves, each
half's settings fitted on the other half, and each half measured at them (two-fold cross-fitting). With
fewer than 2 * MIN_FIT_CLIPS clips nothing can be held out: the figures are then in-sample, and say so.

Piper's users set the same three numbers by hand in each voice's JSON; finetune-hf-vits and Coqui leave
the model's own. Shapes: token ids [tokens] per clip; draws [clips, draws].
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch

NOISE_SCALE_GRID = (0.8, 0.667, 0.5, 0.333, 0.2)  # MMS's default first, then narrower draws
MAX_DRAW_SPREAD = 1.15  # a draw typically within 15% of its sentence's median length
MIN_RATE, MAX_RATE = 0.5, 2.0  # beyond these the voice is broken, not slow or fast: said, not hidden
REFINEMENTS = 2
MIN_FIT_CLIPS = 2  # each half of the cross-fitting fits on at least this many clips


@dataclass
class TempoFigures:
    length_ratio: float  # median single-draw length / the recording's (1 = the recordings' tempo)
    draw_spread: float  # median over clips of the geometric standard deviation between draws


@dataclass
class TempoFit:
    """Fitted settings with the figures before (the model's own settings) and after, on `clips` clips."""

    speaking_rate: float
    noise_scale_duration: float
    noise_scale: float
    before: TempoFigures
    after: TempoFigures  # at the fitted settings, on clips they were not fitted on (unless after_in_sample)
    clips: int
    own: dict  # the model's own settings, as they were
    note: str = ""  # a limit that was hit ("" when none)
    after_in_sample: bool = False  # too few clips to hold some out: `after` is on the clips fitted on

    def config_values(self) -> dict[str, float]:
        """What config.json gets."""
        return {
            "speaking_rate": round(self.speaking_rate, 4),
            "noise_scale_duration": round(self.noise_scale_duration, 4),
            "noise_scale": round(self.noise_scale, 4),
        }

    def to_dict(self) -> dict:
        return {
            **self.config_values(),
            "before": asdict(self.before),
            "after": asdict(self.after),
            "clips": self.clips,
            "after_measured_on": self.after_measured_on,
            "model_own": self.own,
            **({"note": self.note} if self.note else {}),
        }

    @property
    def after_measured_on(self) -> str:
        return (
            "the clips it was fitted on (too few to hold some out)"
            if self.after_in_sample
            else "clips it was not fitted on (two-fold cross-fitting)"
        )

    def describe(self) -> str:
        """One line: what was set and what it changed."""
        return (
            f"speaking_rate {self.speaking_rate:.3f}, noise_scale_duration {self.noise_scale_duration:.3f} (the "
            f"model's own: {self.own['speaking_rate']:g}, {self.own['noise_scale_duration']:g}) on {self.clips} held-out "
            f"clips: typical length x{self.before.length_ratio:.2f} -> x{self.after.length_ratio:.2f} the recordings', "
            f"spread between draws x{self.before.draw_spread:.2f} -> x{self.after.draw_spread:.2f} (after: on "
            f"{self.after_measured_on})" + (f"; {self.note}" if self.note else "")
        )


def geometric_spread(ratios) -> float:
    """A clip's length ratios over draws -> their geometric standard deviation, exp(std(log ratio)): x1.2
    means a draw is typically 20% longer or shorter than the others (1 with fewer than 2 draws; inf when
    a draw is not finite or not positive)."""
    ratios = np.asarray(ratios, dtype=np.float64)
    if len(ratios) < 2:
        return 1.0
    if not (np.isfinite(ratios).all() and (ratios > 0).all()):
        return float("inf")
    return float(np.exp(np.std(np.log(ratios), ddof=1)))


def figures(draws: np.ndarray, recorded_frames: np.ndarray) -> TempoFigures:
    """Frames asked for [clips, draws] and the recordings' frames [clips] -> the typical draw and spread."""
    ratios = draws / np.maximum(1, recorded_frames)[:, None]
    finite = ratios[np.isfinite(ratios)]
    ratio = float(np.median(finite)) if finite.size else float("inf")
    return TempoFigures(length_ratio=ratio, draw_spread=float(np.median([geometric_spread(r) for r in ratios])))


def fit_tempo(
    model,
    token_ids: list[np.ndarray],
    recorded_frames: list[int],
    device: torch.device,
    seed: int,
    speaker: int | None = None,
    draws: int = 8,
    max_spread: float = MAX_DRAW_SPREAD,
) -> TempoFit | None:
    """The fitted settings for `model` (eval mode) from held-out clips, with the figures after them measured
    out of sample (see the module docstring); None without clips. Seeded, in a forked RNG: the caller's
    random state is left as it was."""
    from finetune.vits.inference import DurationSampler

    if not token_ids:
        return None
    frames = np.asarray(recorded_frames, dtype=np.float64)
    own = {
        "speaking_rate": float(model.speaking_rate),
        "noise_scale_duration": float(model.noise_scale_duration),
        "noise_scale": float(model.noise_scale),
    }
    sampler = DurationSampler(model, token_ids, device, draws, speaker=speaker)  # the texts encoded once

    def measure(clips: list[int], noises: list[float], rate: float, offset: int) -> list[np.ndarray]:
        """Frames asked for [clips, draws] at each noise_scale_duration of `noises` and this rate."""
        return list(sampler.frames(clips, noises, rate, seed + offset))

    everything = list(range(len(token_ids)))
    before = figures(measure(everything, [own["noise_scale_duration"]], own["speaking_rate"], 0)[0], frames)
    fitted = settings_for(
        everything, frames, measure, own, bool(model.config.use_stochastic_duration_prediction), max_spread
    )
    if fitted is None:
        note = "the predicted lengths are not finite: the model's own settings are kept"
        return TempoFit(
            own["speaking_rate"],
            own["noise_scale_duration"],
            own["noise_scale"],
            before,
            before,
            len(token_ids),
            own,
            note,
            after_in_sample=True,
        )
    rate, noise, note, in_sample_after = fitted
    halves = [everything[0::2], everything[1::2]]
    if min(len(half) for half in halves) < MIN_FIT_CLIPS:
        return TempoFit(
            rate, noise, own["noise_scale"], before, in_sample_after, len(token_ids), own, note, after_in_sample=True
        )
    held_out = np.full((len(token_ids), 1 if not model.config.use_stochastic_duration_prediction else draws), np.nan)
    for half, other in ((halves[0], halves[1]), (halves[1], halves[0])):
        other_fit = settings_for(
            other, frames, measure, own, bool(model.config.use_stochastic_duration_prediction), max_spread
        )
        half_rate, half_noise = (other_fit[0], other_fit[1]) if other_fit else (rate, noise)
        held_out[half] = measure(half, [half_noise], half_rate, 10)[0]
    return TempoFit(rate, noise, own["noise_scale"], before, figures(held_out, frames), len(token_ids), own, note)


def settings_for(
    clips: list[int], frames: np.ndarray, measure, own: dict, stochastic: bool, max_spread: float
) -> tuple[float, float, str, TempoFigures] | None:
    """Steps 1-3 of the module docstring on `clips`: (speaking_rate, noise_scale_duration, a note on a
    limit hit, the figures at them on these same clips); None when the lengths are not finite."""
    mine = frames[clips]
    grid = (
        sorted({*NOISE_SCALE_GRID, own["noise_scale_duration"]}, reverse=True)
        if stochastic
        else [own["noise_scale_duration"]]
    )  # a deterministic predictor: its noise setting does nothing
    at_rate_one = {noise: figures(draws, mine) for noise, draws in zip(grid, measure(clips, grid, 1.0, 1))}
    steady = [noise for noise in grid if at_rate_one[noise].draw_spread <= max_spread]
    noise = steady[0] if steady else min(grid, key=lambda n: at_rate_one[n].draw_spread)
    rate, after, note = 1.0, at_rate_one[noise], ""
    for refinement in range(REFINEMENTS + 1):
        if not np.isfinite(after.length_ratio) or after.length_ratio <= 0:
            return None
        if refinement == REFINEMENTS:
            break
        rate = rate * after.length_ratio
        if not MIN_RATE <= rate <= MAX_RATE:
            note = (
                f"speaking_rate {rate:.2f} would be needed: held at {min(MAX_RATE, max(MIN_RATE, rate)):g} "
                "(a voice this far from its recordings' tempo needs more training, not a setting)"
            )
            rate = min(MAX_RATE, max(MIN_RATE, rate))
        after = figures(measure(clips, [noise], rate, 2 + refinement)[0], mine)
    return rate, noise, note, after
