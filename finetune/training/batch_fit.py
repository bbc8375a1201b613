"""Fitting the micro-batch to the device's memory: a probe before training, and refits during it.

Before training (on CUDA; `--fit_batch on` anywhere, off with `--fit_batch off`), the longest clips of
the corpus are tried once as one micro-batch of the asked size: the optimizers' states are created
(their memory is there while every later step runs), then the generator and the discriminator run
forward and backward, then the update's own temporaries. On an out-of-memory error the micro-batch
halves and the accumulation grows to match (same clips per optimizer step: the sampler serves each
batch of the asked size as smaller micro-batches), down to 1; each refit is logged, kept in the
training state (so checkpoints hold it and a resumed run continues with it) and written into plan.json.
A micro-batch of 1 that still does not fit stops the run before any work: a smaller batch cannot help.

The probe must not train: the gradients are discarded; the optimizers it gave a state lose it again
(it was made by an update at learning rate 0 on zero gradients, which leaves every weight as it was,
bit for bit); the models' buffers, the learning rates and every random generator are put back. So a
run with the probe trains exactly as one without it.

During training, the first out-of-memory error (in a window's forward or backward, or in the optimizer
update) refits the same way at once: a window is then run again from its start at the smaller micro-batch
(same clips, same random state: the loop rewinds it, finetune/training/window.py); an update that failed
half way still goes back to the last good state (finetune/training/recovery.py). After it, one error is
taken for a rare long batch: its window is skipped. But they are bounded: the OOM_WINDOWS_PER_REFIT-th
skipped since the last refit refits again, and at one clip a micro-batch (nothing smaller left) the run
stops there, with what to do, instead of draining the budget window by window.

Memory: the probe's peak is a real step's peak (states, gradients, activations of the longest clips),
so it costs about one step's time, once per process start.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from finetune.data.examples import Batch, Example, collate
from finetune.training.budget import Durations, StepTimer
from finetune.training.checkpoint_file import capture_rng, restore_rng

FIT_BATCH_CHOICES = ("auto", "on", "off")
OOM_WINDOWS_PER_REFIT = 3  # out-of-memory windows after a refit before the next one (at one clip: the stop)
OUT_OF_MEMORY_ADVICE = (
    "freeze parts (--freeze posterior_encoder), use a narrower --discriminator_width, prepare "
    "with a lower --max_seconds, or a GPU with more memory"
)


def probe_enabled(fit_batch: str, device: torch.device) -> bool:
    """--fit_batch auto: on with CUDA (where memory runs out), off on the CPU (where the OS swaps or kills)."""
    if fit_batch not in FIT_BATCH_CHOICES:
        raise ValueError(f"--fit_batch {fit_batch}: choose from {', '.join(FIT_BATCH_CHOICES)}")
    return fit_batch == "on" or (fit_batch == "auto" and device.type == "cuda")


def smaller_micro_batch(micro_batch: int) -> int | None:
    """Half the micro-batch (rounded down), or None when it is 1 already."""
    return micro_batch // 2 if micro_batch > 1 else None


def accumulation_for(batch_size: int, accumulation: int, micro_batch: int) -> int:
    """Micro-batches per optimizer step when each batch of `batch_size` comes as micro-batches of
    `micro_batch`: the asked accumulation times the pieces a batch is split into (4 -> 2 doubles it)."""
    return accumulation * math.ceil(batch_size / micro_batch)


def longest_batch(examples: list[Example], micro_batch: int, hop: int, device: torch.device) -> Batch:
    """The `micro_batch` longest clips as one batch on the device: the largest a micro-batch can be."""
    longest = sorted(examples, key=lambda e: e.frame_count(hop), reverse=True)[:micro_batch]
    return collate(longest, hop).to(device)


@dataclass
class ProbeRestore:
    """What a probe changes and must put back: random state, buffers, learning rates, and which
    optimizers had no state yet (their state is made by the probe and cleared after it)."""

    rng: dict
    buffers: list[tuple[torch.Tensor, torch.Tensor]]  # (buffer, copy)
    learning_rates: list[tuple[dict, float]]  # (param group, lr)
    fresh: list[torch.optim.Optimizer]

    @classmethod
    def take(cls, train_step) -> "ProbeRestore":
        modules = (train_step.model, train_step.discriminator)
        buffers = [(b, b.detach().clone()) for m in modules for b in m.buffers()]
        optimizers = (train_step.optimizer_g, train_step.optimizer_d)
        rates = [(g, g["lr"]) for o in optimizers for g in o.param_groups]
        return cls(capture_rng(), buffers, rates, [o for o in optimizers if not o.state])

    def put_back(self, train_step) -> None:
        train_step.zero_grad()
        for optimizer in self.fresh:
            optimizer.state.clear()
        for group, lr in self.learning_rates:
            group["lr"] = lr
        with torch.no_grad():
            for buffer, copy in self.buffers:
                buffer.copy_(copy)
        restore_rng(self.rng)


def _update_at_rate_zero(optimizers: list[torch.optim.Optimizer]) -> None:
    """An AdamW update on zero gradients at learning rate 0: makes the optimizers' states (and runs the
    update's temporaries) while every weight stays exactly as it was (p * (1 - 0 * decay) + 0)."""
    for optimizer in optimizers:
        params = [p for g in optimizer.param_groups for p in g["params"]]
        for param in params:
            if param.grad is None:
                param.grad = torch.zeros_like(param)
            else:
                param.grad.zero_()
        for group in optimizer.param_groups:
            group["lr"] = 0.0
        optimizer.step()


