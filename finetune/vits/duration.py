"""The stochastic duration predictor's training loss, in the flow order of the original VITS.

Why our own: transformers' `VitsStochasticDurationPredictor.forward(reverse=False)` flips the two
channels after every flow, the first (an elementwise affine) included:

    transformers, training   EA, flip, CF1, flip, CF2, flip, ..., CFn, flip
    original VITS, training  EA, CF1, flip, CF2, flip, ..., CFn, flip       (flows = [EA, (ConvFlow, Flip) x n])

while its inference path (reverse=True) inverts the VITS order: flip, CFn^-1, ..., flip, CF2^-1, flip,
EA^-1, leaving CF1 out because in the VITS order CF1 only changes the noise channel, which inference
throws away. Trained in transformers' order, CF1 changes the duration channel instead, so the flows that
inference inverts are not the ones training fitted: a predictor trained that way on durations of
2/5/9/14 frames predicts about 1 frame each, and an MMS predictor (trained in the VITS order) drifts
under fine-tuning towards faster, flatter speech while its training loss looks fine. The posterior
flows (`post_flows`, same layout) are run in the VITS order too, as MMS checkpoints were trained.

The arithmetic is otherwise transformers' (and VITS's): variational dequantisation of the integer
durations through the posterior flows, a log flow, the main flows conditioned on the text, and the
negative log-likelihood of the result under a standard normal plus the posterior's log-probability.

Shapes: hidden [batch, hidden, tokens]; mask and durations [batch, 1, tokens]; z [batch, 2, tokens].
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

LOG_2PI = math.log(2 * math.pi)


def vits_order_flows(
    flows, z: torch.Tensor, mask: torch.Tensor, conditioning: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """z through [EA, CF1, ..., CFn] forwards with a flip after each ConvFlow and none after the
    elementwise affine (flows[0]). Returns (z, log-determinant [batch])."""
    log_det = torch.zeros(z.shape[0], device=z.device, dtype=z.dtype)
    for index, flow in enumerate(flows):
        z, step_log_det = flow(z, mask, global_conditioning=conditioning)
        log_det = log_det + step_log_det
        if index > 0:
            z = torch.flip(z, [1])
    return z, log_det


def with_anchor(x: torch.Tensor) -> torch.Tensor:
    """x [batch, channels, tokens] with one more token position, of zeros, masked out everywhere.

    transformers' spline flow gathers the values inside its interval ([-5, 5]) and fails on an empty
    gather (torch.min of nothing) when none is: what a runaway duration predictor produces, which would
    stop training and evaluation with a RuntimeError. The extra position is masked out (so it adds
    nothing to any sum, and convolutions see the same zeros they pad with) and 0 lies inside the
    interval, so the gather is never empty; no device sync is needed to know."""
    return F.pad(x, (0, 1))


def stochastic_duration_nll(
    predictor, hidden: torch.Tensor, mask: torch.Tensor, durations: torch.Tensor, speaker: torch.Tensor | None = None
) -> torch.Tensor:
    """Negative log-likelihood bound of the aligned `durations` (frames per token) under a transformers
    VitsStochasticDurationPredictor, per clip [batch]; `speaker` is the global conditioning g [batch,
    embedding, 1] of a multi-speaker model (added after conv_pre, detached, as transformers does)."""
    hidden, durations, mask = (with_anchor(x) for x in (hidden, durations, mask))
    text = predictor.conv_pre(torch.detach(hidden))  # the text encoder is not trained through durations
    if speaker is not None:
        text = text + predictor.cond(torch.detach(speaker))
    text = predictor.conv_proj(predictor.conv_dds(text, mask)) * mask
    given = predictor.post_conv_pre(durations)
    given = predictor.post_conv_proj(predictor.post_conv_dds(given, mask)) * mask

    noise = torch.randn(durations.shape[0], 2, durations.shape[2], device=hidden.device, dtype=hidden.dtype) * mask
    z_q, log_det_q = vits_order_flows(predictor.post_flows, noise, mask, text + given)
    z_u, z_1 = torch.split(z_q, [1, 1], dim=1)
    log_det_q = log_det_q + torch.sum((F.logsigmoid(z_u) + F.logsigmoid(-z_u)) * mask, [1, 2])
    log_q = torch.sum(-0.5 * (LOG_2PI + noise**2) * mask, [1, 2]) - log_det_q

    z_0 = torch.log(torch.clamp_min((durations - torch.sigmoid(z_u)) * mask, 1e-5)) * mask  # the log flow
    log_det = torch.sum(-z_0, [1, 2])
    z, flows_log_det = vits_order_flows(predictor.flows, torch.cat([z_0, z_1], dim=1), mask, text)
    nll = torch.sum(0.5 * (LOG_2PI + z**2) * mask, [1, 2]) - (log_det + flows_log_det)
    return nll + log_q
