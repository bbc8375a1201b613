"""Evaluation on held-out clips: synthesise each clip's text and compare it with its recording.

The measure is mel-cepstral distortion after dynamic time warping (MCD-DTW, in dB, lower is better):
log-mel spectrograms of both -> real cepstrum of the log-mel amplitude (DCT-II / 2M over the M mel
bands, the convention the usual MCD constant assumes) -> coefficients 0..24 -> DTW alignment on
Euclidean distance -> (10 / ln 10) * sqrt(2 * sum_k (c_k - c'_k)^2) per aligned pair -> for each frame
of the recording, the mean over the synthesised frames aligned to it -> the mean over the recording's
frames.

Each recording frame counts once. Averaging over the DTW path instead lets a long degenerate output
dilute its own error: a collapsed model that spoke 8.7 times too long, a constant signal, scored
7.1 dB that way (better than any trained model) and 31.5 dB this way (bench/RESULTS.md).

c0 (the frame's energy) is kept, unlike the common c1..c24 variant: without it, a flat spectrum
(silence or loud noise, what an untrained model makes) has near-zero coefficients and scores better
than speech with errors. Measured on the demo corpus (bench/bench_measure.py, bench/RESULTS.md): an
untrained model scored 4.43 dB by c1..c24 against 6.16 dB after 3 minutes of training; by c0..c24 it
is 29.2 dB against 8.7 dB, in training order.
It judges speech synthesised from text, duration predictor included, not just how well the training
loss is minimised. The objective's own losses (mel, KL, duration) on the same clips are reported beside it.

Synthesis is seeded and runs inside a forked RNG, so successive evaluations are comparable and the
training's random state is left exactly as it was (a resumed run then matches an uninterrupted one).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from .audio import write_pcm16
from .data import Example, collate
from .features import Features
from .losses import LossWeights
from .objective import generator_forward, generator_losses, real_segments

LOG = logging.getLogger(__name__)  # a child of the run's "finetune" logger

MCD_SCALE = 10.0 / math.log(10.0) * math.sqrt(2.0)


def mel_cepstrum(log_mel: np.ndarray, coefficients: int = 24) -> np.ndarray:
    """[n_mels, frames] natural-log mel amplitude -> real cepstrum c_0..c_coefficients [., frames]:
    c_k = (1 / M) sum_m log_mel[m] cos(pi k (m + 1/2) / M), i.e. scipy's unnormalised DCT-II / (2M)."""
    from scipy.fft import dct

    return dct(log_mel, type=2, axis=0)[: coefficients + 1] / (2 * log_mel.shape[0])


def mcd_dtw(log_mel_synthesised: np.ndarray, log_mel_real: np.ndarray, coefficients: int = 24) -> float:
    """Mel-cepstral distortion in dB between two log-mels [n_mels, frames] after DTW alignment,
    averaged over the frames of the real recording (see the module docstring)."""
    import librosa

    a, b = mel_cepstrum(log_mel_synthesised, coefficients), mel_cepstrum(log_mel_real, coefficients)
    _, path = librosa.sequence.dtw(X=a, Y=b, metric="euclidean")  # path: [pairs, 2] (synthesised, real)
    distances = np.linalg.norm(a[:, path[:, 0]] - b[:, path[:, 1]], axis=0)
    per_real = np.zeros(b.shape[1])
    pairs = np.zeros(b.shape[1])
    np.add.at(per_real, path[:, 1], distances)
    np.add.at(pairs, path[:, 1], 1.0)
    return float(MCD_SCALE * (per_real / pairs).mean())


@dataclass
class EvalResult:
    step: int
    mcd_db: float  # mean over held-out clips; lower is better
    per_clip: dict[str, float]
    val_losses: dict[str, float]
    seconds: float
    samples: list[str] = field(default_factory=list)  # WAV files written
    extra: dict[str, float] = field(default_factory=dict)  # further named scores (feedback rounds)

    def summary(self) -> dict:
        return {"step": self.step, "mcd_db": round(self.mcd_db, 4), "seconds": round(self.seconds, 2),
                **{f"val_{k}": round(v, 4) for k, v in self.val_losses.items()},
                **{k: round(v, 4) for k, v in self.extra.items()}}


def fork_rng(device: torch.device):
    devices = [device.index or 0] if device.type == "cuda" else []
    return torch.random.fork_rng(devices=devices)


TEST_SENTENCE_MAX_FRAMES = 30 * 16_000 // 256  # 30 s at 16 kHz


