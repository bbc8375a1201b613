"""Audio in and out: decode, mono, resample, trim silence, peak-normalise, write 16-bit PCM.

Decoding never goes through torchcodec or ffmpeg: soundfile (libsndfile) reads WAV, FLAC, OGG and MP3
from a path or from bytes. Resampling is soxr's high-quality mode (librosa's `soxr_hq`). Samples are float32
in [-1, 1] between steps; on disk they are 16-bit PCM WAV.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import soundfile as sf

from finetune.system.atomic import write_atomic

# Below this peak (-80 dBFS) a clip is treated as silent: trimming and normalising it would only
# amplify noise.
SILENCE_PEAK = 1e-4


class AudioError(Exception):
    """A clip that cannot be used; `reason` is a short key for reports ("missing_file", ...)."""

    def __init__(self, reason: str, detail: str):
        self.reason = reason
        super().__init__(detail)


def decode(source: str | Path | bytes) -> tuple[np.ndarray, int]:
    """Read encoded audio from a path or bytes. Returns float32 samples [frames, channels] and the rate."""
    if isinstance(source, (str, Path)) and not os.path.isfile(source):
        raise AudioError("missing_file", f"no such file: {source}")
    handle = io.BytesIO(source) if isinstance(source, bytes) else str(source)
    try:
        samples, sample_rate = sf.read(handle, dtype="float32", always_2d=True)
    except (sf.LibsndfileError, RuntimeError, ValueError, TypeError, EOFError) as error:
        raise AudioError("unreadable_audio", f"cannot decode audio: {error}") from error
    if samples.size == 0:
        raise AudioError("unreadable_audio", "audio has no samples")
    if not np.isfinite(samples).all():
        raise AudioError("unreadable_audio", "audio holds NaN or infinite samples")
    return samples, int(sample_rate)


def to_mono(samples: np.ndarray) -> np.ndarray:
    """[frames, channels] -> [frames] by averaging channels."""
    return samples.mean(axis=1) if samples.ndim == 2 else samples


def resample(samples: np.ndarray, orig_rate: int, target_rate: int) -> np.ndarray:
    """Band-limited resampling with soxr's high-quality mode; a no-op when the rates match.

    This is the call librosa.resample(res_type="soxr_hq") makes, made directly: librosa's first
    resample imports scipy.signal, 1.7 s per worker process on our CI machine."""
    if orig_rate == target_rate:
        return samples
    import soxr

    return soxr.resample(samples, orig_rate, target_rate, quality="HQ").astype(np.float32, copy=False)


def trim_silence(samples: np.ndarray, sample_rate: int, top_db: float, margin_s: float) -> np.ndarray:
    """Cut leading and trailing audio quieter than `top_db` below the loudest frame, keeping `margin_s`
    on each side so soft onsets and endings survive."""
    start, end = loud_span(samples, top_db)
    margin = int(margin_s * sample_rate)
    return samples[max(0, start - margin) : min(len(samples), end + margin)]


def loud_span(samples: np.ndarray, top_db: float, frame_length: int = 1024, hop_length: int = 256) -> tuple[int, int]:
    """[start, end) in samples of the frames whose RMS is within `top_db` of the loudest frame's: the span
    librosa.effects.trim finds (frames centred on every hop, zero-padded at the ends; RMS floored at 1e-5),
    computed here with numpy because importing librosa.effects costs each preparation worker about 2 s of
    CPU (tests/test_audio.py checks that the two agree). A silent clip is all one level: kept whole."""
    padded = np.pad(samples.astype(np.float64), frame_length // 2)
    energy = np.concatenate([[0.0], np.cumsum(padded**2)])
    starts = np.arange(1 + (len(padded) - frame_length) // hop_length) * hop_length
    power = (energy[starts + frame_length] - energy[starts]) / frame_length
    floor = 1e-10  # librosa's amin of 1e-5, squared
    level_db = 10 * np.log10(np.maximum(floor, power)) - 10 * np.log10(max(floor, float(power.max())))
    loud = np.flatnonzero(level_db > -top_db)
    if loud.size == 0:
        return 0, 0
    return int(loud[0]) * hop_length, min(len(samples), (int(loud[-1]) + 1) * hop_length)


def peak_normalise(samples: np.ndarray, peak: float) -> np.ndarray:
    """Scale so the largest absolute sample equals `peak` (e.g. 0.95)."""
    largest = float(np.abs(samples).max())
    return samples if largest == 0.0 else samples * (peak / largest)


def write_pcm16(path: str | Path, samples: np.ndarray, sample_rate: int) -> None:
    """Write mono 16-bit PCM WAV atomically: a temporary file in the same folder, then a rename."""
    clipped = np.clip(samples, -1.0, 1.0)
    write_atomic(path, lambda tmp: sf.write(tmp, clipped, sample_rate, subtype="PCM_16", format="WAV"), durable=False)


def read_pcm16(path: str | Path) -> tuple[np.ndarray, int]:
    """Read a WAV as int16 samples [frames] (compact in RAM: 2 bytes a sample) and its rate."""
    samples, sample_rate = sf.read(str(path), dtype="int16", always_2d=True)
    return samples[:, 0].copy() if samples.shape[1] == 1 else samples.mean(axis=1).astype(np.int16), sample_rate
