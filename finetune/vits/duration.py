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
Our own too: the spline of each ConvFlow (`conv_flow`), the same values computed without the boolean
indexing that makes the host wait for the GPU (tests/test_duration.py holds both to transformers').

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
        if index == 0:
            z, step_log_det = flow(z, mask, global_conditioning=conditioning)
        else:
            z, step_log_det = conv_flow(flow, z, mask, conditioning)
        log_det = log_det + step_log_det
        if index > 0:
            z = torch.flip(z, [1])
    return z, log_det


def conv_flow(
    flow, z: torch.Tensor, mask: torch.Tensor, conditioning: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' VitsConvFlow forwards (reverse=False), its spline computed without a device sync.

    transformers picks the positions inside the spline's interval by boolean indexing (eight gathers and
    scatters a flow, forwards and backwards) and checks the range with a tensor compare read on the host:
    on CUDA each of those waits for the GPU (nonzero, item), about 140 waits a micro-batch of the MMS
    predictor (8 flows) that keep the CPU from queueing the next kernels while the GPU works.
    `rational_quadratic_spline` computes every position and chooses with torch.where: the same values."""
    first, second = torch.split(z, [flow.half_channels] * 2, dim=1)
    hidden = flow.conv_dds(flow.conv_pre(first), mask, conditioning)
    hidden = flow.conv_proj(hidden) * mask
    batch, channels, length = first.shape
    hidden = hidden.reshape(batch, channels, -1, length).permute(0, 1, 3, 2)  # [batch, channels, tokens, 3 bins - 1]
    bins, scale = flow.num_bins, math.sqrt(flow.filter_channels)
    second, log_abs_det = rational_quadratic_spline(
        second,
        hidden[..., :bins] / scale,
        hidden[..., bins : 2 * bins] / scale,
        hidden[..., 2 * bins :],
        flow.tail_bound,
    )
    return torch.cat([first, second], dim=1) * mask, torch.sum(log_abs_det * mask, [1, 2])


def rational_quadratic_spline(
    x: torch.Tensor,
    raw_widths: torch.Tensor,
    raw_heights: torch.Tensor,
    raw_derivatives: torch.Tensor,
    tail_bound: float,
    min_width: float = 1e-3,
    min_height: float = 1e-3,
    min_derivative: float = 1e-3,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The monotonic rational-quadratic spline of Durkan et al. (2019) on [-tail_bound, tail_bound], the
    identity outside (log-determinant 0 there), forwards: transformers' `_unconstrained_rational_quadratic_spline`
    arithmetic at every position of x [...], with raw_widths and raw_heights [..., bins] and
    raw_derivatives [..., bins - 1] (the inner knots; the outer two are fixed so that the slope is 1 at the
    bounds). Returns (y, log |dy/dx|), both shaped like x."""
    inside = (x >= -tail_bound) & (x <= tail_bound)
    # Outside (and NaN) the spline runs on 0, a point inside: its value there is never used, only kept finite,
    # and a NaN would find no bin (index -1: an out-of-bounds gather, on CUDA a device assert).
    x_in = torch.where(inside, x, torch.zeros_like(x))
    bins = raw_widths.shape[-1]
    outer = math.log(math.exp(1 - min_derivative) - 1)  # softplus^-1(1 - min_derivative): slope 1 at the bounds
    derivatives = min_derivative + F.softplus(F.pad(raw_derivatives, (1, 1), value=outer))

    def knots(raw: torch.Tensor, smallest: float) -> tuple[torch.Tensor, torch.Tensor]:
        """Cumulative knot positions [..., bins + 1] from -tail_bound to tail_bound, and the bin sizes."""
        sizes = smallest + (1 - smallest * bins) * F.softmax(raw, dim=-1)
        inner = (2 * tail_bound) * torch.cumsum(sizes, dim=-1)[..., :-1] - tail_bound
        ends = inner.new_full((*inner.shape[:-1], 1), tail_bound)
        cumulative = torch.cat([-ends, inner, ends], dim=-1)
        return cumulative, cumulative[..., 1:] - cumulative[..., :-1]

    cum_widths, widths = knots(raw_widths, min_width)
    cum_heights, heights = knots(raw_heights, min_height)
    above = torch.cat([cum_widths[..., :-1], cum_widths[..., -1:] + 1e-6], dim=-1)  # x = tail_bound: the last bin
    index = (torch.sum(x_in[..., None] >= above, dim=-1) - 1)[..., None]

    def at(values: torch.Tensor) -> torch.Tensor:
        return values.gather(-1, index)[..., 0]

    slopes = heights / widths
    x_0, width, y_0, height, slope = at(cum_widths), at(widths), at(cum_heights), at(heights), at(slopes)
    d_0, d_1 = at(derivatives), at(derivatives[..., 1:])
    theta = (x_in - x_0) / width
    between = theta * (1 - theta)
    denominator = slope + (d_0 + d_1 - 2 * slope) * between
    y = y_0 + height * (slope * theta.pow(2) + d_0 * between) / denominator
    numerator = slope.pow(2) * (d_1 * theta.pow(2) + 2 * slope * between + d_0 * (1 - theta).pow(2))
    log_abs_det = torch.log(numerator) - 2 * torch.log(denominator)
    return torch.where(inside, y, x), torch.where(inside, log_abs_det, torch.zeros_like(log_abs_det))


def stochastic_duration_nll(
    predictor, hidden: torch.Tensor, mask: torch.Tensor, durations: torch.Tensor, speaker: torch.Tensor | None = None
) -> torch.Tensor:
    """Negative log-likelihood bound of the aligned `durations` (frames per token) under a transformers
    VitsStochasticDurationPredictor, per clip [batch]; `speaker` is the global conditioning g [batch,
    embedding, 1] of a multi-speaker model (added after conv_pre, detached, as transformers does)."""
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
