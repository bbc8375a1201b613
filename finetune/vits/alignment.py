"""Monotonic alignment search (MAS): the most likely monotonic path from spectrogram frames to tokens.

VITS learns durations without an external aligner: for each clip it finds the path through
[frames, tokens] log-likelihoods that maximises the total, where every frame belongs to exactly one
token, the token index never decreases and never skips, every token gets at least one frame, the first
frame is token 0 and the last frame is the last token.

`maximum_path` is the fast version: a numba-compiled loop (numba arrives with librosa; it compiles on
first use and caches the result, so users never run a build step). `maximum_path_reference` is a plain
Python dynamic programme written independently, used by the tests to check the fast one.
"""

from __future__ import annotations

import math

import numba
import numpy as np
import torch

NEG_INF = -1e30


def prior_log_likelihood(z_p: torch.Tensor, m_p: torch.Tensor, logs_p: torch.Tensor) -> torch.Tensor:
    """log N(z_p[:, :, frame] | m_p[:, :, token], exp(logs_p)) summed over channels -> [batch, frames, tokens].

    z_p: [batch, channels, frames] (posterior latents through the flow)
    m_p, logs_p: [batch, channels, tokens] (prior mean and log standard deviation from the text)
    Expanded as four matrix products so no [batch, channels, frames, tokens] tensor is built; fp32.
    """
    with torch.autocast(device_type=z_p.device.type, enabled=False):
        z_p, m_p, logs_p = z_p.float(), m_p.float(), logs_p.float()
        inv_var = torch.exp(-2.0 * logs_p)  # [b, c, tokens]
        const = torch.sum(-0.5 * math.log(2 * math.pi) - logs_p, dim=1, keepdim=True)  # [b, 1, tokens]
        quad_z = torch.matmul(-0.5 * (z_p**2).transpose(1, 2), inv_var)  # [b, frames, tokens]
        cross = torch.matmul(z_p.transpose(1, 2), m_p * inv_var)  # [b, frames, tokens]
        quad_m = torch.sum(-0.5 * (m_p**2) * inv_var, dim=1, keepdim=True)  # [b, 1, tokens]
        return const + quad_z + cross + quad_m


@numba.njit(cache=True, nogil=True)
def _maximum_path_one(path, value, n_frames, n_tokens):  # pragma: no cover - compiled
    """In place: `value` [frames, tokens] becomes cumulative scores; `path` gets ones on the best path."""
    for y in range(n_frames):
        # Only tokens reachable from (0, 0) that can still reach the last token by the last frame.
        for x in range(max(0, n_tokens + y - n_frames), min(n_tokens, y + 1)):
            stay = NEG_INF if x == y else value[y - 1, x]
            if x == 0:
                advance = 0.0 if y == 0 else NEG_INF
            else:
                advance = value[y - 1, x - 1]
            value[y, x] += max(stay, advance)
    index = n_tokens - 1
    for y in range(n_frames - 1, -1, -1):
        path[y, index] = 1.0
        if index != 0 and (index == y or value[y - 1, index] < value[y - 1, index - 1]):
            index -= 1


@numba.njit(cache=True, nogil=True)
def _maximum_path_batch(paths, values, frame_lengths, token_lengths):  # pragma: no cover - compiled
    for i in range(paths.shape[0]):
        _maximum_path_one(paths[i], values[i], frame_lengths[i], token_lengths[i])


def maximum_path(
    log_likelihood: torch.Tensor, frame_lengths: torch.Tensor, token_lengths: torch.Tensor
) -> torch.Tensor:
    """Best monotonic path for each clip.

    log_likelihood: [batch, frames, tokens]; frame_lengths, token_lengths: [batch] (valid sizes).
    Returns a 0/1 tensor [batch, frames, tokens] on the input's device (zeros outside the valid sizes).
    Needs token_length <= frame_length per clip. This copies to the CPU: a device sync point.
    """
    values = log_likelihood.detach().to("cpu", torch.float64).numpy().copy()
    paths = np.zeros(values.shape, dtype=np.float64)
    frames = frame_lengths.detach().cpu().numpy().astype(np.int64)
    tokens = token_lengths.detach().cpu().numpy().astype(np.int64)
    if (tokens > frames).any():
        raise ValueError("an alignment needs at least one frame per token; a clip has more tokens than frames")
    _maximum_path_batch(paths, values, frames, tokens)
    return torch.from_numpy(paths).to(device=log_likelihood.device, dtype=log_likelihood.dtype)


def maximum_path_reference(log_likelihood: np.ndarray, n_frames: int, n_tokens: int) -> np.ndarray:
    """One clip, plain Python: best[y][x] = ll[y][x] + max(best[y-1][x], best[y-1][x-1]) over paths from
    (0, 0); then walk back from (last frame, last token), staying on a token when that scores at least as
    well as stepping back. Returns a 0/1 array [frames, tokens] of the input's shape."""
    best = [[-math.inf] * n_tokens for _ in range(n_frames)]
    best[0][0] = float(log_likelihood[0][0])
    for y in range(1, n_frames):
        for x in range(n_tokens):
            stay = best[y - 1][x]
            back = best[y - 1][x - 1] if x > 0 else -math.inf
            if max(stay, back) > -math.inf:
                best[y][x] = float(log_likelihood[y][x]) + max(stay, back)
    path = np.zeros(np.shape(log_likelihood))
    x = n_tokens - 1
    for y in range(n_frames - 1, 0, -1):
        path[y][x] = 1.0
        must_step = x > y - 1  # token x cannot have started before frame x
        if x > 0 and (must_step or best[y - 1][x - 1] > best[y - 1][x]):
            x -= 1
    path[0][x] = 1.0
    return path
