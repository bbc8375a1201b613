"""Spectrogram features: the linear magnitude spectrogram (posterior encoder input) and the log-mel
spectrogram (mel loss), from one set of STFT parameters, always computed in fp32.

Framing follows the original VITS: the waveform is reflect-padded by (n_fft - hop) / 2 on each side
and the STFT is not centred, so a clip of N samples gives exactly N // hop frames and frame i covers
samples [i * hop, (i + 1) * hop). Random segments of frames and of samples then line up exactly.
Mel filters are librosa's (Slaney), applied to the magnitude; log with a floor of 1e-5. `silence_mel` is
the log-mel of a silent frame: what padding past a clip's end must read as, precomputed or not.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

MEL_FLOOR = 1e-5


@dataclass(frozen=True)
class FeatureConfig:
    sample_rate: int = 16_000
    n_fft: int = 1024
    hop_length: int = 256
    win_length: int = 1024
    n_mels: int = 80
    f_min: float = 0.0
    f_max: float | None = None  # None: sample_rate / 2

    @property
    def linear_bins(self) -> int:
        return self.n_fft // 2 + 1


def mel_filterbank(config: FeatureConfig) -> torch.Tensor:
    """[n_mels, n_fft // 2 + 1] Slaney mel filters, as librosa makes them."""
    import librosa

    basis = librosa.filters.mel(
        sr=config.sample_rate, n_fft=config.n_fft, n_mels=config.n_mels, fmin=config.f_min, fmax=config.f_max
    )
    return torch.from_numpy(basis).float()


def linear_spectrogram(waveform: torch.Tensor, window: torch.Tensor, config: FeatureConfig) -> torch.Tensor:
    """[batch, samples] -> magnitude [batch, n_fft // 2 + 1, samples // hop], fp32 whatever the input."""
    with torch.autocast(device_type=waveform.device.type, enabled=False):
        pad = (config.n_fft - config.hop_length) // 2
        padded = F.pad(waveform.float().unsqueeze(1), (pad, pad), mode="reflect").squeeze(1)
        spec = torch.stft(
            padded,
            config.n_fft,
            hop_length=config.hop_length,
            win_length=config.win_length,
            window=window,
            center=False,
            return_complex=True,
        )
        return torch.sqrt(spec.real.pow(2) + spec.imag.pow(2) + 1e-6)


def log_mel_from_linear(linear: torch.Tensor, mel_basis: torch.Tensor) -> torch.Tensor:
    """Magnitude [batch, bins, frames] -> log-mel [batch, n_mels, frames], fp32."""
    with torch.autocast(device_type=linear.device.type, enabled=False):
        mel = torch.matmul(mel_basis, linear.float())
        return torch.log(torch.clamp(mel, min=MEL_FLOOR))


class Features(torch.nn.Module):
    """Holds the window and mel filters as buffers so `.to(device)` moves them with the model."""

    def __init__(self, config: FeatureConfig):
        super().__init__()
        self.config = config
        self.register_buffer("window", torch.hann_window(config.win_length), persistent=False)
        self.register_buffer("mel_basis", mel_filterbank(config), persistent=False)
        silence = linear_spectrogram(torch.zeros(1, config.n_fft), self.window, config)[0, :, :1]  # [bins, 1]
        self.register_buffer("silence_mel", log_mel_from_linear(silence, self.mel_basis)[:, 0], persistent=False)

    def linear(self, waveform: torch.Tensor) -> torch.Tensor:
        return linear_spectrogram(waveform, self.window, self.config)

    def mel_from_linear(self, linear: torch.Tensor) -> torch.Tensor:
        return log_mel_from_linear(linear, self.mel_basis)

    def mel(self, waveform: torch.Tensor) -> torch.Tensor:
        """[batch, samples] -> log-mel [batch, n_mels, samples // hop]."""
        return self.mel_from_linear(self.linear(waveform))

    def frames(self, samples: int) -> int:
        return samples // self.config.hop_length
