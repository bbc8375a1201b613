"""Where a run's figures go besides train.log and metrics.jsonl: TensorBoard and Weights & Biases.

Both are optional. `--report_to auto` (the default) writes TensorBoard event files to RUN_DIR/tensorboard
when the `tensorboard` package is installed, and nothing more otherwise; naming a tracker that is not
installed is an error that says what to install. Only the main process of a data-parallel run writes.

What is written: every loss term, both learning rates, both gradient norms, samples/s and memory, each
step (under fp16 also the gradient scalers' loss scales and the steps they skipped on overflow); each
evaluation's MCD, length ratio, duration error and validation losses, the test sentences as audio, and a
generated-vs-recorded mel image; the step profile's shares at the end.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

TRACKERS = ("auto", "tensorboard", "wandb", "none")


def installed(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


def check_trackers(names: list[str]) -> list[str]:
    """Problems with --report_to, each saying what to do."""
    problems = [f"--report_to {n}: unknown; choose from {', '.join(TRACKERS)}" for n in names if n not in TRACKERS]
    for name, package in (("tensorboard", "tensorboard"), ("wandb", "wandb")):
        if name in names and not installed(package):
            problems.append(f"--report_to {name}: the {package} package is not installed (pip install {package}), "
                            "or leave it out")
    return problems


class TensorBoardSink:
    def __init__(self, folder: Path):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(folder))

    def scalars(self, step: int, values: dict[str, float]) -> None:
        for name, value in values.items():
            self.writer.add_scalar(name, value, step)

    def audio(self, step: int, name: str, wave: np.ndarray, sample_rate: int) -> None:
        self.writer.add_audio(name, np.clip(wave, -1.0, 1.0)[None, :], step, sample_rate=sample_rate)

    def image(self, step: int, name: str, rgb: np.ndarray) -> None:
        self.writer.add_image(name, rgb, step, dataformats="HWC")

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    def __init__(self, folder: Path, config: dict):
        import wandb

        self.wandb = wandb
        self.run = wandb.init(dir=str(folder), config=config, name=folder.parent.name, reinit=True)

    def scalars(self, step: int, values: dict[str, float]) -> None:
        self.run.log(values, step=step)

    def audio(self, step: int, name: str, wave: np.ndarray, sample_rate: int) -> None:
        self.run.log({name: self.wandb.Audio(wave, sample_rate=sample_rate)}, step=step)

    def image(self, step: int, name: str, rgb: np.ndarray) -> None:
        self.run.log({name: self.wandb.Image(rgb)}, step=step)

    def close(self) -> None:
        self.run.finish()


class Tracker:
    """Fans each figure out to the trackers in use (none at all is fine)."""

    def __init__(self, sinks: list | None = None):
        self.sinks = sinks or []

    @property
    def names(self) -> list[str]:
        return [type(s).__name__.removesuffix("Sink").lower() for s in self.sinks]

    def scalars(self, step: int, values: dict[str, float], prefix: str = "") -> None:
        clean = {f"{prefix}{k}": float(v) for k, v in values.items() if v is not None and np.isfinite(v)}
        for sink in self.sinks:
            sink.scalars(step, clean)

    def audio(self, step: int, name: str, wave: np.ndarray, sample_rate: int) -> None:
        for sink in self.sinks:
            sink.audio(step, name, wave, sample_rate)

    def image(self, step: int, name: str, rgb: np.ndarray) -> None:
        for sink in self.sinks:
            sink.image(step, name, rgb)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


def open_tracker(names: list[str], run_dir: Path, config: dict, is_main: bool = True) -> Tracker:
    if not is_main or "none" in names:
        return Tracker()
    sinks = []
    if "tensorboard" in names or ("auto" in names and installed("tensorboard")):
        sinks.append(TensorBoardSink(run_dir / "tensorboard"))
    if "wandb" in names:
        sinks.append(WandbSink(run_dir, config))
    return Tracker(sinks)