def try_micro_batch(train_step, batch: Batch) -> str:
    """One probe step on `batch`: "" when it fits, else the out-of-memory error's first line. Leaves the
    models, optimizers and random state as they were."""
    saved = ProbeRestore.take(train_step)
    error = ""
    try:
        _update_at_rate_zero(saved.fresh)  # the states first: they are there while every step runs
        train_step.accumulate(batch, 1.0, generator=True)  # gradients stay local until apply: a local probe
        _update_at_rate_zero(saved.fresh)  # the update's temporaries, with the gradients still there
        if train_step.device.type == "cuda":
            torch.cuda.synchronize(train_step.device)
    except torch.OutOfMemoryError as caught:  # torch.cuda.OutOfMemoryError is this type
        error = str(caught).strip().splitlines()[0] if str(caught).strip() else "out of memory"
    saved.put_back(train_step)  # after the except block: the traceback's frames (and tensors) are gone
    if train_step.device.type == "cuda":
        torch.cuda.empty_cache()
    return error


class BatchFitter:
    """The micro-batch a run trains at: as asked, fitted before training (the probe), refitted once during
    it. What it decided is the training state's (`BatchFit`: checkpoints hold it, a resumed run continues
    with it); the asked --batch_size and accumulation stay as they were."""

    def __init__(self, settings, fitted, step, sampler, feed, timer: StepTimer, run_log):
        """`settings`: finetune/training/run_settings.py BatchSettings; `fitted`: the state's BatchFit."""
        self.settings, self.fitted, self.step, self.sampler, self.feed = settings, fitted, step, sampler, feed
        self.timer, self.run_log = timer, run_log
        self.exhausted = False  # out of memory too often at one clip a micro-batch: the run stops (after_out_of_memory)
        if fitted.micro_batch and not fitted.accumulation:  # a checkpoint written before the accumulation was kept
            fitted.accumulation = accumulation_for(settings.batch_size, settings.accumulation, fitted.micro_batch)
        if fitted.micro_batch and fitted.micro_batch != settings.batch_size:  # a resumed run: as its checkpoint
            self.apply(fitted.micro_batch)

    @property
    def micro_batch(self) -> int:
        return self.fitted.micro_batch or self.settings.batch_size

    @property
    def accumulation(self) -> int:
        return self.fitted.accumulation or self.settings.accumulation

    def apply(self, micro_batch: int) -> None:
        """Run at `micro_batch` clips per micro-batch from now on, with the accumulation that keeps the
        asked clips per optimizer step; the current epoch continues where it was."""
        repeated = self.sampler.set_micro_batch(micro_batch)
        if repeated:
            self.run_log.logger.warning(
                f"warning: {repeated} clips of this epoch come again (the new micro-batches "
                "start at the boundary before the old position)"
            )
        self.feed.restart()
        previous_s = self.timer.micro_batches.cautious_s if self.timer.micro_batches.ready else None
        self.fitted.micro_batch = micro_batch
        self.fitted.accumulation = accumulation_for(self.settings.batch_size, self.settings.accumulation, micro_batch)
        self.timer.accumulation, self.timer.clips = self.fitted.accumulation, micro_batch
        # A smaller micro-batch takes no longer than a bigger one: the old figure is a safe first guess.
        self.timer.micro_batches = Durations(skip=self.timer.micro_batches.skip, prior_s=previous_s)

    def refit(self, micro_batch: int, why: str, steps_done: int) -> None:
        before = (self.micro_batch, self.accumulation)
        self.apply(micro_batch)
        self.fitted.refits.append(
            {"step": steps_done, "from": before[0], "to": micro_batch, "accumulation": self.accumulation, "why": why}
        )
        self.run_log.logger.warning(
            f"warning: {why}: micro-batch {before[0]} -> {micro_batch} clips, gradient accumulation {before[1]} -> "
            f"{self.accumulation} (the same {self.settings.batch_size * self.settings.accumulation} clips a step)"
        )
        self.run_log.event(
            "batch_refit", step=steps_done, micro_batch=micro_batch, accumulation=self.accumulation, why=why
        )

    def fit_before_training(self, steps_done: int) -> bool:
        """The probe (when on): refit until the longest clips fit. False when not even one clip fits."""
        step = self.step
        if not probe_enabled(self.settings.fit_batch, step.device):
            return True
        while True:
            batch = longest_batch(self.feed.examples, self.micro_batch, self.feed.hop, step.device)
            error = try_micro_batch(step, batch)
            if not step.dist.any(bool(error)):
                self.run_log.logger.info(
                    f"batch fit: {len(batch)} clips of up to {int(batch.frame_lengths.max())} "
                    "frames fit in one micro-batch (forward, backward and update tried)"
                )
                return True
            smaller = smaller_micro_batch(self.micro_batch)
            if smaller is None:
                self.run_log.logger.error(
                    f"error: one clip at a time does not fit in GPU memory (the longest, {int(batch.frame_lengths.max())} "
                    f"frames: {error}); a smaller --batch_size cannot help: {OUT_OF_MEMORY_ADVICE}; nothing was trained"
                )
                return False
            where = error or "in another process"
            self.refit(
                smaller, f"out of memory on {len(batch)} of the longest clips before training ({where})", steps_done
            )

    def after_out_of_memory(self) -> str:
        """What an out-of-memory error during training calls for: "refit" (the first of the run's training, or
        the OOM_WINDOWS_PER_REFIT-th since the last refit), "skip" (its window), or "give_up" (as many at one
        clip a micro-batch: no smaller one is left)."""
        fitted, smaller = self.fitted, smaller_micro_batch(self.micro_batch)
        if not fitted.refit_in_training and smaller is not None:
            return "refit"
        fitted.oom_since_refit += 1
        if fitted.oom_since_refit < OOM_WINDOWS_PER_REFIT:
            return "skip"
        self.exhausted = smaller is None
        return "give_up" if self.exhausted else "refit"

    def refit_in_training(self, what: str, step_number: int) -> None:
        """Half the micro-batch after out-of-memory errors in training (when after_out_of_memory says so)."""
        repeated = self.fitted.oom_since_refit
        self.fitted.refit_in_training, self.fitted.oom_since_refit = True, 0
        self.refit(
            smaller_micro_batch(self.micro_batch),
            f"out of memory during training at step {step_number} ({what})"
            + (f"; {repeated} windows ran out of memory since the last refit" if repeated else ""),
            step_number - 1,
        )

    def summary(self) -> dict:
        """For plan.json and the run's summary."""
        return {
            "batch_size": self.settings.batch_size,
            "micro_batch": self.micro_batch,
            "gradient_accumulation_steps": self.accumulation,
            "batch_refits": list(self.fitted.refits),
        }
