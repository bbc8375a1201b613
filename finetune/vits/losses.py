"""VITS losses as small pure functions of tensors, all computed in fp32 (autocast off inside each, see
finetune/vits/fp32_islands.py).

Default weights are the original VITS ones (jaywalnut310/vits, configs/ljs_base.json `c_mel` 45 and
`c_kl` 1.0; train.py adds the adversarial, feature-matching and duration terms with weight 1).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from finetune.vits.fp32_islands import in_fp32


@dataclass(frozen=True)
class LossWeights:
    mel: float = 45.0  # L1 between log-mels of real and generated segments (VITS c_mel)
    kl: float = 1.0  # KL between posterior (through the flow) and the text prior (VITS c_kl)
    duration: float = 1.0  # duration predictor loss (VITS: added with weight 1)
    adversarial: float = 1.0  # least-squares generator loss against the discriminator
    feature_matching: float = 1.0  # L1 between discriminator features of real and generated audio


def _fp32(*tensors: torch.Tensor) -> list[torch.Tensor]:
    return [t.float() for t in tensors]


@in_fp32
def kl_loss(
    z_p: torch.Tensor, logs_q: torch.Tensor, m_p: torch.Tensor, logs_p: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """KL(q || p) per the VITS single-sample estimate: summed over channels, averaged over valid frames.

    z_p, logs_q: [batch, channels, frames] posterior sample through the flow, posterior log std
    m_p, logs_p: [batch, channels, frames] prior mean and log std expanded to frames
    mask: [batch, 1, frames], 1 on valid frames, or each frame's weight (0 everywhere: a loss of 0)
    """
    z_p, logs_q, m_p, logs_p, mask = _fp32(z_p, logs_q, m_p, logs_p, mask)
    kl = logs_p - logs_q - 0.5 + 0.5 * (z_p - m_p) ** 2 * torch.exp(-2.0 * logs_p)
    # a batch has many valid frames, so the floor of 1 changes nothing but a weighting that leaves none
    return torch.sum(kl * mask) / torch.clamp(torch.sum(mask), min=1.0)


@in_fp32
def mel_loss(mel_generated: torch.Tensor, mel_real: torch.Tensor) -> torch.Tensor:
    """Mean absolute difference of log-mels [batch, n_mels, frames]."""
    generated, real = _fp32(mel_generated, mel_real)
    return torch.nn.functional.l1_loss(generated, real)


@in_fp32
def deterministic_duration_loss(
    log_duration_predicted: torch.Tensor, durations: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """Squared error of log durations. log_duration_predicted, durations, mask: [batch, 1, tokens]."""
    predicted, durations, mask = _fp32(log_duration_predicted, durations, mask)
    target = torch.log(durations + 1e-6) * mask
    return torch.sum((predicted - target) ** 2) / torch.sum(mask)


@in_fp32
def discriminator_loss(real_scores: list[torch.Tensor], fake_scores: list[torch.Tensor]) -> torch.Tensor:
    """Least squares: real scores pushed to 1, generated ones to 0, summed over sub-discriminators."""
    total = torch.zeros((), device=real_scores[0].device)
    for real, fake in zip(real_scores, fake_scores):
        real, fake = _fp32(real, fake)
        total = total + torch.mean((1.0 - real) ** 2) + torch.mean(fake**2)
    return total


@in_fp32
def generator_adversarial_loss(fake_scores: list[torch.Tensor]) -> torch.Tensor:
    """Least squares: generated scores pushed to 1, summed over sub-discriminators."""
    total = torch.zeros((), device=fake_scores[0].device)
    for fake in fake_scores:
        total = total + torch.mean((1.0 - fake.float()) ** 2)
    return total


@in_fp32
def feature_matching_loss(
    real_features: list[list[torch.Tensor]], fake_features: list[list[torch.Tensor]]
) -> torch.Tensor:
    """L1 between every discriminator layer's features for real and generated audio (x2, as in VITS).
    Real features are constants here: the generator must move towards them, not move them."""
    total = torch.zeros((), device=real_features[0][0].device)
    for real_layers, fake_layers in zip(real_features, fake_features):
        for real, fake in zip(real_layers, fake_layers):
            total = total + torch.mean(torch.abs(real.detach().float() - fake.float()))
    return 2.0 * total
