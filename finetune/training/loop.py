"""The training loop shared by train_vits.py and train_feedback.py.

    batch fit  on CUDA, the longest clips are tried once as one micro-batch; on out-of-memory the
               micro-batch halves and the accumulation doubles (finetune/training/batch_fit.py)
    baseline   a fresh run first evaluates the starting model (timed; the final save is measured too)
    warm-up    a new discriminator facing a pretrained generator trains alone first, at its own learning
               rate, until it tells real from generated (the generator does not change meanwhile)
    benchmark  the first optimizer steps (--benchmark_samples clips) are ordinary training steps; with
               the timed evaluation, export and checkpoint they give the plan (plan.json): how many
               steps fit, how often to evaluate
    train      steps until the deadline (finetune/training/pacing.py decides, a micro-batch at a time), an epoch
               limit or early stopping; evaluations keep the best model, checkpoints at each epoch end
               and every --checkpoint_every_minutes, the plan re-estimated at each evaluation
    finish     a final evaluation (unless the last one saw these weights), the last weights' export
               (last_model), best_model copied to the output folder, and a checkpoint, all inside the budget
               (each evaluation has a time limit that keeps what must follow it free, finetune/training/pacing.py,
               and is cut short or skipped at it)

Ctrl-C or SIGTERM (finetune/system/interrupt.py) is honoured at the next safe point, wherever the run is: the
sampler position and random state go back to the last completed optimizer step, a checkpoint is
written, and the loop returns "interrupted". Many non-finite steps in a row send the run back to its
last good state at a lower learning rate (finetune/training/recovery.py); the first out-of-memory error
in training refits the batch once (finetune/training/batch_fit.py). Saving is finetune/training/saving.py.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from finetune.system.cpu_threads import CpuThreads
from finetune.training.batch_fit import OUT_OF_MEMORY_ADVICE, BatchFitting
from finetune.training.budget import Budget, Plan, StepTimer
from finetune.training.checkpoint import TrainingState, capture_rng
from finetune.data.examples import Example
from finetune.training.distributed import Distributed
from finetune.reporting.evaluation import EvalResult, Evaluator
from finetune.reporting.model_card import CardFacts
from finetune.data.feed import MicroBatchFeed
from finetune.system.interrupt import StopRequest, StopRequested
from finetune.training.ending import LoopResult, RunEnding
from finetune.training.milestones import Milestones
from finetune.training.pacing import Costs, Pacer
from finetune.system.profile import section
from finetune.training.recovery import Divergence, LastGoodState
from finetune.reporting.run_log import RunLog
from finetune.data.sampler import BucketSampler, SamplerState
from finetune.training.saving import Saver
from finetune.training.step import StepResult, TrainStep
from finetune.system.errors import ToolError


class BudgetTooSmall(ToolError):
    """The budget cannot hold the work asked for; the message gives the figures and the flag to raise."""


@dataclass
class LoopConfig:
    """What the loop runs with: the shared training flags it reads (finetune/settings.py), taken by name
    from the recipe's config by `from_flags`, and what the recipe decided beyond them."""

    batch_size: int
    gradient_accumulation_steps: int
    learning_rate: float
    discriminator_learning_rate: float
    lr_floor_ratio: float
    warmup_steps: int
    benchmark_samples: int
    val_every: int  # 0: planned
    max_epochs: int  # 0: no cap
    log_every_seconds: float
    seed: int
    discriminator_warmup_steps: int  # discriminator-only steps before joint training, as decided (0: none)
    num_workers: int  # as resolved for the device
    discriminator_warmup_learning_rate: float = 2e-4  # constant, the original VITS rate: a new discriminator must learn fast
    discriminator_warmup_margin: float = 0.5  # the warm-up ends when real minus generated scores reach this
    discriminator_warmup_share: float = 0.2  # the warm-up takes at most this share of the time left at its start
    early_stopping_patience: int = 0  # evaluations without improvement; 0: off
    keep_checkpoints: int = 1
    checkpoint_every_minutes: float = 30.0
    reserve_after_s: float = 0.0  # time the caller needs after the loop returns (kept out of the plan)
    checkpoints: bool = True  # False: none at all (short runs that are never resumed: feedback rounds)
    fit_batch: str = "auto"  # the batch fitted to GPU memory before training: auto (on with CUDA), on, off

    @classmethod
    def from_flags(cls, flags, **decided) -> "LoopConfig":
        """Every field the recipe's config has, by name; `decided` gives the rest (and overrides)."""
        names = {f.name for f in dataclasses.fields(cls)} - set(decided)
        return cls(**{name: getattr(flags, name) for name in names if hasattr(flags, name)}, **decided)

    @property
    def checkpoint_every_s(self) -> float:
        return 60 * self.checkpoint_every_minutes


