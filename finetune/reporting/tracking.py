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
import logging
from pathlib import Path

import numpy as np

from finetune.system.disk import OPTIONAL

TRACKERS = ("auto", "tensorboard", "wandb", "none")


def installed(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


def check_trackers(names: list[str]) -> list[str]:
    """Problems with --report_to, each saying what to do."""
    problems = [f"--report_to {n}: unknown; choose from {', '.join(TRACKERS)}" for n in names if n not in TRACKERS]
    for name, package in (("tensorboard", "tensorboard"), ("wandb", "wandb")):
        if name in names and not installed(package):
            problems.append(
                f"--report_to {name}: the {package} package is not installed (pip install {package}), or leave it out"
            )
    return problems


def quiet_writer_threads() -> None:
    """TensorBoard writes its event file from a thread of its own; on a full disk that thread dies with
    an OSError that Python prints as a traceback, and the next call raises it again (caught in Tracker).
    Only that thread's write failures are silenced here; every other thread's errors print as before."""
    import threading

    previous = threading.excepthook
    if getattr(previous, "quiet_writer_threads", False):
        return

    def hook(args) -> None:
        if type(args.thread).__name__ == "_AsyncWriterThread" and isinstance(args.exc_value, OSError):
            return
        previous(args)

    hook.quiet_writer_threads = True
    threading.excepthook = hook


class TensorBoardSink:
    def __init__(self, folder: Path):
        from torch.utils.tensorboard import SummaryWriter

        quiet_writer_threads()
        self.folder = folder
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
    """Fans each figure out to the trackers in use (none at all is fine). A tracker whose files cannot be
    written (a full disk) is dropped for the rest of the run, said once; training goes on."""

    def __init__(self, sinks: list | None = None):
        self.sinks = sinks or []

    def _each(self, call) -> None:
        for sink in list(self.sinks):
            try:
                call(sink)
            except OSError as error:
                self.sinks.remove(sink)
                folder = getattr(sink, "folder", Path("."))
                OPTIONAL.failed(
                    f"{type(sink).__name__.removesuffix('Sink')} files",
                    folder,
                    error,
                    logging.getLogger("finetune").warning,
                )

    @property
    def names(self) -> list[str]:
        return [type(s).__name__.removesuffix("Sink").lower() for s in self.sinks]

    def scalars(self, step: int, values: dict[str, float], prefix: str = "") -> None:
        clean = {f"{prefix}{k}": float(v) for k, v in values.items() if v is not None and np.isfinite(v)}
        self._each(lambda sink: sink.scalars(step, clean))

    def audio(self, step: int, name: str, wave: np.ndarray, sample_rate: int) -> None:
        self._each(lambda sink: sink.audio(step, name, wave, sample_rate))

    def image(self, step: int, name: str, rgb: np.ndarray) -> None:
        self._each(lambda sink: sink.image(step, name, rgb))

    def close(self) -> None:
        self._each(lambda sink: sink.close())


def open_tracker(names: list[str], run_dir: Path, config: dict, is_main: bool = True) -> Tracker:
    if not is_main or "none" in names:
        return Tracker()
    sinks = []
    if "tensorboard" in names or ("auto" in names and installed("tensorboard")):
        try:
            sinks.append(TensorBoardSink(run_dir / "tensorboard"))
        except OSError as error:
            OPTIONAL.failed("TensorBoard files", run_dir, error, logging.getLogger("finetune").warning)
    if "wandb" in names:
        sinks.append(WandbSink(run_dir, config))
    return Tracker(sinks)
