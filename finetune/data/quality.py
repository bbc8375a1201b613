"""A clip's recording quality, read from its samples at preparation, and the drops it can decide.

Crowd-sourced corpora (Common Voice) mix microphones, rooms and noise from clip to clip. Per clip:

    snr_db        a signal-based noise estimate: the loud frames' energy (95th percentile of 20 ms
                  frames) over the noise floor's (10th percentile), in dB; low means noisy
    clipping      the share of samples at full scale in the decoded source (before any gain)
    silence       the share of 20 ms frames more than 40 dB below the clip's loudest frame
    chars_per_s   characters of the normalised text a second, compared with the speaker's own median
    dnsmos        DNSMOS P.835 overall (1-5), from the optional speechmos, with prepare_data.py --dnsmos

`QualityLimits` turns the flags into drops, each counted under its reason in prepare_report.json.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FRAME_S = 0.02
FULL_SCALE = 0.999  # a decoded sample this close to 1 is clipped
SILENCE_BELOW_DB = 40.0

QUALITY_DROP_REASONS = {
    "noisy": "its noise estimate is below --min_snr_db",
    "clipped": "more of its samples are clipped than --max_clipping",
    "mostly_silence": "more of it is silence than --max_silence",
    "speaking_rate": "its characters a second are further from its speaker's median than --max_rate_deviation",
    "low_dnsmos": "its DNSMOS is below --min_dnsmos",
}


def frame_db(samples: np.ndarray, sample_rate: int) -> np.ndarray:
    """Energy of each 20 ms frame, in dB (a floor at -120 dB)."""
    size = max(1, int(FRAME_S * sample_rate))
    count = max(1, len(samples) // size)
    frames = (
        np.asarray(samples[: count * size], dtype=np.float64).reshape(count, -1)
        if len(samples) >= size
        else np.asarray(samples, dtype=np.float64).reshape(1, -1)
    )
    return 10 * np.log10(np.maximum(np.mean(frames**2, axis=1), 1e-12))


def measure(decoded: np.ndarray, trimmed: np.ndarray, sample_rate: int) -> dict[str, float]:
    """snr_db, clipping and silence of one clip: `decoded` as the source held it (clipping is counted
    there), `trimmed` as prepared (mono, at `sample_rate`, before peak normalisation)."""
    energies = frame_db(trimmed, sample_rate)
    loud, floor = np.percentile(energies, 95), np.percentile(energies, 10)
    clipped = float(np.mean(np.abs(decoded) >= FULL_SCALE)) if decoded.size else 0.0
    silence = float(np.mean(energies < energies.max() - SILENCE_BELOW_DB))
    return {"snr_db": round(float(loud - floor), 2), "clipping": round(clipped, 5), "silence": round(silence, 4)}


@dataclass(frozen=True)
class QualityLimits:
    """The drop thresholds (0: that check is off)."""

    min_snr_db: float = 0.0
    max_clipping: float = 0.0
    max_silence: float = 0.0
    max_rate_deviation: float = 0.0
    min_dnsmos: float = 0.0

    def problem(self, quality: dict, speaker_rate: float) -> tuple[str, str] | None:
        """(reason, detail) for a clip these limits drop, else None; `speaker_rate`: its speaker's median
        characters a second."""
        snr, clipping, silence = quality.get("snr_db"), quality.get("clipping"), quality.get("silence")
        if self.min_snr_db and snr is not None and snr < self.min_snr_db:
            return "noisy", f"noise estimate {snr:.1f} dB < --min_snr_db {self.min_snr_db:g}"
        if self.max_clipping and clipping is not None and clipping > self.max_clipping:
            return "clipped", f"{100 * clipping:.2f}% of samples clipped > --max_clipping {self.max_clipping:g}"
        if self.max_silence and silence is not None and silence > self.max_silence:
            return "mostly_silence", f"{100 * silence:.0f}% silence > --max_silence {self.max_silence:g}"
        rate = quality.get("chars_per_s")
        if self.max_rate_deviation and rate and speaker_rate:
            deviation = abs(rate / speaker_rate - 1)
            if deviation > self.max_rate_deviation:
                return "speaking_rate", (
                    f"{rate:.1f} characters a second, {100 * deviation:.0f}% from its speaker's "
                    f"{speaker_rate:.1f} > --max_rate_deviation {self.max_rate_deviation:g}"
                )
        dnsmos = quality.get("dnsmos")
        if self.min_dnsmos and dnsmos is not None and dnsmos < self.min_dnsmos:
            return "low_dnsmos", f"DNSMOS {dnsmos:.2f} < --min_dnsmos {self.min_dnsmos:g}"
        return None


def summary(values: list[float]) -> float | None:
    """The median, rounded; None for no values."""
    clean = [v for v in values if v is not None]
    return round(float(np.median(clean)), 4) if clean else None
