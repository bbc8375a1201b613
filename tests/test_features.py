"""Features: framing, shapes, and agreement with librosa's mel spectrogram."""

import librosa
import numpy as np
import torch

from finetune.data.features import FeatureConfig, Features


def test_log_mel_matches_librosa():
    rng = np.random.default_rng(0)
    sr = 16000
    t = np.arange(sr) / sr
    wave = (0.3 * np.sin(2 * np.pi * 440 * t) + 0.05 * rng.standard_normal(sr)).astype(np.float32)
    ours = Features(FeatureConfig()).mel(torch.from_numpy(wave).unsqueeze(0))[0].numpy()
    padded = np.pad(wave, (384, 384), mode="reflect")  # (n_fft - hop) / 2 each side, as ours does
    reference = librosa.feature.melspectrogram(
        y=padded, sr=sr, n_fft=1024, hop_length=256, win_length=1024, window="hann", center=False, power=1.0, n_mels=80
    )
    reference = np.log(np.clip(reference, 1e-5, None))
    assert ours.shape == reference.shape == (80, sr // 256)
    assert np.abs(ours - reference).max() < 2e-3


def test_frames_line_up_with_samples_and_bins_match_the_model():
    features = Features(FeatureConfig())
    audio = torch.randn(2, 256 * 40)
    linear = features.linear(audio)
    assert linear.shape == (2, 513, 40) and linear.dtype == torch.float32
    assert features.mel_from_linear(linear).shape == (2, 80, 40)


def test_features_stay_fp32_under_autocast():
    features = Features(FeatureConfig())
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        mel = features.mel(torch.randn(1, 256 * 10))
    assert mel.dtype == torch.float32
