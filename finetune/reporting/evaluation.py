"""Evaluation on held-out clips: synthesise each clip's text and compare it with its recording.

Per clip (finetune/reporting/measures.py says how each is computed and why):
    MCD-DTW          spectral distance to the recording, dB (lower is better)
    length ratio     how long the model speaks the text over how long the recording is (1 = its tempo)
    duration error   how much of the recording's rhythm the predicted durations misplace (0 = none)
Per evaluation: the mean MCD, the median length ratio, the mean duration error, the objective's own
losses (mel, KL, duration) on the same clips, and whether the model may become the best one: only when
its median length ratio passes the timing rule. It judges speech synthesised from text, duration
predictor included, not just how well the training loss is minimised.

Synthesis is bounded (finetune/vits/inference.py): each clip at most MAX_LENGTH_VS_RECORDING times its
recording, so a broken model is scored, as broken, in about the time a good one takes; its length ratio
is still the full length it asked for. Synthesis is seeded and runs inside a forked RNG, so successive
evaluations are comparable and the training's random state is left as it was. A stop request (Ctrl-C,
SIGTERM) is honoured between groups of clips.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from finetune.data.audio import write_pcm16
from finetune.system.disk import OPTIONAL, is_write_failure
from finetune.data.examples import Example, collate
from finetune.data.features import Features
from finetune.vits.inference import ceiling_for_text, fork_rng, speak
from finetune.system.interrupt import StopRequest
from finetune.vits.losses import LossWeights
from finetune.reporting.measures import TimingRule, duration_error, length_ratio, mcd_dtw
from finetune.vits.objective import generator_forward, generator_losses, real_segments

LOG = logging.getLogger(__name__)  # a child of the run's "finetune" logger

MAX_LENGTH_VS_RECORDING = 3.0  # evaluation renders at most 3x the recording: far too long already scores badly
TEST_SENTENCE_MAX_S = 30.0


@dataclass
class ClipScore:
    mcd_db: float
    length_ratio: float  # requested frames / recording frames, before any synthesis cap
    duration_error: float
    capped: bool  # the synthesis hit its ceiling (the model asked for more than was rendered)


@dataclass
class EvalResult:
    step: int
    mcd_db: float  # mean over held-out clips; lower is better
    per_clip: dict[str, ClipScore]
    val_losses: dict[str, float]
    seconds: float
    length_ratio: float = 1.0  # median over clips
    duration_error: float = 0.0  # mean over clips
    eligible: bool = True  # may become the best model (timing within the rule, a finite score)
    ineligible_reason: str = ""
    samples: list[str] = field(default_factory=list)  # WAV files written
    extra: dict[str, float] = field(default_factory=dict)  # further named scores (feedback rounds)

    def summary(self) -> dict:
        return {"step": self.step, "mcd_db": round(self.mcd_db, 4), "length_ratio": round(self.length_ratio, 4),
                "duration_error": round(self.duration_error, 4), "eligible": self.eligible,
                **({"ineligible_reason": self.ineligible_reason} if not self.eligible else {}),
                "seconds": round(self.seconds, 2), **{f"val_{k}": round(v, 4) for k, v in self.val_losses.items()},
                **{k: round(v, 4) for k, v in self.extra.items()}}

    def per_clip_dict(self) -> dict[str, dict]:
        return {name: {k: (round(v, 4) if isinstance(v, float) else v) for k, v in asdict(score).items()}
                for name, score in self.per_clip.items()}


def judge(step: int, scores: dict[str, ClipScore], val_losses: dict[str, float], seconds: float,
          rule: TimingRule) -> EvalResult:
    """Per-clip scores -> one evaluation: means, median length ratio, and eligibility by the timing rule."""
    mcd = float(np.mean([s.mcd_db for s in scores.values()])) if scores else float("nan")
    ratio = float(np.median([s.length_ratio for s in scores.values()])) if scores else float("nan")
    error = float(np.mean([s.duration_error for s in scores.values()])) if scores else float("nan")
    reason = ""
    if not np.isfinite(mcd):
        reason = "the synthesised speech is not finite"
    elif not rule.accepts(ratio):
        digits = next((d for d in range(2, 7) if not rule.accepts(round(ratio, d))), 6)  # never "0.80 is outside 0.80-"
        reason = f"median length ratio {ratio:.{digits}f} is outside {rule.describe()}"
    return EvalResult(step=step, mcd_db=mcd, per_clip=scores, val_losses=val_losses, seconds=seconds,
                      length_ratio=ratio, duration_error=error, eligible=not reason, ineligible_reason=reason)


def describe_timing(result: EvalResult) -> str:
    verdict = "" if result.eligible else f" (not eligible as best: {result.ineligible_reason})"
    return f"length x{result.length_ratio:.2f}, duration error {result.duration_error:.2f}{verdict}"


class Evaluator:
    """Scores a model on held-out examples and writes test-sentence WAVs to samples_dir/step_NNNNNN/."""

    @staticmethod
    def describe(result: EvalResult) -> str:
        return f"MCD {result.mcd_db:.3f} dB, {describe_timing(result)}"

    def __init__(self, examples: list[Example], features: Features, device: torch.device, sample_rate: int,
                 samples_dir: Path | None, test_sentences: list[tuple[str, np.ndarray]], seed: int = 0,
                 batch_size: int = 8, segment_frames: int = 32, rule: TimingRule = TimingRule()):
        self.examples, self.features, self.device = examples, features, device
        self.sample_rate, self.samples_dir, self.test_sentences = sample_rate, samples_dir, test_sentences
        self.seed, self.batch_size, self.segment_frames, self.rule = seed, batch_size, segment_frames, rule
        self.example_mels: tuple[str, np.ndarray, np.ndarray] | None = None  # (clip id, synthesised, recorded) log-mels

    def evaluate(self, model, step: int, stop: StopRequest | None = None) -> EvalResult:
        """Eval mode for the duration of the call; the caller restores training mode. A stop request
        raises StopRequested between groups of clips."""
        started = time.monotonic()
        model.eval()
        while True:
            try:
                scores, losses = self.score_clips(model, stop)
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
        result = judge(step, scores, losses, time.monotonic() - started, self.rule)
        result.samples = samples
        return result

    def score_clips(self, model, stop: StopRequest | None = None) -> tuple[dict[str, ClipScore], dict[str, float]]:
        scores: dict[str, ClipScore] = {}
        totals: dict[str, float] = {}
        hop = self.features.config.hop_length
        for start in range(0, len(self.examples), self.batch_size):
            if stop is not None:
                stop.check()
            group = self.examples[start : start + self.batch_size]
            losses, aligned = self.validation_losses(model, collate(group, hop).to(self.device), start)
            scores.update(self.score_group(model, group, aligned, start))
            for name, value in losses.items():
                totals[name] = totals.get(name, 0.0) + value * len(group)
        return scores, {k: v / max(1, len(self.examples)) for k, v in totals.items()}

    def score_group(self, model, group: list[Example], aligned: list[np.ndarray], seed_offset: int) -> dict[str, ClipScore]:
        """Synthesise a group of clips from their text (each capped at MAX_LENGTH_VS_RECORDING times its
        recording) and score each against its recording."""
        hop = self.features.config.hop_length
        ceilings = [MAX_LENGTH_VS_RECORDING * len(e.audio) / self.sample_rate for e in group]
        speech = speak(model, [e.token_ids for e in group], self.device, self.seed + seed_offset, ceilings)
        scores = {}
        for i, example in enumerate(group):
            synthesised = self.features.mel(torch.from_numpy(speech.waveforms[i]).unsqueeze(0).to(self.device))
            real = self.features.mel(torch.from_numpy(example.audio / 32768.0).float().unsqueeze(0).to(self.device))
            if seed_offset == 0 and i == 0:  # the first clip, kept for pictures (TensorBoard, the run report)
                self.example_mels = (example.item_id, synthesised[0].cpu().numpy(), real[0].cpu().numpy())
            scores[example.item_id] = ClipScore(
                mcd_db=mcd_dtw(synthesised[0].cpu().numpy(), real[0].cpu().numpy()),
                length_ratio=length_ratio(speech.requested_frames[i], example.frame_count(hop)),
                duration_error=duration_error(speech.token_frames[i], aligned[i]), capped=speech.capped[i])
        return scores

    @torch.no_grad()
    def validation_losses(self, model, batch, seed_offset: int) -> tuple[dict[str, float], list[np.ndarray]]:
        """The objective's mel, KL and duration losses on a held-out batch (no discriminator terms), and
        each clip's frames per token from the alignment search."""
        with fork_rng(self.device):
            torch.manual_seed(self.seed + seed_offset)
            out = generator_forward(model, batch, self.features, self.segment_frames)
            _, mel_real = real_segments(batch, self.features, out.segment_starts, self.segment_frames)
            mel_generated = self.features.mel(out.audio.squeeze(1))
            terms = generator_losses(out, mel_real, mel_generated, None, None, None, LossWeights())
        durations = out.durations[:, 0].long().cpu().numpy()  # [batch, tokens]
        aligned = [durations[i, : int(n)] for i, n in enumerate(batch.text_lengths)]
        return {"mel": terms.mel.item(), "kl": terms.kl.item(), "duration": terms.duration.item()}, aligned

    def write_samples(self, model, step: int) -> list[str]:
        if self.samples_dir is None or not self.test_sentences:
            return []
        folder = self.samples_dir / f"step_{step:06d}"
        ids = [ids for _, ids in self.test_sentences]
        speech = speak(model, ids, self.device, self.seed, [min(TEST_SENTENCE_MAX_S, ceiling_for_text(len(t))) for t in ids])
        paths = []
        for (name, _), wave in zip(self.test_sentences, speech.waveforms):
            path = folder / f"{name}.wav"
            try:
                folder.mkdir(parents=True, exist_ok=True)
                write_pcm16(path, wave, self.sample_rate)
            except Exception as error:  # soundfile's LibsndfileError on a full disk; anything else surfaces
                if not is_write_failure(error):
                    raise
                OPTIONAL.failed("test-sentence samples", folder, error, LOG.warning)
                break
            paths.append(str(path))
        return paths
