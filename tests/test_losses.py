"""Each loss on hand-made tensors, where the answer can be worked out by hand."""

import math

import torch

from finetune.vits import losses


def test_kl_is_minus_half_per_channel_when_the_sample_sits_on_the_prior_mean():
    z = torch.ones(1, 2, 3)  # 2 channels, 3 frames
    zeros = torch.zeros(1, 2, 3)
    # per element: 0 - 0 - 0.5 + 0; summed over 2 channels, averaged over 3 frames
    assert losses.kl_loss(z, zeros, z.clone(), zeros, torch.ones(1, 1, 3)).item() == -1.0


def test_kl_counts_only_masked_frames():
    z_p = torch.tensor([[[2.0, 100.0]]])  # the second frame is padding
    m_p, logs_p = torch.zeros(1, 1, 2), torch.full((1, 1, 2), math.log(2.0))
    logs_q, mask = torch.zeros(1, 1, 2), torch.tensor([[[1.0, 0.0]]])
    # log 2 - 0 - 0.5 + 0.5 * 4 / 4 = log 2
    assert abs(losses.kl_loss(z_p, logs_q, m_p, logs_p, mask).item() - math.log(2.0)) < 1e-6


def test_mel_loss_is_mean_absolute_difference():
    assert losses.mel_loss(torch.zeros(1, 2, 2), torch.tensor([[[1.0, -1.0], [2.0, 0.0]]])).item() == 1.0


def test_least_squares_adversarial_losses():
    ones, zeros = [torch.ones(2, 3)] * 2, [torch.zeros(2, 3)] * 2
    assert losses.discriminator_loss(ones, zeros).item() == 0.0  # perfect discriminator
    assert losses.discriminator_loss(zeros, ones).item() == 4.0  # 2 sub-discriminators x (1 + 1)
    assert losses.generator_adversarial_loss(ones).item() == 0.0
    assert losses.generator_adversarial_loss(zeros).item() == 2.0


def test_feature_matching_is_twice_the_mean_l1_per_layer():
    real = [[torch.zeros(2, 4), torch.zeros(3)]]
    fake = [[torch.full((2, 4), 0.5), torch.ones(3)]]
    assert losses.feature_matching_loss(real, fake).item() == 2.0 * (0.5 + 1.0)


def test_deterministic_duration_loss_is_zero_for_exact_log_durations():
    durations = torch.tensor([[[3.0, 1.0, 2.0, 0.0]]])
    mask = torch.tensor([[[1.0, 1.0, 1.0, 0.0]]])
    predicted = torch.log(durations + 1e-6) * mask
    assert losses.deterministic_duration_loss(predicted, durations, mask).item() < 1e-9
    assert abs(losses.deterministic_duration_loss(predicted + mask, durations, mask).item() - 1.0) < 1e-6
