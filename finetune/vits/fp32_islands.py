"""fp32 islands: the parts of the VITS objective that must not run in half precision under autocast.

Under fp16/bf16 autocast the encoders, the decoder and the discriminator run in half precision; these run
in fp32 whatever the caller's autocast says: the flow (its log-determinants sum over thousands of
frames), the duration predictor (its spline flows take exp and divisions of small widths), the alignment
search, the KL (exp(-2 logs_p) overflows fp16 above 65504, i.e. logs_p < -5.5), every loss term (sums of
many squares), and the spectrograms (finetune/data/features.py turns autocast off itself: an STFT's power
reaches 1e5 on loud audio). Tests hold them to it (tests/test_precision.py).

Cost: the islands are a small share of a step's arithmetic; the convolutions of the decoder and the
discriminator, which are most of it, stay in half precision.
"""

from __future__ import annotations

import functools

import torch


def fp32(device: torch.device):
    """A block in which autocast is off on `device`: the code inside sees fp32 unless given something else."""
    return torch.autocast(device_type=device.type, enabled=False)


def _first_tensor(values) -> torch.Tensor | None:
    for value in values:
        if isinstance(value, torch.Tensor):
            return value
        if isinstance(value, (list, tuple)):
            found = _first_tensor(value)
            if found is not None:
                return found
    return None


def in_fp32(function):
    """Decorator: `function` runs with autocast off on the device of its first tensor argument (lists of
    tensors are looked into). The function itself casts its inputs to fp32 (`.float()`): half-precision
    tensors made before the island stay half until it does."""

    @functools.wraps(function)
    def island(*args, **kwargs):
        tensor = _first_tensor([*args, *kwargs.values()])
        if tensor is None:
            return function(*args, **kwargs)
        with fp32(tensor.device):
            return function(*args, **kwargs)

    return island
