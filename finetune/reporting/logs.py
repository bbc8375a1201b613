"""What a run tells its user: a log (console and train.log), metrics.jsonl, and the progress line.

On a terminal a tqdm bar shows steps with the key figures; in a log or pipe, one plain labelled line
is printed every `every_s` seconds. train.log always gets the plain lines. metrics.jsonl gets one JSON
object per progress line, per evaluation, and for the plan and the end of the run.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

import psutil
import torch
from tqdm import tqdm

from finetune.system.disk import OPTIONAL, is_write_failure
from finetune.system.progress import format_duration


class LogFileHandler(logging.FileHandler):
    """train.log that a full disk cannot turn into a traceback: logging's own handler prints one per
    failed line to stderr. A line that cannot be written is dropped (the console still has it), said once."""

    def handleError(self, record: logging.LogRecord) -> None:
        error = sys.exc_info()[1]
        if error is None or not is_write_failure(error):
            return super().handleError(record)
        OPTIONAL.failed(
            "train.log lines",
            Path(self.baseFilename).parent,
            error,
            lambda line: print(line, file=sys.stderr, flush=True),
        )

    def close(self) -> None:
        try:
            super().close()
        except OSError:  # the lines still buffered had no room; they were said on the console
            self.stream = None


def setup_logging(run_dir: Path, name: str = "finetune", rank: int = 0) -> logging.Logger:
    """Messages to stdout and to run_dir/train.log (appending, so a resumed run continues the file). In a
    data-parallel run the other processes print only their warnings and errors, marked with their rank."""
    logger = logging.getLogger(name)
    logger.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
        handler.close()
    console = logging.StreamHandler(sys.stdout)
    console.setFormatter(logging.Formatter("%(message)s" if rank == 0 else f"[rank {rank}] %(message)s"))
    logger.addHandler(console)
    if rank == 0:
        OPTIONAL.warned.clear()  # a new run says each skipped kind of write again
        logfile = LogFileHandler(run_dir / "train.log", encoding="utf-8")
        logfile.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%Y-%m-%d %H:%M:%S"))
        logger.addHandler(logfile)
    logger.propagate = False
    return logger


class Metrics:
    """Appends JSON lines to metrics.jsonl, flushing each so a crash loses nothing written. A line that
    cannot be written (a full disk) is cut off again (no half line is left) and skipped, said once: the
    run matters more than its record."""

    def __init__(self, path: Path, enabled: bool = True):
        self.path, self.enabled = path, enabled

    def write(self, kind: str, **values) -> None:
        if not self.enabled:
            return
        line = json.dumps({"kind": kind, **values}, ensure_ascii=False) + "\n"
        size = self.path.stat().st_size if self.path.is_file() else 0
        try:
            with open(self.path, "a", encoding="utf-8") as handle:
                handle.write(line)
        except OSError as error:
            self._cut_back(size)
            OPTIONAL.failed("metrics.jsonl lines", self.path.parent, error, logging.getLogger("finetune").warning)

    def _cut_back(self, size: int) -> None:
        try:
            os.truncate(self.path, size)
        except OSError:
            pass  # the reader skips a half line (finetune/reporting/run_report.py); nothing more can be done


def memory_text(device: torch.device) -> str:
    """'VRAM 3.1/8.0 GiB' on CUDA (in use by the process / total), 'RAM 1.2 GiB' (this process) on CPU."""
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return f"VRAM {(total - free) / 2**30:.1f}/{total / 2**30:.1f} GiB"
    return f"RAM {psutil.Process().memory_info().rss / 2**30:.2f} GiB"


def peak_memory(device: torch.device) -> dict:
    if device.type == "cuda":
        return {"peak_vram_gib": round(torch.cuda.max_memory_allocated(device) / 2**30, 3)}
    return {"rss_gib": round(psutil.Process().memory_info().rss / 2**30, 3)}


SHORT_NAMES = {
    "mel": "mel",
    "kl": "kl",
    "duration": "dur",
    "adversarial": "adv",
    "feature_matching": "fm",
    "generator": "gen",
    "discriminator": "disc",
}


def progress_line(
    step: int,
    total: int,
    epoch: float,
    epochs: float,
    losses: dict[str, float],
    lr: float,
    samples_per_s: float,
    memory: str,
    epoch_eta_s: float,
    run_eta_s: float,
    deadline_s: float,
) -> str:
    terms = " ".join(f"{SHORT_NAMES.get(k, k)} {v:.3f}" for k, v in losses.items())
    planned = (
        f"step {step}/{total} | epoch {epoch:.2f}/{epochs:.1f}"
        if total
        else f"step {step} (benchmark) | epoch {epoch:.2f}"
    )
    return (
        f"{planned} | {terms} | lr {lr:.2e} | "
        f"{samples_per_s:.1f} samples/s | {memory} | epoch ETA {format_duration(epoch_eta_s)} | "
        f"ETA {format_duration(run_eta_s)} | deadline in {format_duration(deadline_s)}"
    )


class ProgressDisplay:
    """tqdm on a terminal, plain lines otherwise; both write plain lines to the log file."""

    def __init__(self, logger: logging.Logger, total: int, initial: int, every_s: float):
        self.logger, self.every_s = logger, every_s
        self.bar = tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True) if sys.stderr.isatty() else None
        self.last_line_s = -float("inf")

    def step(self, now_s: float, line: str, postfix: str, advance: bool = True) -> bool:
        """Advance one step (or not, for work that is not an optimizer step of the plan); returns True
        when a plain line was due (and written)."""
        if self.bar is not None:
            if advance:
                self.bar.update(1)
            self.bar.set_postfix_str(postfix, refresh=False)
        if now_s - self.last_line_s < self.every_s:
            return False
        self.last_line_s = now_s
        if self.bar is not None:
            for handler in self.logger.handlers:  # the bar owns the terminal: the line goes to the file only
                if isinstance(handler, logging.FileHandler):
                    handler.emit(logging.LogRecord(self.logger.name, logging.INFO, "", 0, line, None, None))
        else:
            self.logger.info(line)
        return True

    def set_total(self, total: int) -> None:
        if self.bar is not None:
            self.bar.total = total
            self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
