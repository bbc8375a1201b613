"""The number format a run trains in: fp32, or fp16 (the CUDA default: autocast with gradient scalers) or bf16
(autocast, no scaler). On the CPU half precision runs only when asked, for checking numerics before a GPU run.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Precision:
    name: str  # "fp32", "fp16" or "bf16"
    autocast_dtype: torch.dtype | None  # None: no autocast

    @property
    def uses_scaler(self) -> bool:
        return self.autocast_dtype == torch.float16


CPU_HALF_WARNING = (
    "{name} on the CPU is meant for checking numerics before a GPU run, and slow (fp16 convolutions "
    "have no fast kernels on most CPUs); leave out --fp16/--bf16 to train on the CPU in fp32"
)


def resolve_precision(device: torch.device, fp16: bool | None, bf16: bool) -> Precision:
    """fp16 is the default on CUDA; the CPU defaults to fp32 and runs fp16 or bf16 only when asked (for
    checking numerics: fp16 has the same range and rounding on any device); precision_warning says so."""
    if bf16:
        return Precision("bf16", torch.bfloat16)
    if fp16 or (fp16 is None and device.type == "cuda"):
        return Precision("fp16", torch.float16)
    return Precision("fp32", None)


def precision_warning(device: torch.device, precision: Precision) -> str:
    """The one line to log when half precision runs on the CPU; empty otherwise."""
    if device.type == "cpu" and precision.autocast_dtype is not None:
        return CPU_HALF_WARNING.format(name=precision.name)
    return ""
