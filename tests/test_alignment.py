"""Monotonic alignment search: the fast version equals the plain reference and paths are valid."""

import math

import numpy as np
import pytest
import torch

from finetune.vits.alignment import maximum_path, maximum_path_reference, prior_log_likelihood


def random_case(rng):
    batch = int(rng.integers(1, 4))
    frames = rng.integers(2, 40, size=batch)
    tokens = np.array([rng.integers(1, f + 1) for f in frames])
    values = torch.from_numpy(
        rng.normal(0, 3, size=(batch, int(frames.max()) + 2, int(tokens.max()) + 1)).astype(np.float32)
    )
    return values, torch.from_numpy(frames), torch.from_numpy(tokens)


def test_fast_search_equals_the_reference_on_50_random_cases():
    rng = np.random.default_rng(1234)
    for _ in range(50):
        values, frames, tokens = random_case(rng)
        fast = maximum_path(values, frames, tokens).numpy()
        for i in range(len(frames)):
            f, t = int(frames[i]), int(tokens[i])
            reference = maximum_path_reference(values[i].double().numpy(), f, t)
            assert np.array_equal(fast[i, :f, :t], reference[:f, :t])
            assert fast[i].sum() == f  # nothing outside the valid region


def test_every_path_is_monotonic_and_covers_every_frame():
    rng = np.random.default_rng(7)
    for _ in range(50):
        values, frames, tokens = random_case(rng)
        path = maximum_path(values, frames, tokens).numpy()
        for i in range(len(frames)):
            f, t = int(frames[i]), int(tokens[i])
            block = path[i, :f, :t]
            assert (block.sum(1) == 1).all()  # each frame belongs to exactly one token
            token_of_frame = block.argmax(1)
            assert token_of_frame[0] == 0 and token_of_frame[-1] == t - 1
            assert set(np.diff(token_of_frame)) <= {0, 1}  # never backwards, never skipping
            assert (block.sum(0) >= 1).all()  # every token gets at least one frame


def test_more_tokens_than_frames_is_refused():
    with pytest.raises(ValueError, match="frame per token"):
        maximum_path(torch.zeros(1, 3, 5), torch.tensor([3]), torch.tensor([5]))


def test_prior_log_likelihood_equals_the_gaussian_density():
    torch.manual_seed(0)
    z_p, m_p, logs_p = torch.randn(2, 3, 5), torch.randn(2, 3, 4), 0.3 * torch.randn(2, 3, 4)
    fast = prior_log_likelihood(z_p, m_p, logs_p)
    std = torch.exp(logs_p)
    z = z_p.unsqueeze(3)  # [b, c, frames, 1]
    m, s = m_p.unsqueeze(2), std.unsqueeze(2)  # [b, c, 1, tokens]
    slow = (-0.5 * math.log(2 * math.pi) - torch.log(s) - 0.5 * ((z - m) / s) ** 2).sum(1)
    assert torch.allclose(fast, slow, atol=1e-4)
