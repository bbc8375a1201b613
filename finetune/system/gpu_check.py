"""A card the machine has but PyTorch cannot use: said before hours of training go to the CPU instead.

`--device auto` trains on the CPU when CUDA does not answer. Where `nvidia-smi` lists a card, that is
nearly always a broken install (a CPU build of PyTorch, a driver older than the build needs) and a 9.5 hour
budget spent at a CPU's pace (an MMS-size step takes about 18 s there against 0.2 s on a GPU). So a run
asks `nvidia-smi -L` (bounded: it can hang on a wedged driver) and refuses with the fix, unless the user
asked for the CPU.
"""

from __future__ import annotations

import shutil
import subprocess

import torch

NVIDIA_SMI_TIMEOUT_S = 10.0


def listed_cards() -> list[str]:
    """The cards `nvidia-smi -L` lists ("GPU 0: NVIDIA GeForce RTX 2070 (UUID: ...)"); none when it is
    missing, fails or does not answer in time."""
    program = shutil.which("nvidia-smi")
    if program is None:
        return []
    try:
        done = subprocess.run(
            [program, "-L"], capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    if done.returncode != 0:
        return []
    return [line.strip() for line in done.stdout.splitlines() if line.strip().startswith("GPU ")]


def why_unusable() -> tuple[str, str]:
    """Why this PyTorch cannot use CUDA, and the fix, in words."""
    version = torch.__version__
    if torch.version.cuda is None:
        return (
            f"PyTorch {version} is a CPU build",
            "install its CUDA build (make setup TORCH_BUILD=cuda, or pip install torch from PyPI in a fresh venv)",
        )
    try:
        torch.cuda.init()
    except (RuntimeError, AssertionError) as error:  # torch's own words: an old driver, no device visible
        cause = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return (
            f"PyTorch {version} (CUDA {torch.version.cuda}) cannot start CUDA: {cause}",
            "update the NVIDIA driver to one this build supports, or install a PyTorch build for the driver you have",
        )
    return (
        f"PyTorch {version} (CUDA {torch.version.cuda}) sees no usable device",
        "check CUDA_VISIBLE_DEVICES and that the driver works (nvidia-smi)",
    )


def unusable_card_problem() -> str | None:
    """The error a training run on `--device auto` gives when nvidia-smi lists a card that torch cannot use;
    None when CUDA works or no card is listed."""
    if torch.cuda.is_available():
        return None
    cards = listed_cards()
    if not cards:
        return None
    cause, fix = why_unusable()
    return (
        f"--device auto: nvidia-smi lists {cards[0]}{f' and {len(cards) - 1} more' if len(cards) > 1 else ''}, but "
        f"{cause}, so training would run on the CPU, many times slower. Fix: {fix}; or pass --device cpu to "
        "train on the CPU anyway"
    )