@dataclass
class RunPaths:
    run_dir: Path  # checkpoints, logs, metrics, plan, samples
    output_dir: Path  # the final model: a copy of best_model, the voice an app should load

    @property
    def best_dir(self) -> Path:
        return self.run_dir / "best_model"

    @property
    def last_dir(self) -> Path:
        """The weights of the last step (output_dir holds the best model's)."""
        return self.run_dir / "last_model"

    @property
    def samples_dir(self) -> Path:
        return self.run_dir / "samples"


@dataclass
class Decision:
    run: bool
    reason: str = ""


@dataclass
class StepOutcome:
    result: StepResult
    epoch_ended: bool
    last: bool  # the run's last step
    first_update: bool  # the optimizers had no state before it (their state is made at the first update)


@dataclass
class Boundary:
    """The state after the last completed optimizer step, to go back to when a stop comes mid-window."""

    sampler: SamplerState
    rng: dict


class TrainingLoop(Milestones, RunEnding, BatchFitting):
    """One run's training: phases, decisions and steps here; evaluation, saving and planning in
    Milestones (finetune/training/milestones.py); the final saves, a clean stop and the result in
    RunEnding (finetune/training/ending.py)."""

    def __init__(self, *, model, tokenizer, discriminator, step: TrainStep, examples: list[Example],
                 evaluator: Evaluator, budget: Budget, sampler: BucketSampler, state: TrainingState,
                 config: LoopConfig, paths: RunPaths, logger, run_log: RunLog, device: torch.device, hop: int,
                 frozen_parts: list[str], checkpoint_extra: dict, stop: StopRequest, plan: Plan | None = None,
                 dist: Distributed = Distributed(), step_callback: Callable[["TrainingLoop"], None] | None = None,
                 export_extra: Callable[[], dict] | None = None, resumed_from: Path | None = None,
                 card: CardFacts | None = None):
        self.model, self.tokenizer, self.discriminator, self.step = model, tokenizer, discriminator, step
        self.evaluator, self.budget, self.sampler, self.state = evaluator, budget, sampler, state
        self.config, self.paths, self.logger, self.run_log = config, paths, logger, run_log
        self.device, self.frozen_parts, self.checkpoint_extra = device, frozen_parts, checkpoint_extra
        self.stop, self.dist, self.step_callback = stop, dist, step_callback
        self.export_extra = export_extra or (lambda: {})
        self.card = card  # what the model cards of exported folders say (finetune/reporting/model_card.py)
        self.timer = StepTimer(config.gradient_accumulation_steps, prior_micro_batch_s=state.micro_batch_s_estimate or None,
                               prior_update_s=state.update_s_estimate or None)
        self.costs = Costs(eval_s=state.eval_s_estimate, export_s=state.export_s_estimate,
                           checkpoint_s=state.checkpoint_s_estimate, after_loop_s=config.reserve_after_s,
                           checkpoints=config.checkpoints)
        self.pacer = Pacer(budget, self.timer, self.costs, config.gradient_accumulation_steps, config.checkpoint_every_s,
                           config.max_epochs, config.warmup_steps, config.learning_rate, config.lr_floor_ratio, plan)
        self.feed = MicroBatchFeed(examples, sampler, hop, config.num_workers, config.seed, device)
        self.saver = Saver(model, tokenizer, discriminator, self.costs, budget.clock.now, logger,
                           config.keep_checkpoints, dist.is_main)
        self.divergence = Divergence(rollbacks=state.rollbacks)
        self.last_good = LastGoodState(model, discriminator, resumed_from)
        restore_eval_estimates(evaluator, state)
        self.last_eval: EvalResult | None = None
        self.last_eval_step = -1  # the step the last evaluation saw (known to every process)
        self.rng_by_rank: list[dict] = []
        self.last_checkpoint: Path | None = resumed_from
        self.last_checkpoint_at = budget.clock.now()
        self.train_s = 0.0
        self.last_lr = 0.0
        self.early_stop = False
        self.final_saved = False
        self.final_source = ""  # what the output folder holds: best_model (step N) or the last weights
        self.final_eval_skipped = False  # the final evaluation had no time for a single clip
        self.finishing = False  # the final evaluation and saves have begun
        self.boundary: Boundary | None = None  # set while an accumulation window runs
        # On CPU, fewer torch threads while other processes take the cores (finetune/system/cpu_threads.py).
        self.cpu_threads = CpuThreads(logger, torch.get_num_threads, torch.set_num_threads) \
            if device.type == "cpu" else None
        self.adopt_fitted_batch()  # a resumed run keeps the micro-batch its checkpoint was fitted to

    @property
    def plan(self) -> Plan | None:
        return self.pacer.plan

    @property
    def steps_per_epoch(self) -> int:
        return -(-self.sampler.batches_per_epoch // self.config.gradient_accumulation_steps)

    # ------------------------------------------------------------ decisions

    def decide(self) -> Decision:
        """Whether to run another step (shared by all processes: one collective for both flags)."""
        stop, no_room = self.dist.any_of(self.stop.requested, not self.pacer.may_start_step())
        if stop:
            return Decision(False, "interrupted")
        if self.early_stop:
            return Decision(False, "early_stopping")
        if self.config.max_epochs and self.state.epoch >= self.config.max_epochs:
            return Decision(False, "max_epochs")
        plan = self.plan
        if plan is not None and plan.limited_by == "max_epochs" and self.state.step >= plan.total_steps:
            return Decision(False, "max_epochs")
        if no_room:
            return Decision(False, "deadline")
        return Decision(True)

    def micro_batches(self, pacer: Pacer):
        """The micro-batches of one window, one at a time: (batch, whether it is the window's last).
        Times each into the pacer's timer; ends the window early when the deadline leaves no room for
        another; a stop request is honoured before each but the first."""
        self.window_epoch_ended = False
        clock, index = self.budget.clock, 0
        while True:
            index += 1
            stop, last = self.dist.any_of(index > 1 and self.stop.requested, pacer.micro_batch_is_last(index))
            if stop:
                raise StopRequested(self.stop.signal_name or "SIGTERM")
            if self.cpu_threads is not None:
                self.cpu_threads.adjust()
            started = clock.now()
            with section("data"):
                batch, epoch_ended = self.feed.take()
            self.window_epoch_ended = epoch_ended
            yield batch, last or epoch_ended
            pacer.timer.micro_batches.add(clock.now() - started)
            if last or epoch_ended:
                return

    # ------------------------------------------------------------ one step

    def window_start(self) -> None:
        self.boundary = Boundary(sampler=SamplerState(self.sampler.state.epoch, self.sampler.state.position),
                                 rng=capture_rng())

    def train_one(self) -> "StepOutcome":
        """One optimizer step of generator and discriminator."""
        step = self.state.step + 1
        started = self.budget.clock.now()
        self.window_start()
        profile = self.run_log.profile.activate()
        try:
            window = self.step.accumulate_window(self.micro_batches(self.pacer), self.config.gradient_accumulation_steps)
            if window.oom and self.refit_during_training(window.oom, rewind=True):  # once: the same clips, smaller
                window = self.step.accumulate_window(self.micro_batches(self.pacer), self.config.gradient_accumulation_steps)
            outcome = self.finish_step(step, started, window)
            profile.end_step()
        finally:
            profile.deactivate()
        return outcome

    def finish_step(self, step: int, started: float, window) -> "StepOutcome":
        """After a window: decide whether it is the last step, set the learning rate, apply the update."""
        epoch_ended = self.window_epoch_ended
        cut_short = window.used < self.config.gradient_accumulation_steps and not epoch_ended
        due = self.after_step_s(step, epoch_ended)
        last = self.dist.any(self.pacer.step_is_last(step, cut_short, due))
        lr = self.pacer.learning_rate(step, last) * self.state.lr_scale
        ratio = self.config.discriminator_learning_rate / self.config.learning_rate
        self.step.set_learning_rates(lr, lr * ratio)
        first_update = not self.step.optimizer_g.state
        update_started = self.budget.clock.now()
        result = self.step.apply(window)
        self.timer.updates.add(self.budget.clock.now() - update_started)
        self.boundary = None
        elapsed = self.budget.clock.now() - started
        self.train_s += elapsed
        self.last_lr, self.state.step = lr, step
        samples = window.used * self.config.batch_size
        self.state.samples_seen += samples
        if epoch_ended:
            self.state.epoch += 1
        self.report_step(result, lr, samples / max(elapsed, 1e-9), window.used)
        return StepOutcome(result, epoch_ended, last, first_update)

    def after_step_s(self, step: int, epoch_ended: bool) -> float:
        """Seconds of what falls due after this step: an evaluation (and the best model's export), a checkpoint."""
        evaluation = self.costs.eval_s + self.costs.export_s if self.pacer.eval_due(step) else 0.0
        since = self.budget.clock.now() - self.last_checkpoint_at
        checkpoint = self.costs.checkpoint_s if self.pacer.checkpoint_due(epoch_ended, since) else 0.0
        return evaluation + checkpoint

    def report_step(self, result: StepResult, lr: float, samples_per_s: float, used: int) -> None:
        if not result.applied:
            self.logger.warning(f"step {self.state.step}: skipped ({result.reason}); losses {result.losses}")
        plan = self.plan
        total, epochs = (plan.total_steps, plan.epochs) if plan else (0, 0.0)
        position = self.state.epoch + self.sampler.state.position / max(1, self.sampler.batches_per_epoch)
        left_in_epoch = (self.sampler.batches_per_epoch - self.sampler.state.position) / self.config.gradient_accumulation_steps
        step_s = self.timer.step_s if self.timer.ready else 0.0
        ratio = self.config.discriminator_learning_rate / self.config.learning_rate
        fields = dict(step=self.state.step, total=total, epoch=position, epochs=epochs, lr=lr, samples_per_s=samples_per_s,
                      epoch_eta_s=left_in_epoch * step_s, run_eta_s=max(0, total - self.state.step) * step_s,
                      deadline_s=self.budget.left_s())
        losses = self.dist.mean(result.losses)  # every process's share of the window, averaged
        samples_per_s = self.dist.sum(samples_per_s)
        fields["samples_per_s"] = samples_per_s
        scalars = {"lr": lr, "discriminator_lr": lr * ratio, "samples_per_s": samples_per_s,
                   "grad_norm_generator": result.grad_norm_generator,
                   "grad_norm_discriminator": result.grad_norm_discriminator,
                   "time_used_s": self.budget.used_s(), "micro_batches": used, **self.step.scaler_figures()}
        self.run_log.step(self.budget.clock.now(), fields, used, self.config.gradient_accumulation_steps, losses, scalars)

    # ------------------------------------------------------------ when steps keep failing

    def after_failure(self, outcome: StepOutcome, at: str = "") -> str | None:
        """A stop reason when training cannot go on, else None (after going back to the last good state
        if the failures call for it). `at` names the step for the log (default: the training step)."""
        at = at or f"step {self.state.step}"
        result = outcome.result
        if result.update_failed and not outcome.first_update:
            self.refit_during_training(result.reason, rewind=False)  # once; the torn update is rolled back below
        action = self.divergence.record(result.applied, result.reason.startswith("non-finite"), result.update_failed)
        if action == "ok":
            return None
        if result.update_failed and outcome.first_update:
            self.go_back()
            self.logger.error("error: the optimizers' state does not fit in GPU memory (the first update ran out of "
                              "it): freeze parts (--freeze posterior_encoder), use a narrower --discriminator_width, "
                              "or a GPU with more memory; nothing was trained")
            return "out_of_memory"
        went_back, restored = self.go_back()
        if not went_back:
            return "out_of_memory"
        where = self.last_good.describe() + (f" (step {restored})" if restored is not None else "")
        if action == "give_up":
            self.logger.error(f"error: training keeps failing ({result.reason}) after going back "
                              f"{self.divergence.rollbacks} times: stopped with the last good weights, {where}. "
                              "Lower --learning_rate, or check the data")
            return "diverged"
        self.state.lr_scale *= self.divergence.policy.lr_factor
        self.state.rollbacks = self.divergence.rollbacks
        what = (f"{result.reason} at {at}" if result.update_failed else
                f"{result.reason} in {self.divergence.policy.max_in_row} steps in a row ({at})")
        self.logger.warning(f"warning: {what}: went back to {where}; learning rate now x{self.state.lr_scale:g} "
                            "of the schedule")
        self.run_log.event("rollback", step=self.state.step, at=at, to=where, lr_scale=self.state.lr_scale,
                           reason=result.reason)
        return None

    def go_back(self) -> tuple[bool, int | None]:
        """The last good state put back on every process: (whether it could be, its step). Loading it may
        itself run out of GPU memory (the card just did): then every process stops, said in one line."""
        restored, failed = None, ""
        try:
            restored = self.last_good.restore(self.model, self.discriminator, self.step)
        except torch.OutOfMemoryError as error:  # torch.cuda.OutOfMemoryError is this type
            failed = str(error).strip().splitlines()[0] if str(error).strip() else "out of memory"
        if self.dist.any(bool(failed)):
            where = failed or "on another process"
            self.logger.error(f"error: going back to {self.last_good.describe()} ran out of GPU memory ({where}): "
                              f"stopped; best_model is what the run keeps. {OUT_OF_MEMORY_ADVICE}")
            return False, None
        return True, restored

    @property
    def benchmark_steps(self) -> int:
        per_step = self.config.batch_size * self.config.gradient_accumulation_steps
        return max(3, -(-self.config.benchmark_samples // per_step))

    # ------------------------------------------------------------ phases

    def baseline(self) -> None:
        """A fresh run: evaluate the starting model, and measure what the final save will cost."""
        self.evaluate()
        if self.costs.export_s == 0.0:  # nothing was exported: the starting model is outside the timing rule
            self.on_main(lambda: self.saver.measure_export(self.paths.run_dir))
            self.costs.export_s = self.dist.broadcast(self.costs.export_s)
        if self.dist.any(not self.pacer.room_for(0.0)):
            raise BudgetTooSmall(
                f"the budget of {self.budget.target_s:.0f}s cannot hold training: {self.budget.used_s():.0f}s went to "
                f"start-up, loading and the first evaluation ({self.costs.eval_s:.1f}s), and the final save alone "
                f"needs about {self.costs.final_s:.0f}s (evaluation, export {self.costs.export_s:.1f}s, checkpoint) "
                f"plus a {self.budget.safety_s:.0f}s margin: raise --target_hours")
        self.logger.info(f"benchmark: {self.benchmark_steps} training steps of "
                         f"{self.config.batch_size * self.config.gradient_accumulation_steps} clips, timed after the first 2 micro-batches")

    def run(self) -> LoopResult:
        self.run_log.open_display(self.plan.total_steps if self.plan else 0, self.state.step, self.config.log_every_seconds)
        try:
            self.check_room()  # first: a disk that cannot hold one checkpoint stops before any work
            if not self.fit_batch():  # first: a run that cannot fit one clip stops before any work
                return self.result("out_of_memory", checkpoint=self.last_checkpoint)
            self.on_main(self.measure_report)
            fresh = self.plan is None and self.state.discriminator_warmup_done == 0 \
                and not self.state.discriminator_warmup_finished
            if not fresh:  # a resumed process: no baseline evaluation to pay the first one's costs
                self.on_main(self.prime_evaluation)
            self.costs.report_s, self.costs.eval_s = self.dist.broadcast((self.costs.report_s, self.costs.eval_s))
            reason = None
            if self.plan is None:
                if fresh:
                    self.baseline()
                reason = self.warm_up_discriminator()
                if reason is None and self.state.step >= self.benchmark_steps:  # resumed after its benchmark
                    self.replan()
                    self.write_plan()
            else:
                self.replan()
                self.write_plan()
            reason = reason or self.train_until_stop()
            if reason == "interrupted":
                raise StopRequested(self.stop.signal_name or "SIGINT")
            if reason == "out_of_memory":
                self.publish_best()  # nothing more fits on the card; what the run learnt still reaches the app
            else:
                self.finish()
            return self.result(reason, checkpoint=self.last_checkpoint)
        except StopRequested:
            return self.stop_cleanly()
        finally:
            self.run_log.close()

    def warm_up_discriminator(self) -> str | None:
        """A new discriminator's warm-up (finetune/training/warmup.py); a stop reason if it failed for good."""
        from finetune.training.warmup import warm_up

        return warm_up(self)

    def train_until_stop(self) -> str:
        while True:
            decision = self.decide()
            if not decision.run:
                if decision.reason == "deadline" and self.state.step == 0:
                    self.logger.warning("warning: the budget left no room for a single training step")
                return decision.reason
            outcome = self.train_one()
            if self.step_callback is not None:
                self.step_callback(self)
            failure = self.after_failure(outcome)
            if failure:
                return failure
            if outcome.last:
                return "max_epochs" if self.plan and self.plan.limited_by == "max_epochs" else "deadline"
            self.after_step(outcome.epoch_ended)

    def after_step(self, epoch_ended: bool) -> None:
        if self.plan is None and self.state.step >= self.benchmark_steps:
            self.checkpoint(end_of_epoch=epoch_ended)  # first: the plan counts what a checkpoint costs
            self.replan()
            self.write_plan()
            return
        if self.pacer.eval_due(self.state.step):
            self.evaluate()
            self.replan()
        # Joint: the periodic one depends on each process's own clock, and writing one is a collective.
        if self.dist.any(self.pacer.checkpoint_due(epoch_ended, self.budget.clock.now() - self.last_checkpoint_at)):
            self.checkpoint(end_of_epoch=epoch_ended)


def restore_eval_estimates(evaluator, state: TrainingState) -> None:
    """A resumed run's evaluator starts from what its checkpoint's last evaluation cost, piece by piece
    (its first evaluation is then limited from its first clip on; feedback evaluators keep their own)."""
    if hasattr(evaluator, "group_s"):
        evaluator.group_s = state.eval_group_s_estimate or evaluator.group_s
        evaluator.sentence_s = state.eval_sentence_s_estimate or evaluator.sentence_s
        if state.eval_batch_size:  # smaller than the device's default after an evaluation ran out of memory
            evaluator.batch_size = min(evaluator.batch_size, state.eval_batch_size)


def run_with_signals(loop: TrainingLoop) -> LoopResult:
    """Run the loop with Ctrl-C / SIGTERM turned into "save and stop at the next safe point" (scripts
    install the handlers from their start, so that loading is covered too; this keeps them installed)."""
    with loop.stop.installed():
        return loop.run()
