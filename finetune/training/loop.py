"""The training loop shared by train_vits.py and train_feedback.py. `run()` is its phases, in order, each
skipping itself where a resumed run has done it already:

    fit the batch   on CUDA, the longest clips tried once as one micro-batch; on out-of-memory the
                    micro-batch halves and the accumulation doubles (finetune/training/batch_fit.py)
    baseline        a fresh run pays the evaluation's one-time costs, then evaluates the starting model
                    (timed; the final save is measured too); a resumed process primes its evaluation instead
    warm-up         a new discriminator facing a pretrained generator trains alone first, until it tells
                    real from generated (finetune/training/warmup.py)
    benchmark       the first optimizer steps (--benchmark_samples clips) are ordinary training steps; with
                    the timed evaluation, export and checkpoint they give the plan (plan.json)
    train           steps until the deadline (before each step, finetune/training/pacing.py decides its
                    window: how many micro-batches, the last cut to the clips that fit), an epoch limit or
                    early stopping; evaluations keep the best model
                    (finetune/training/run_evaluations.py), checkpoints at each epoch end and every
                    --checkpoint_every_minutes, the plan re-estimated at each evaluation
    finish          a final evaluation (unless the last one saw these weights), best_model copied to the
                    output folder, a checkpoint, the last weights' export: all inside the budget
                    (finetune/training/finishing.py)

A step of the warm-up or of training is one window of micro-batches through the optimizer, top to
bottom in TrainStep.optimizer_step (finetune/training/step.py), drawn from finetune/training/window.py. Ctrl-C or SIGTERM (finetune/system/interrupt.py) is honoured at the next
safe point: the window under way is rewound, a checkpoint is written, and the loop returns
"interrupted". Many non-finite steps in a row send the run back to its last good state at a lower
learning rate (finetune/training/recovery.py, after_failure); out-of-memory errors in training refit the batch, bounded
(finetune/training/batch_fit.py). One optimizer step reads top to bottom in `training_step` here (its window,
learning rate, the step, its timing, its report) and TrainStep.optimizer_step in step.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from finetune.system.errors import ToolError
from finetune.system.interrupt import StopRequested
from finetune.training import finishing, recovery, schedule
from finetune.training.budget import Plan
from finetune.training.context import Run
from finetune.training.machinery import Machinery
from finetune.training.outcome import LoopResult, RunFigures, summary
from finetune.training.run_settings import LoopSettings
from finetune.training.state import TrainingState
from finetune.training.step import StepResult
from finetune.training.warmup import BUDGET_END
from finetune.vits.generator import train_mode


class BudgetTooSmall(ToolError):
    """The budget cannot hold the work asked for; the message gives the figures and the flag to raise."""


@dataclass
class Progress:
    """What the loop itself has done: time in optimizer steps, the last learning rate, how the end went."""

    train_s: float = 0.0  # seconds inside optimizer steps (warm-up and training)
    last_lr: float = 0.0
    finishing: bool = False  # the final evaluation and saves have begun
    final_saved: bool = False
    final_source: str = ""  # what the output folder holds: best_model (step N) or the last weights
    resumed_with_plan: bool = False  # its plan is made again as training starts


class TrainingLoop:
    """The phases of a run over the collaborators the recipe built (finetune/training/machinery.py)."""

    def __init__(
        self,
        context: Run,
        settings: LoopSettings,
        state: TrainingState,
        machinery: Machinery,
        step_callback: Callable[["TrainingLoop"], None] | None = None,
    ):
        self.parts, self.context, self.settings, self.state = machinery.parts, context, settings, state
        self.step_callback = step_callback
        self.pacer, self.windows, self.fitter = machinery.pacer, machinery.windows, machinery.fitter
        self.exports, self.evaluations, self.checkpoints = (
            machinery.exports,
            machinery.evaluations,
            machinery.checkpoints,
        )
        self.divergence, self.last_good, self.warmup = machinery.divergence, machinery.last_good, machinery.warmup
        self.progress = Progress(resumed_with_plan=self.pacer.plan is not None)

    # ------------------------------------------------------------ the phases

    def run(self) -> LoopResult:
        run_log = self.context.run_log
        run_log.open_display(
            self.pacer.plan.total_steps if self.pacer.plan else 0, self.state.step, self.settings.log_every_seconds
        )
        try:
            self.checkpoints.check_room()  # first: a disk that cannot hold one checkpoint stops before any work
            if not self.fitter.fit_before_training(self.state.step):  # a run that cannot fit one clip stops too
                return self.result("out_of_memory")
            self.context.on_main(self.measure_report)
            self.pacer.costs.report_s = self.context.dist.broadcast(self.pacer.costs.report_s)
            self.baseline_evaluation()
            reason = self.discriminator_warmup() or self.benchmark() or self.train()
            return finishing.finish(self, reason)
        except StopRequested:
            return self.stop_cleanly()
        finally:
            self.windows.feed.close()  # the data loader's workers, if any, end here, inside the budget
            run_log.close()

    @property
    def nothing_done_yet(self) -> bool:
        """Nothing done yet: no plan, no warm-up step, no training step."""
        warmup = self.state.warmup
        return self.pacer.plan is None and self.state.step == 0 and warmup.done == 0 and not warmup.finished

    def baseline_evaluation(self) -> None:
        """A fresh run: evaluate the starting model, and measure what the final save will cost. A resumed
        process primes its evaluation instead (finetune/training/run_evaluations.py)."""
        context = self.context
        if not self.nothing_done_yet:
            self.evaluations.measure_costs_now()
            return
        self.evaluations.pay_one_time_costs()
        self.evaluations.evaluate()
        if self.pacer.costs.export_s == 0.0:  # nothing was exported: the starting model is outside the timing rule
            context.on_main(lambda: self.exports.saver.measure_export(context.paths.run_dir))
            self.pacer.costs.export_s = context.dist.broadcast(self.pacer.costs.export_s)
        if context.dist.any(not self.pacer.room_for(0.0)):
            budget = context.budget
            raise BudgetTooSmall(
                f"the budget of {budget.target_s:.0f}s cannot hold training: {budget.used_s():.0f}s went to start-up, "
                f"loading and the first evaluation ({self.pacer.costs.eval_s:.1f}s), and the final save alone needs about "
                f"{self.pacer.costs.final_s:.0f}s (evaluation, export {self.pacer.costs.export_s:.1f}s, checkpoint) plus a "
                f"{budget.safety_s:.0f}s margin: raise --target_hours"
            )
        per_step = self.settings.batch.batch_size * self.settings.batch.accumulation
        context.run_log.logger.info(
            f"benchmark: {self.benchmark_steps} training steps of {per_step} clips, timed after the "
            "first 2 micro-batches"
        )

    def discriminator_warmup(self) -> str | None:
        """A new discriminator trains alone; a stop reason if its steps failed for good, else None."""
        warmup, progress = self.warmup, self.state.warmup
        if self.pacer.plan is not None or not warmup.needed():
            return None
        checkpoints = self.settings.checkpoints
        pacer = warmup.start(self.pacer.costs, self.pacer.timer.accumulation, checkpoints.every_s, checkpoints.min_s)
        ended = f"the step limit (--discriminator_warmup_steps {self.settings.warmup.steps})"
        while progress.done < self.settings.warmup.steps:
            stop, no_room = self.context.dist.any_of(self.context.stop.requested, warmup.out_of_room(pacer))
            if stop:
                raise StopRequested(self.context.stop.signal_name or "SIGTERM")
            if no_room:
                ended = BUDGET_END
                break
            started = self.context.now()
            self.parts.step.set_learning_rates(
                *schedule.discriminator_warmup_rates(self.settings.warmup.learning_rate, self.state.setbacks.lr_scale)
            )
            with self.windows.kept() as source:
                result = self.parts.step.optimizer_step(
                    source, self.context.dist.broadcast(pacer.next_window()), generator=False
                )
            pacer.timer.record(result.micro_batch_s, result.update_s if result.used else None)
            self.count_samples(result.clips, result.epoch_ended)
            elapsed = self.context.now() - started
            self.progress.train_s += elapsed  # the data it waited for is counted too (the feed's wait_s)
            reached = warmup.record(result, elapsed)
            failure = recovery.after_failure(self, result, f"discriminator warm-up step {progress.done}")
            if failure:
                return failure
            if reached:
                ended = reached
                break
            if self.context.dist.any(pacer.checkpoint_due(result.epoch_ended, self.checkpoints.since_last_s())):
                self.checkpoints.write(end_of_epoch=result.epoch_ended)
        progress.epochs = self.epochs_done  # the epochs it drew: --max_epochs counts the training's
        warmup.end(ended)
        self.keep_the_warmed_discriminator()
        return None

    @property
    def benchmark_steps(self) -> int:
        per_step = self.settings.batch.batch_size * self.settings.batch.accumulation
        return max(3, -(-self.settings.benchmark_samples // per_step))

    def benchmark(self) -> str | None:
        """The first steps, timed, then the plan; a stop reason if training ended during them. A resumed run
        that planned already skips this (its plan is re-estimated as training starts)."""
        if self.pacer.plan is not None:
            return None
        if self.state.step < self.benchmark_steps:  # a run resumed after its benchmark plans at once
            reason = self.training_steps(until=self.benchmark_steps)
            if reason:
                return reason
            self.checkpoints.write(end_of_epoch=self.parts.sampler.state.position == 0)  # the plan counts its cost
        self.make_plan()
        return None

    def train(self) -> str:
        if self.progress.resumed_with_plan:  # planned again for what is left now, at this machine's speed
            self.make_plan()
        return self.training_steps()

    def training_steps(self, until: int | None = None) -> str | None:
        """Optimizer steps until a stop reason (or, with `until`, that many steps: None)."""
        while until is None or self.state.step < until:
            decision = self.decide()
            if decision:
                if decision == "deadline" and self.state.step == 0:
                    self.context.run_log.logger.warning("warning: the budget left no room for a single training step")
                return decision
            result, last = self.training_step()
            if self.step_callback is not None:
                self.step_callback(self)
            failure = recovery.after_failure(self, result)
            if failure:
                return failure
            if last:
                return "max_epochs" if self.pacer.plan and self.pacer.plan.limited_by == "max_epochs" else "deadline"
            if until is not None and self.state.step >= until:
                return None  # the benchmark's end: its checkpoint and the plan follow
            self.after_step(result.epoch_ended)
        return None

    def after_step(self, epoch_ended: bool) -> None:
        """What falls due after a planned step: an evaluation (and a new plan), a checkpoint; left to the
        final save, a step later, when it would leave no room for another step (Pacer.room_for_due)."""
        due_s = self.due_after_s(self.state.step, epoch_ended)
        if due_s and self.context.dist.any(not self.pacer.room_for_due(due_s)):
            self.context.run_log.logger.info(
                f"step {self.state.step}: what fell due ({due_s:.1f}s: evaluation or checkpoint) "
                "is left to the final save, one step later: it would leave no room for that step"
            )
            return
        if self.pacer.eval_due(self.state.step):
            self.windows.match_threads()
            self.evaluations.evaluate()
            self.replan()
        # Joint: the periodic one depends on each process's own clock, and writing one is a collective.
        if self.context.dist.any(self.pacer.checkpoint_due(epoch_ended, self.checkpoints.since_last_s())):
            self.checkpoints.write(end_of_epoch=epoch_ended)

    def stop_cleanly(self) -> LoopResult:
        """After a stop request: back to the last completed step if it came mid-window, then a checkpoint
        (and, in the final evaluation, the output folder first)."""
        self.windows.rewind()
        train_mode(self.parts.step.model, self.parts.frozen_parts)
        if self.progress.finishing and not self.progress.final_saved:
            self.progress.final_saved = self.context.dist.broadcast(
                self.context.on_main(lambda: finishing.save_final(self))
            )
        result = self.result("interrupted")
        result.checkpoint = self.checkpoints.write(end_of_epoch=False, final=True)  # None: none could be written
        return result

    # ------------------------------------------------------------ one step

    def decide(self) -> str:
        """Why no further step should run ("" when one should), shared by all processes (one collective)."""
        stop, no_room = self.context.dist.any_of(self.context.stop.requested, not self.pacer.may_start_step())
        plan, max_epochs = self.pacer.plan, self.settings.max_epochs
        if stop:
            return "interrupted"
        if self.evaluations.early_stop:
            return "early_stopping"
        if max_epochs and self.epochs_done - self.state.warmup.epochs >= max_epochs - 1e-9:  # the warm-up's not
            return "max_epochs"
        if plan is not None and plan.limited_by == "max_epochs" and self.state.step >= plan.total_steps:
            return "max_epochs"
        return "deadline" if no_room else ""

    def training_step(self) -> tuple[StepResult, bool]:
        """One optimizer step of generator and discriminator, and whether it is the run's last, in order:

        1. its window, decided before it starts, jointly (every process runs the main one's): how many
           micro-batches, the last cut to the clips that fit (the deadline's: finetune/training/pacing.py),
           and whether it is the run's last
        2. its learning rates, on the plan's curve (finetune/training/schedule.py): the warm-up and the cosine,
           the floor on the last step, scaled down after setbacks
        3. the step itself, top to bottom in finetune/training/step.py (TrainStep.optimizer_step): each
           micro-batch drawn (finetune/training/window.py, which keeps where the window started),
           forward and backward, then the update
        4. its timing, into the pacer's timer (what the next decisions are made with)
        5. out of GPU memory: the micro-batch refitted and the window run again (batch_fit.py bounds it)
        6. the counters and the progress line"""
        number, started = self.state.step + 1, self.context.now()
        dist, pacer, step = self.context.dist, self.pacer, self.parts.step
        profile = self.context.run_log.profile.activate()
        try:
            for attempt in (1, 2):
                window = dist.broadcast(pacer.next_window())  # 1
                last = dist.any(pacer.step_is_last(number, window))
                # 2: before the plan, the one each process's own timings foretell: the main one's for all
                plan = pacer.plan or dist.broadcast(pacer.foretold_plan(self.steps_per_epoch, number - 1))
                lr, discriminator_lr = schedule.rates(
                    self.settings.schedule, number, last, plan, self.state.setbacks.lr_scale
                )
                step.set_learning_rates(lr, discriminator_lr)
                with self.windows.kept() as source:  # 3
                    result = step.optimizer_step(
                        source,
                        window,
                        discriminator=step.discriminator_learns(number),
                        duration=step.duration_learns(number),
                    )
                pacer.timer.record(result.micro_batch_s, result.update_s if result.used else None)  # 4
                if not result.oom:
                    break
                if attempt == 2:  # even the smaller micro-batches: counted toward the next refit (or the stop)
                    self.fitter.after_out_of_memory()
                elif self.refit(result.oom, number, rewind=True):  # 5
                    step.skips.oom -= 1  # not skipped after all: its clips run again, in smaller micro-batches
                    continue
                break
            if result.cut_to:
                self.context.run_log.logger.info(
                    f"step {number}: its last micro-batch cut to {result.cut_to} of "
                    f"{self.fitter.micro_batch} clips, the time the deadline leaves: the run's last step"
                )
            if result.cut_by_deadline:  # the machine slowed down mid-window: what ran is applied, the run ends
                last = True
                why = (
                    f"micro-batch {result.used + 1} given up after {result.given_up_s:.1f}s, at the time the final "
                    "save needs (the machine slowed down under it)"
                    if result.given_up_s
                    else f"the last one {result.micro_batch_s[-1] if result.micro_batch_s else 0:.1f}s (slower than "
                    "planned): one more no longer fits before the final save"
                )
                self.context.run_log.logger.info(
                    f"step {number}: its window ended after {result.used} of {window.micro_batches} micro-batches, "
                    f"{why}; the run's last step"
                )
            elapsed = self.context.now() - started  # 6
            self.progress.train_s += elapsed
            self.progress.last_lr, self.state.step = lr, number
            self.count_samples(result.clips, result.epoch_ended)
            self.report_step(result, (lr, discriminator_lr), result.clips / max(elapsed, 1e-9))
            profile.end_step()
            return result, last
        finally:
            profile.deactivate()

    def refit(self, what: str, number: int, rewind: bool = False) -> bool:
        """A smaller micro-batch after running out of memory in training, when the fitter's bound says so
        (then plan.json says so; at one clip, the bound's last call ends the run: the fitter is `exhausted`);
        `rewind`: back to the start of the window under way first (its clips and random state, to be run again)."""
        if self.fitter.after_out_of_memory() != "refit":
            return False
        if rewind:
            self.windows.run_again()
        self.fitter.refit_in_training(what, number)
        if self.pacer.plan is not None:
            self.write_plan()
        return True

    @property
    def epochs_done(self) -> float:
        """The corpus's epochs the sampler has gone through, the part of the current one included."""
        sampler = self.parts.sampler
        return self.state.epoch + sampler.state.position / max(1, sampler.batches_per_epoch)

    def count_samples(self, clips: int, epoch_ended: bool) -> None:
        """The clips a step used (a cut or short micro-batch counts the clips it had), and the epoch."""
        self.state.samples_seen += clips
        if epoch_ended:
            self.state.epoch += 1

    def due_after_s(self, step: int, epoch_ended: bool) -> float:
        """Seconds of what falls due after this step: an evaluation (and the best model's export), a checkpoint."""
        evaluation = self.pacer.costs.eval_s + self.pacer.costs.export_s if self.pacer.eval_due(step) else 0.0
        checkpoint = (
            self.pacer.costs.checkpoint_s
            if self.pacer.checkpoint_due(epoch_ended, self.checkpoints.since_last_s())
            else 0.0
        )
        return evaluation + checkpoint

    def report_step(self, result: StepResult, rates: tuple[float, float], samples_per_s: float) -> None:
        state, sampler, dist, used = self.state, self.parts.sampler, self.context.dist, result.used
        lr, discriminator_lr = rates
        if not result.applied:
            self.context.run_log.logger.warning(f"step {state.step}: skipped ({result.reason}); losses {result.losses}")
        total, epochs = (self.pacer.plan.total_steps, self.pacer.plan.epochs) if self.pacer.plan else (0, 0.0)
        accumulation = self.pacer.timer.accumulation
        left_in_epoch = (sampler.batches_per_epoch - sampler.state.position) / accumulation
        step_s = self.pacer.timer.step_s if self.pacer.timer.ready else 0.0
        samples_per_s = dist.sum(samples_per_s)
        fields = dict(
            step=state.step,
            total=total,
            epoch=self.epochs_done,
            epochs=epochs,
            lr=lr,
            samples_per_s=samples_per_s,
            epoch_eta_s=left_in_epoch * step_s,
            run_eta_s=max(0, total - state.step) * step_s,
            deadline_s=self.context.budget.left_s(),
        )
        losses = dist.mean(result.losses)  # every process's share of the window, averaged
        scalars = {
            "lr": lr,
            "discriminator_lr": discriminator_lr,
            "samples_per_s": samples_per_s,
            "grad_norm_generator": result.grad_norm_generator,
            "grad_norm_discriminator": result.grad_norm_discriminator,
            "time_used_s": self.context.budget.used_s(),
            "micro_batches": used,
            **self.parts.step.scaler_figures(),
        }
        self.context.run_log.step(self.context.now(), fields, used, accumulation, losses, scalars)

    def keep_the_warmed_discriminator(self) -> None:
        """After the warm-up, the warmed discriminator becomes the state to go back to: a checkpoint (which
        also keeps it from a kill), or, where the run writes none or the write failed, a copy in RAM."""
        if self.state.warmup.done == 0:
            return
        path = self.checkpoints.write(end_of_epoch=False) if self.settings.checkpoints.enabled else None
        if path is None:
            self.last_good.retake(self.parts.step.model, self.parts.step.discriminator)

    # ------------------------------------------------------------ planning, saving, reporting

    @property
    def steps_per_epoch(self) -> int:
        return -(-self.parts.sampler.batches_per_epoch // self.pacer.timer.accumulation)

    def replan(self) -> Plan:
        asked = self.settings.evaluation.every  # --val_every (0: planned, then kept at the first plan's)
        eval_every = self.pacer.plan.eval_every if self.pacer.plan else asked
        plan = self.context.dist.broadcast(
            self.pacer.replan(self.steps_per_epoch, self.state.step, eval_every, evaluations_planned=not asked)
        )
        self.pacer.plan = plan  # one plan (and learning-rate schedule) for every process
        self.context.run_log.set_total(plan.total_steps)
        return plan

    def make_plan(self) -> None:
        self.replan()
        self.write_plan()

    def write_plan(self) -> None:
        plan, budget = self.pacer.plan, self.context.budget
        record = plan.to_dict()
        record.update(
            budget_target_s=budget.target_s,
            time_used_s=round(budget.used_s(), 2),
            batches_per_epoch=self.parts.sampler.batches_per_epoch,
            micro_batch_s=round(self.pacer.timer.micro_batches.mean_s, 4),
            update_s=round(self.pacer.timer.updates.mean_s, 4),
        )
        record.update(self.fitter.summary())  # the micro-batch the run fitted to memory, and each refit
        self.context.run_log.plan(
            record,
            f"plan: {plan.total_steps} optimizer steps ({plan.epochs:.2f} epochs of "
            f"{plan.steps_per_epoch} steps) in the {budget.left_s():.0f}s left; {plan.step_s:.3f}s a "
            f"step, {plan.evaluations_in_words} ({plan.eval_s:.1f}s each), checkpoint "
            f"{plan.checkpoint_s:.1f}s, final save {plan.final_s:.1f}s; warmup {plan.warmup_steps} "
            f"steps; limited by {plan.limited_by}",
        )

    def measure_report(self) -> None:
        """report.html once before anything is timed: its imports (matplotlib) are paid here, and what it
        costs is known before the first evaluation is limited by it."""
        started = self.context.now()
        self.context.run_log.write_report()
        self.pacer.costs.report_s = max(self.pacer.costs.report_s, self.context.now() - started)

    def last_evaluation_here(self) -> dict | None:
        """The last evaluation's figures when it saw the weights as they are now."""
        last = self.evaluations.last
        return last.summary() if last is not None and last.step == self.state.step else None

    def summary(self, reason: str) -> dict:
        return summary(
            RunFigures(
                self.state,
                self.parts.step,
                self.progress.last_lr,
                self.context.budget.used_s(),
                self.context.budget.target_s,
                self.exports.saver.failures,
                self.fitter.summary(),
                self.evaluations.last_summary(),
                self.evaluations.final_skipped,
            ),
            reason,
        )

    def result(self, reason: str) -> LoopResult:
        """The result, naming the newest checkpoint this run wrote or resumed."""
        return LoopResult(
            stop_reason=reason,
            state=self.state,
            plan=self.pacer.plan,
            last_eval=self.evaluations.last,
            last_lr=self.progress.last_lr,
            data_wait_s=self.windows.feed.wait_s,
            train_s=self.progress.train_s,
            checkpoint=self.checkpoints.last,
            save_failures=self.exports.saver.failures,
            final_saved=self.progress.final_saved,
        )


def run_with_signals(loop: TrainingLoop) -> LoopResult:
    """Run the loop with Ctrl-C / SIGTERM turned into "save and stop at the next safe point" (scripts
    install the handlers from their start, so that loading is covered too; this keeps them installed)."""
    with loop.context.stop.installed():
        return loop.run()
