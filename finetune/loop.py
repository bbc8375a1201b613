"""The training loop shared by train_vits.py and train_feedback.py.

    benchmark  the first optimizer steps (--benchmark_samples clips) are ordinary training steps, timed
               after the first two; with the timed baseline evaluation and the timed first checkpoint
               they give the plan (plan.json): how many steps fit, how often to evaluate
    train      before each step the budget says whether it fits and whether another would; the step
               that leaves no room for another is the last, and its learning rate is the floor.
               Evaluations keep the best model (checkpoints/best_model/); checkpoints at each epoch end
               and every --checkpoint_every_minutes; the plan is re-estimated at each evaluation
    finish     a final evaluation (unless the last one saw these weights), the final export and a
               checkpoint, all inside the budget

Ctrl-C or SIGTERM: the current step finishes, a checkpoint is written, and the loop returns
"interrupted". Data comes through a DataLoader over the sampler's remaining batches; the sampler's
position moves only when the loop takes a batch, so a checkpoint never skips or repeats data.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Callable

import torch
from torch.utils.data import DataLoader

from .atomic import write_text_atomic
from .budget import Budget, Plan, StepTimer, learning_rate, make_plan
from .checkpoint import TrainingState, capture_rng, checkpoint_name, save_checkpoint
from .data import Batch, Example, collate
from .distributed import Distributed
from .evaluation import EvalResult, Evaluator
from .generator import export_model, train_mode
from .interrupt import StopRequest
from .reporting import Metrics, ProgressDisplay, memory_text, peak_memory, progress_line
from .sampler import BucketSampler
from .step import StepResult, TrainStep


@dataclass
class LoopConfig:
    batch_size: int
    accumulation: int
    learning_rate: float
    discriminator_learning_rate: float
    lr_floor_ratio: float
    warmup_steps: int
    benchmark_samples: int
    eval_every: int  # 0: planned
    max_epochs: int  # 0: no cap
    early_stopping_patience: int  # evaluations without improvement; 0: off
    keep_checkpoints: int
    checkpoint_every_s: float
    log_every_s: float
    discriminator_warmup_steps: int  # steps before adversarial terms reach the generator
    num_workers: int
    seed: int
    reserve_after_s: float = 0.0  # time the caller needs after the loop returns (kept out of the plan)
    checkpoints: bool = True  # False: none at all (short runs that are never resumed: feedback rounds)


@dataclass
class RunPaths:
    run_dir: Path  # checkpoints, logs, metrics, plan, samples
    output_dir: Path  # the final model

    @property
    def best_dir(self) -> Path:
        return self.run_dir / "best_model"

    @property
    def samples_dir(self) -> Path:
        return self.run_dir / "samples"


@dataclass
class LoopResult:
    stop_reason: str  # "deadline", "max_epochs", "early_stopping", "interrupted"
    state: TrainingState
    plan: Plan | None
    last_eval: EvalResult | None
    last_lr: float
    data_wait_s: float
    train_s: float  # real seconds inside optimizer steps, data included
    checkpoint: Path | None = None
    notes: dict = field(default_factory=dict)


@dataclass
class Decision:
    run: bool
    last: bool = False
    reason: str = ""


class ExampleList(torch.utils.data.Dataset):
    def __init__(self, examples: list[Example]):
        self.examples = examples

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, index: int) -> Example:
        return self.examples[index]


class TrainingLoop:
    def __init__(self, *, model, tokenizer, discriminator, step: TrainStep, examples: list[Example],
                 evaluator: Evaluator, budget: Budget, sampler: BucketSampler, state: TrainingState,
                 config: LoopConfig, paths: RunPaths, logger, metrics: Metrics, device: torch.device, hop: int,
                 frozen_parts: list[str], checkpoint_extra: dict, stop: StopRequest, plan: Plan | None = None,
                 dist: Distributed = Distributed(), step_callback: Callable[["TrainingLoop"], None] | None = None,
                 export_extra: Callable[[], dict] | None = None):
        self.model, self.tokenizer, self.discriminator, self.step = model, tokenizer, discriminator, step
        self.examples, self.evaluator, self.budget, self.sampler = examples, evaluator, budget, sampler
        self.state, self.config, self.paths, self.logger, self.metrics = state, config, paths, logger, metrics
        self.device, self.hop, self.frozen_parts, self.checkpoint_extra = device, hop, frozen_parts, checkpoint_extra
        self.stop, self.plan, self.dist, self.step_callback = stop, plan, dist, step_callback
        self.export_extra = export_extra or (lambda: {})
        self.timer = StepTimer(prior_s=state.step_s_estimate or None)
        self.eval_s = plan.eval_s if plan else 0.0
        self.checkpoint_s = plan.checkpoint_s if plan else 0.0
        self.export_s = state.export_s_estimate
        self.last_eval: EvalResult | None = None
        self.last_checkpoint: Path | None = None
        self.last_checkpoint_at = budget.clock.now()
        self.data_wait_s = self.train_s = 0.0
        self.last_lr = 0.0
        self.early_stop = False
        self._windows = None
        self.display: ProgressDisplay | None = None

    # ------------------------------------------------------------ data

    def make_loader(self, batches: list[list[int]]) -> DataLoader:
        generator = torch.Generator().manual_seed(self.config.seed)  # keeps DataLoader seeding off the global RNG
        return DataLoader(ExampleList(self.examples), batch_sampler=batches, collate_fn=partial(collate, hop=self.hop),
                          num_workers=self.config.num_workers, pin_memory=self.device.type == "cuda",
                          generator=generator)

    def windows(self):
        """Accumulation windows: `accumulation` micro-batches, or fewer at an epoch's end. Yields
        (batches on the device, whether the epoch ended)."""
        non_blocking = self.device.type == "cuda"
        while True:
            window: list[Batch] = []
            for host_batch in self.make_loader(self.sampler.remaining_batches()):
                window.append(host_batch.to(self.device, non_blocking=non_blocking))
                ended = self.sampler.advance()
                if len(window) == self.config.accumulation or ended:
                    yield window, ended
                    window = []
                if ended:
                    break

    def next_window(self) -> tuple[list[Batch], bool]:
        if self._windows is None:
            self._windows = self.windows()
        started = time.perf_counter()
        window = next(self._windows)
        self.data_wait_s += time.perf_counter() - started
        return window

    # ------------------------------------------------------------ decisions

    @property
    def steps_per_epoch(self) -> int:
        return -(-self.sampler.batches_per_epoch // self.config.accumulation)

    def eval_due(self, step: int) -> bool:
        return self.plan is not None and step % self.plan.eval_every == 0

    def decide(self) -> Decision:
        """Whether to run the next step, and whether it is the last (shared by all processes)."""
        next_step = self.state.step + 1
        if self.stop.requested:
            return Decision(False, reason="interrupted")
        if self.early_stop:
            return Decision(False, reason="early_stopping")
        if self.config.max_epochs and self.state.epoch >= self.config.max_epochs:
            return Decision(False, reason="max_epochs")
        if self.plan is not None and self.plan.limited_by == "max_epochs" and self.state.step >= self.plan.total_steps:
            return Decision(False, reason="max_epochs")
        step_s = self.timer.cautious_s if self.timer.ready else 0.0
        reserve = self.plan.final_s if self.plan else 0.0
        if self.dist.any(not self.budget.fits(step_s, reserve)):
            return Decision(False, reason="deadline")
        # A step with no room for the evaluation or checkpoint due after it runs as the last (which skips them).
        after = (self.eval_s if self.eval_due(next_step) else 0.0) + self.checkpoint_after_s(step_s)
        no_room_after = self.dist.any(not self.budget.fits(step_s + after, reserve))
        return Decision(True, last=self.plan is not None and (no_room_after or self.is_last(next_step, reserve)))

    def is_last(self, next_step: int, reserve: float) -> bool:
        """Whether no step would fit after this one. Judged with the slowest recent step (and 25% on
        evaluations), more cautiously than `decide`: a step not marked last then leaves room for the
        next, so the run ends on a step marked last, at the learning-rate floor."""
        if self.plan is None:
            return False
        if self.plan.limited_by == "max_epochs" and next_step >= self.plan.total_steps:
            return True
        slowest = self.timer.slowest_s if self.timer.ready else 0.0
        evals = sum(1.25 * self.eval_s for s in (next_step, next_step + 1) if self.eval_due(s))
        saves = self.checkpoint_after_s(slowest)  # after the next step; the one after it, if last, writes none
        return self.dist.any(not self.budget.fits(2 * slowest + evals + saves, reserve))

    def checkpoint_after_s(self, step_s: float) -> float:
        """The checkpoint `after_step` will write after the next step (the epoch ends in its window, or the
        periodic one falls due), as a cost to count before running it."""
        epoch_ends = self.sampler.state.position + self.config.accumulation >= self.sampler.batches_per_epoch
        periodic = self.budget.clock.now() + step_s - self.last_checkpoint_at >= self.config.checkpoint_every_s
        return self.checkpoint_s if epoch_ends or periodic else 0.0

    def lr_for(self, step: int, last: bool) -> float:
        total = step if last else (self.plan.total_steps if self.plan else 10**9)
        warmup = self.plan.warmup_steps if self.plan else self.config.warmup_steps
        return learning_rate(step, max(total, step), warmup, self.config.learning_rate, self.config.lr_floor_ratio)

    # ------------------------------------------------------------ one step

    def train_one(self, decision: Decision) -> tuple[StepResult, bool]:
        step = self.state.step + 1
        lr = self.lr_for(step, decision.last)
        ratio = self.config.discriminator_learning_rate / self.config.learning_rate
        self.step.set_learning_rates(lr, lr * ratio)
        started, started_real = self.budget.clock.now(), time.perf_counter()
        window, epoch_ended = self.next_window()
        adversarial = step > self.config.discriminator_warmup_steps
        result = self.step.run(window, adversarial=adversarial)
        elapsed = self.budget.clock.now() - started
        self.timer.add(elapsed)
        self.train_s += time.perf_counter() - started_real  # real seconds, like data_wait_s (their ratio is reported)
        self.last_lr = lr
        self.state.step = step
        self.state.samples_seen += sum(len(b) for b in window)
        if epoch_ended:
            self.state.epoch += 1
        self.report_step(result, lr, sum(len(b) for b in window) / max(elapsed, 1e-9))
        return result, epoch_ended

    def report_step(self, result: StepResult, lr: float, samples_per_s: float) -> None:
        if not result.applied:
            self.logger.warning(f"step {self.state.step}: skipped ({result.reason}); losses {result.losses}")
        if not self.dist.is_main:
            return
        total = self.plan.total_steps if self.plan else 0
        epochs = self.plan.epochs if self.plan else 0.0
        position = self.state.epoch + self.sampler.state.position / max(1, self.sampler.batches_per_epoch)
        left_in_epoch = (self.sampler.batches_per_epoch - self.sampler.state.position) / self.config.accumulation
        step_s = self.timer.mean_s if self.timer.ready else 0.0
        line = progress_line(self.state.step, total, position, epochs, result.losses, lr, samples_per_s,
                             memory_text(self.device), left_in_epoch * step_s,
                             max(0, total - self.state.step) * step_s, self.budget.left_s())
        postfix = f"mel {result.losses.get('mel', float('nan')):.3f} lr {lr:.1e} {samples_per_s:.1f}/s"
        if self.display is not None and self.display.step(self.budget.clock.now(), line, postfix):
            self.metrics.write("train", step=self.state.step, epoch=round(position, 4), lr=lr,
                               samples_per_s=round(samples_per_s, 2), time_used_s=round(self.budget.used_s(), 2),
                               **{k: round(v, 5) for k, v in result.losses.items()})

    # ------------------------------------------------------------ evaluation and saving

    def evaluate(self) -> EvalResult:
        started = self.budget.clock.now()
        result = self.evaluator.evaluate(self.model, self.state.step)
        train_mode(self.model, self.frozen_parts)
        improved = result.mcd_db < self.state.best_score
        if improved:
            self.state.best_score, self.state.best_step, self.state.evals_since_best = result.mcd_db, self.state.step, 0
            self.export(self.paths.best_dir, {"eval.json": {**result.summary(), "per_clip": result.per_clip}})
        else:
            self.state.evals_since_best += 1
        patience = self.config.early_stopping_patience
        self.early_stop = bool(patience and self.state.evals_since_best >= patience)
        # The latest cost, not the largest: the first evaluation also pays one-time compilation (numba DTW).
        self.eval_s = self.budget.clock.now() - started + (0.0 if improved else self.export_s)
        self.last_eval = result
        self.metrics.write("eval", **result.summary(), best=improved, best_mcd_db=round(self.state.best_score, 4))
        best = ("best so far: saved best_model" if improved
                else f"best {self.state.best_score:.3f} at step {self.state.best_step}")
        self.logger.info(f"eval step {self.state.step}: {self.evaluator.describe(result)} ({best}); "
                         f"val mel {result.val_losses.get('mel', float('nan')):.3f}; {result.seconds:.1f}s")
        return result

    def export(self, folder: Path, extra_json: dict) -> None:
        if not self.dist.is_main:
            return
        started = self.budget.clock.now()
        export_model(self.model, self.tokenizer, folder, self.discriminator, {**self.export_extra(), **extra_json})
        self.export_s = self.budget.clock.now() - started

    def checkpoint(self, end_of_epoch: bool) -> Path | None:
        if not self.dist.is_main or not self.config.checkpoints:
            return None
        started = self.budget.clock.now()
        self.state.time_used_s = self.budget.used_s()
        self.state.step_s_estimate = self.timer.mean_s if self.timer.ready else 0.0
        self.state.export_s_estimate = self.export_s
        epoch = self.state.epoch if end_of_epoch else self.state.epoch + 1
        payload = {"model": self.model.state_dict(), "discriminator": {"config": self.discriminator.config.to_dict(),
                   "state": self.discriminator.state_dict(), "warmup_steps": self.config.discriminator_warmup_steps},
                   "train_step": self.step.state_dict(),
                   "state": self.state.to_dict(), "sampler": self.sampler.state_dict(), "rng": capture_rng(),
                   "plan": self.plan.to_dict() if self.plan else None, **self.checkpoint_extra}
        path = save_checkpoint(self.paths.run_dir, checkpoint_name(epoch, self.state.step, end_of_epoch), payload,
                               self.config.keep_checkpoints)
        self.checkpoint_s = self.budget.clock.now() - started
        self.last_checkpoint, self.last_checkpoint_at = path, self.budget.clock.now()
        return path

    # ------------------------------------------------------------ planning

    def replan(self) -> Plan:
        eval_every = self.plan.eval_every if self.plan else self.config.eval_every
        final_s = self.eval_s + self.export_s + self.checkpoint_s + self.config.reserve_after_s
        self.plan = make_plan(self.budget.left_s(), self.timer.mean_s, self.eval_s + self.export_s, self.checkpoint_s,
                              final_s, self.steps_per_epoch, self.state.step, self.config.warmup_steps,
                              self.budget.safety_s, eval_every=eval_every, max_epochs=self.config.max_epochs,
                              checkpoint_every_s=self.config.checkpoint_every_s)
        if self.display is not None:
            self.display.set_total(self.plan.total_steps)
        return self.plan

    def write_plan(self) -> None:
        plan = self.plan.to_dict()
        plan.update(budget_target_s=self.budget.target_s, time_used_s=round(self.budget.used_s(), 2),
                    batches_per_epoch=self.sampler.batches_per_epoch)
        write_text_atomic(self.paths.run_dir / "plan.json", json.dumps(plan, indent=2) + "\n")
        self.metrics.write("plan", **plan)
        self.logger.info(
            f"plan: {self.plan.total_steps} optimizer steps ({self.plan.epochs:.2f} epochs of {self.plan.steps_per_epoch} "
            f"steps) in the {self.budget.left_s():.0f}s left; {self.plan.step_s:.3f}s a step, evaluation every "
            f"{self.plan.eval_every} steps ({self.plan.eval_s:.1f}s each), checkpoint {self.plan.checkpoint_s:.1f}s, "
            f"final save {self.plan.final_s:.1f}s; warmup {self.plan.warmup_steps} steps; limited by {self.plan.limited_by}")

    # ------------------------------------------------------------ phases

    def benchmark(self) -> None:
        """Fresh runs: time the baseline evaluation, then `benchmark_samples` clips of real training steps,
        then a checkpoint; plan from those timings."""
        self.evaluate()
        per_step = self.config.batch_size * self.config.accumulation
        steps = max(3, -(-self.config.benchmark_samples // per_step))
        self.logger.info(f"benchmark: {steps} training steps of {per_step} clips, timed after the first 2")
        while self.timer.seen < steps:
            decision = self.decide()
            if not decision.run:
                return
            _, epoch_ended = self.train_one(decision)
            if epoch_ended and self.timer.seen < steps:
                self.checkpoint(end_of_epoch=True)
        self.checkpoint(end_of_epoch=False)
        self.replan()
        self.write_plan()

    def run(self) -> LoopResult:
        self.display = ProgressDisplay(self.logger, total=self.plan.total_steps if self.plan else 0,
                                       initial=self.state.step, every_s=self.config.log_every_s)
        try:
            if self.plan is None:
                self.benchmark()
            else:
                self.replan()
                self.write_plan()
            reason = self.train_until_stop()
            if reason == "interrupted":
                path = self.checkpoint(end_of_epoch=False)
                return self.result(reason, checkpoint=path)
            self.finish()
            return self.result(reason, checkpoint=self.last_checkpoint)
        finally:
            self.display.close()

    def train_until_stop(self) -> str:
        while True:
            decision = self.decide()
            if not decision.run:
                return decision.reason
            _, epoch_ended = self.train_one(decision)
            if self.step_callback is not None:
                self.step_callback(self)
            self.after_step(epoch_ended, decision.last)
            if decision.last:
                return "max_epochs" if self.plan and self.plan.limited_by == "max_epochs" else "deadline"

    def after_step(self, epoch_ended: bool, last: bool) -> None:
        if self.eval_due(self.state.step) and not last:
            self.evaluate()
            self.replan()
        periodic = self.budget.clock.now() - self.last_checkpoint_at >= self.config.checkpoint_every_s
        if (epoch_ended or periodic) and not last:
            self.checkpoint(end_of_epoch=epoch_ended)

    def finish(self) -> None:
        """Final evaluation (unless the last one saw these weights), export and checkpoint."""
        if self.last_eval is None or self.last_eval.step != self.state.step:
            self.evaluate()
        self.export(self.paths.output_dir, {"training_summary.json": self.summary("finished")})
        self.checkpoint(end_of_epoch=self.sampler.state.position == 0)

    def summary(self, reason: str) -> dict:
        return {"stop_reason": reason, "steps": self.state.step, "epochs": self.state.epoch,
                "samples_seen": self.state.samples_seen, "best_mcd_db": self.state.best_score,
                "best_step": self.state.best_step, "last_lr": self.last_lr, "time_used_s": round(self.budget.used_s(), 2),
                "budget_s": self.budget.target_s, "nonfinite_skips": self.step.nonfinite_skips,
                "fp16_overflow_skips": self.step.overflow_skips, "oom_skips": self.step.oom_skips,
                **peak_memory(self.device)}

    def result(self, reason: str, checkpoint: Path | None) -> LoopResult:
        return LoopResult(stop_reason=reason, state=self.state, plan=self.plan, last_eval=self.last_eval,
                          last_lr=self.last_lr, data_wait_s=self.data_wait_s, train_s=self.train_s, checkpoint=checkpoint)


def run_with_signals(loop: TrainingLoop) -> LoopResult:
    """Run the loop with Ctrl-C / SIGTERM turned into "save and stop after this step"."""
    loop.stop.install()
    try:
        return loop.run()
    finally:
        loop.stop.restore()