@torch.no_grad()
def synthesise(model, token_ids: list[np.ndarray], device: torch.device, seed: int,
               max_frames: int | None = None) -> list[np.ndarray]:
    """Waveforms (float32 numpy) for token id sequences, seeded; the model must be in eval mode.
    `max_frames` caps what the decoder renders: an untrained duration predictor can ask for minutes
    of audio, and rendering it would cost more than the rest of an evaluation."""
    count, longest = len(token_ids), max(len(t) for t in token_ids)
    input_ids = torch.zeros(count, longest, dtype=torch.long)
    mask = torch.zeros(count, longest, dtype=torch.long)
    for i, ids in enumerate(token_ids):
        input_ids[i, : len(ids)] = torch.from_numpy(ids.astype(np.int64))
        mask[i, : len(ids)] = 1
    hook = None
    if max_frames is not None:  # latents [batch, channels, frames] reach the decoder as its first argument
        hook = model.decoder.register_forward_pre_hook(lambda module, args: (args[0][..., :max_frames], *args[1:]))
    try:
        with fork_rng(device):
            torch.manual_seed(seed)
            out = model(input_ids=input_ids.to(device), attention_mask=mask.to(device))
    finally:
        if hook is not None:
            hook.remove()
    waves = out.waveform.float().cpu().numpy()
    return [waves[i, : int(out.sequence_lengths[i])] for i in range(count)]


class Evaluator:
    """Scores a model on held-out examples and writes test-sentence WAVs to samples_dir/step_NNNNNN/."""

    @staticmethod
    def describe(result: EvalResult) -> str:
        return f"MCD {result.mcd_db:.3f} dB"

    def __init__(self, examples: list[Example], features: Features, device: torch.device, sample_rate: int,
                 samples_dir: Path | None, test_sentences: list[tuple[str, np.ndarray]], seed: int = 0,
                 batch_size: int = 8, segment_frames: int = 32):
        self.examples, self.features, self.device = examples, features, device
        self.sample_rate, self.samples_dir, self.test_sentences = sample_rate, samples_dir, test_sentences
        self.seed, self.batch_size, self.segment_frames = seed, batch_size, segment_frames

    def evaluate(self, model, step: int) -> EvalResult:
        """Eval mode for the duration of the call; the caller restores training mode."""
        started = time.monotonic()
        model.eval()
        while True:
            try:
                per_clip, losses = self.score_clips(model)
                break
            except torch.cuda.OutOfMemoryError:
                if self.batch_size == 1:
                    raise
                torch.cuda.empty_cache()
                self.batch_size //= 2  # kept for the rest of the run
                LOG.warning(f"evaluation ran out of GPU memory: scoring {self.batch_size} clips at a time from now on")
        try:
            samples = self.write_samples(model, step)
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()
            samples = []
            LOG.warning(f"test sentences not written at step {step}: out of GPU memory (shorten --test_sentences)")
        mcd = float(np.mean(list(per_clip.values()))) if per_clip else float("nan")
        return EvalResult(step=step, mcd_db=mcd, per_clip=per_clip, val_losses=losses,
                          seconds=time.monotonic() - started, samples=samples)

    def score_clips(self, model) -> tuple[dict[str, float], dict[str, float]]:
        per_clip: dict[str, float] = {}
        totals: dict[str, float] = {}
        hop = self.features.config.hop_length
        for start in range(0, len(self.examples), self.batch_size):
            group = self.examples[start : start + self.batch_size]
            cap = 4 * max(e.frame_count(hop) for e in group)  # far too long already scores badly; no need to render more
            waves = synthesise(model, [e.token_ids for e in group], self.device, self.seed + start, cap)
            for example, wave in zip(group, waves):
                synthesised = self.features.mel(torch.from_numpy(wave).unsqueeze(0).to(self.device))[0].cpu().numpy()
                real = self.features.mel(torch.from_numpy(example.audio / 32768.0).float().unsqueeze(0).to(self.device))
                per_clip[example.item_id] = mcd_dtw(synthesised, real[0].cpu().numpy())
            for name, value in self.validation_losses(model, collate(group, hop).to(self.device), start).items():
                totals[name] = totals.get(name, 0.0) + value * len(group)
        return per_clip, {k: v / max(1, len(self.examples)) for k, v in totals.items()}

    @torch.no_grad()
    def validation_losses(self, model, batch, seed_offset: int) -> dict[str, float]:
        """The objective's mel, KL and duration losses on a held-out batch (no discriminator terms)."""
        with fork_rng(self.device):
            torch.manual_seed(self.seed + seed_offset)
            out = generator_forward(model, batch, self.features, self.segment_frames)
            _, mel_real = real_segments(batch, self.features, out.segment_starts, self.segment_frames)
            mel_generated = self.features.mel(out.audio.squeeze(1))
            terms = generator_losses(out, mel_real, mel_generated, None, None, None, LossWeights())
        return {"mel": terms.mel.item(), "kl": terms.kl.item(), "duration": terms.duration.item()}

    def write_samples(self, model, step: int) -> list[str]:
        if self.samples_dir is None or not self.test_sentences:
            return []
        folder = self.samples_dir / f"step_{step:06d}"
        folder.mkdir(parents=True, exist_ok=True)
        waves = synthesise(model, [ids for _, ids in self.test_sentences], self.device, self.seed,
                           TEST_SENTENCE_MAX_FRAMES)
        paths = []
        for (name, _), wave in zip(self.test_sentences, waves):
            path = folder / f"{name}.wav"
            write_pcm16(path, wave, self.sample_rate)
            paths.append(str(path))
        return paths
