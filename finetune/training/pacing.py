"""The deadline decisions of a run, each taken before the work it decides: whether the next step may start,
the window it runs (how many micro-batches, the last one cut to the clips that fit), whether it is the
run's last, and the plan whose steps the learning rate spans (schedule.py).

Everything is asked of the budget with cautious estimates (finetune/training/budget.py, StepTimer) and with the
final save kept in reserve: the final evaluation, the export and the last checkpoint, at what they last
cost. The unit of decision is a micro-batch, and within the last one a clip: with accumulation 4 on a slow
machine a step can be a tenth of a short budget, and deciding by whole steps would leave most of one unused
(or, worse, start one that cannot finish). So, before each step:

    a step starts      when one clip of a micro-batch and an update fit (the very first always does:
                       nothing is timed yet; before it, a budget that cannot even hold the final save is
                       an error)
    its window         (next_window) holds `accumulation` micro-batches, or fewer when the deadline leaves
                       room for fewer: a micro-batch runs while it leaves room for one more clip and the
                       update, and the last is cut to the clips that still fit with the update (at a whole
                       micro-batch's cautious cost a clip), at least one: a coarse step (a fifth of a
                       short budget, on a slow machine) would otherwise leave most of a micro-batch unused.
                       An epoch's end also ends a window (the step sees it; it is not a deadline decision)
    a step is the last when its window was shortened, or when after it not even one more clip and update
                       would fit; the last step runs at the learning-rate floor. An evaluation or
                       checkpoint due after a step that would leave no room for one more is left to the
                       final save, a step later (room_for_due)
    an evaluation      runs until its time limit (evaluation_limit): what must come after it (the final
                       save; for the final one, the exports and the last checkpoint) is kept free, so one
                       that runs slower than the last (a cold resumed process, a machine that got busy)
                       is cut short rather than pushing the run past its deadline

The step itself (finetune/training/step.py) runs the window it is given and never asks back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from finetune.system.time_limit import TimeLimit
from finetune.training.budget import Budget, Plan, StepTimer, make_plan
from finetune.training.run_settings import LoopSettings
from finetune.training.state import Estimates

SLOWER_BY = 1.25  # micro-batches this much slower than when the final save was timed: the machine slowed down
UNTIMED_UPDATE = 0.5  # an update not timed yet: this share of a micro-batch


@dataclass
class Costs:
    """Seconds the run spends besides training steps, at what each last cost (the first evaluation also
    pays one-time compilation, so the latest, not the largest, is what counts)."""

    eval_s: float = 0.0  # an evaluation (synthesis and scoring)
    export_s: float = 0.0  # writing a model folder (best model, final model)
    checkpoint_s: float = 0.0
    after_loop_s: float = 0.0  # what the caller does after the loop returns (kept out of the plan)
    checkpoints: bool = True  # False: the run writes none (feedback rounds)
    report_s: float = 0.0  # writing report.html (after each evaluation, and at the end)
    tempo_fit_s: float = 0.0  # the part of export_s that fits the inference settings (model_folders.py)
    final_eval_cushion: float = 1.0  # the final evaluation kept this many times its cost (> 1: one cut short is lost)
    # What a micro-batch usually cost when the evaluation and the exports were last timed (0: not known yet): the
    # final save is expected to have slowed down as much as the micro-batches have since (Pacer.slowdown).
    timed_at_micro_batch_s: float = 0.0
    timed_at_threads: int = 0  # the torch threads a CPU run trained on then (0: not counted)

    @classmethod
    def from_estimates(cls, estimates: Estimates, settings: LoopSettings, cut_short_usable: bool) -> "Costs":
        """What a run's estimates (a resumed run's; zero for a new one) say its work besides steps costs. An evaluator
        that cannot use a cut-short final evaluation keeps a quarter more for it (final_s)."""
        return cls(
            eval_s=estimates.eval_s,
            export_s=estimates.export_s,
            checkpoint_s=estimates.checkpoint_s,
            after_loop_s=settings.reserve_after_s,
            checkpoints=settings.checkpoints.enabled,
            final_eval_cushion=1.0 if cut_short_usable else 1.25,
        )

    @property
    def final_s(self) -> float:
        """The final evaluation (which may export a best model), last_model (a copy of best_model when the
        final evaluation kept these weights, else their export), best_model's copy into the output folder, the
        last checkpoint, the closing report, and whatever the caller needs after. An evaluator that cannot use a cut-short final evaluation (a feedback round's: its
        verdict compares means) has it kept with a cushion: a trained model speaking a little longer than
        the start did, on a machine a little busier, cut a 60 s round's at 12 of 13 clips."""
        return self.eval_s * self.final_eval_cushion + self.after_final_eval_s

    @property
    def after_final_eval_s(self) -> float:
        """One export and two copies: the final evaluation's best model exported and copied as last_model, or
        the last weights exported when it kept none (the output folder a copy of best_model either way). Two
        exports were kept before last_model could be a copy: the one never made left a busy run 4.5% early."""
        checkpoint = self.checkpoint_s if self.checkpoints else 0.0
        return self.export_s + 2 * self.copy_s + checkpoint + self.report_s + self.after_loop_s

    @property
    def copy_s(self) -> float:
        """best_model's copy into the output folder: a file copy of a model, no fit, no serialising. A
        checkpoint (those weights, their optimizer states and the discriminator, serialised) costs more,
        so its time bounds the copy's; an export's where the run writes none. Counting a whole export
        instead (with its tempo fit) left ~1% of a 180 s budget unused and cut the final evaluation
        short to make room for it."""
        return min(self.export_s, self.checkpoint_s) if self.checkpoints and self.checkpoint_s > 0 else self.export_s


@dataclass(frozen=True)
class WindowShape:
    """What one optimizer step runs: `micro_batches` of the `planned` (the accumulation), each of `clips`
    clips (1: whole micro-batches, never cut) but the last, cut to `last_clips`."""

    planned: int
    micro_batches: int
    clips: int
    last_clips: int

    @property
    def shortened(self) -> bool:
        """Fewer micro-batches than planned, or the last one cut: the deadline's doing, the run's last step."""
        return self.micro_batches < self.planned or self.last_clips < self.clips


class Pacer:
    """The deadline decisions over a budget, a step timer (whose `accumulation` is the window's size now)
    and the costs of what follows training; `warmup_steps`, the learning rate's warm-up its plans cut to a
    tenth of their steps (schedule.warmup_steps)."""

    def __init__(
        self,
        budget: Budget,
        timer: StepTimer,
        costs: Costs,
        checkpoint_every_s: float,
        max_epochs: int = 0,
        warmup_steps: int = 0,
        plan: Plan | None = None,
        checkpoint_min_s: float = 0.0,
        threads: Callable[[], int] | None = None,
    ):
        self.budget, self.timer, self.costs, self.plan = budget, timer, costs, plan
        self.checkpoint_every_s, self.max_epochs, self.warmup_steps = checkpoint_every_s, max_epochs, warmup_steps
        self.checkpoint_min_s = checkpoint_min_s
        self.threads = threads  # a CPU run's torch thread count now (finetune/system/cpu_threads.py); None: not counted
        if threads is not None and not costs.timed_at_threads:  # costs timed in this process before any micro-batch
            costs.timed_at_threads = threads()

    @classmethod
    def for_run(
        cls,
        budget: Budget,
        timer: StepTimer,
        costs: Costs,
        settings: LoopSettings,
        plan: Plan | None,
        threads: Callable[[], int] | None = None,
    ) -> "Pacer":
        """The pacer of a run with these settings (its checkpoints' spacing, its epochs, its warm-up), resuming `plan`;
        `threads`, a CPU run's torch thread count."""
        checkpoints = settings.checkpoints
        return cls(
            budget,
            timer,
            costs,
            checkpoints.every_s,
            settings.max_epochs,
            settings.schedule.warmup_steps,
            plan,
            checkpoint_min_s=checkpoints.min_s,
            threads=threads,
        )

    @property
    def slowdown(self) -> float:
        """How much slower than when they were timed the final save and the exit should be expected to run: the
        last five micro-batches against what one cost when the evaluation and the exports were last timed (a
        machine that got busy, and the threads a CPU run then gives up to the other processes, show within three
        slower micro-batches; below SLOWER_BY, the spread of micro-batches of different lengths, it is not
        believed), less what the threads given up since explain (threads_given_up); where they were timed before
        any micro-batch ran (the baseline evaluation alone), against the first micro-batches, which ran right
        after it. Against the window's usual, before, a coarse 72 s run that got busy in its benchmark steps (12 of
        the window's 20 micro-batches) was not believed, and it ended 1.8 s past its budget; and counted beside
        this one, the window's slowed an evaluation timed on the busy machine down a second time (3.4x: a coarse
        run ended 17.5 s early of 180 s, a fine one from a pretrained start 6.6% early of 72 s)."""
        durations = self.timer.micro_batches
        timed_at = self.costs.timed_at_micro_batch_s or durations.early_s
        if not timed_at:
            return 1.0
        since_timed = durations.lately_s / timed_at
        return max(1.0, since_timed / self.threads_given_up) if since_timed >= SLOWER_BY else 1.0

    @property
    def threads_given_up(self) -> float:
        """How much of the micro-batches' slowdown the threads a CPU run gave up since the costs were timed
        explain: the square root of the threads then over the threads now (1 where none were given up). The final
        save runs mostly on one thread (serialising, copying, the evaluation's small operations) and does not feel
        them: with the slowdown of the micro-batches whole, a run from a pretrained start busy from half-way
        through 72 s kept 5.5 s for a final save that took 4 s, and one of coarse steps busy from half-way through
        180 s kept 20 s for 8 s. Measured on 2 cores (bench/bench_step.py, OMP_NUM_THREADS 2 against 1), two
        threads ran the demo's micro-batch 1.30x as fast as one and a coarse one (the standard discriminator)
        1.87x: the square root of 2 counts the first a little high, which the safety margin holds; what the
        finish then finds is checked before each of its parts (finishing.py)."""
        if self.threads is None or not self.costs.timed_at_threads:
            return 1.0
        return math.sqrt(max(1.0, self.costs.timed_at_threads / max(1, self.threads())))

    def costs_timed(self) -> None:
        """The evaluation and the exports were just timed: at what a micro-batch costs now (the last five's median:
        one timed on a machine that just got busy is as slow as it, and must not be slowed down again), on the
        threads a CPU run trains on now."""
        if self.timer.micro_batches.recent:
            self.costs.timed_at_micro_batch_s = self.timer.micro_batches.lately_s
        if self.threads is not None:
            self.costs.timed_at_threads = self.threads()

    def room_for(self, seconds: float) -> bool:
        """Whether `seconds` of work still leave the final save and the safety margin (both as timed or
        set earlier, slowed down as much as training has lately)."""
        return seconds + self.final_reserve_s + self.margin_s <= self.budget.left_s()

    @property
    def final_reserve_s(self) -> float:
        return self.costs.final_s * self.slowdown

    @property
    def margin_s(self) -> float:
        """The safety margin, as set: it holds the estimates' error and the process's exit, which is
        os._exit after the logs are flushed (finetune/cli.py, exit_process). It was slowed down with the
        machine while the exit was the interpreter's teardown (2-3 times as long beside two busy processes);
        without that teardown, a busy 72 s run kept 2.5-2.8 s for a margin of 1 s and ended 3.5-4.1% early."""
        return self.budget.safety_s

    @property
    def one_more_step_s(self) -> float:
        """The least a step can cost: one clip of a micro-batch and its update."""
        return self.timer.clip_s + self.timer.update_s

    def one_more_fits(self, last_micro_batch_s: float) -> bool:
        """Mid-window: whether one more micro-batch, as long as the last one took, and the update still leave the
        final save (at its slowdown) and the margin."""
        return self.room_for(last_micro_batch_s + self.update_after_s(last_micro_batch_s))

    def must_end_in_s(self, micro_batch_s: float) -> float:
        """Seconds from now by which a micro-batch under way (usually `micro_batch_s` long) must end for the update,
        the final save (at its slowdown) and the margin to still fit: a micro-batch still running then is given up
        (finetune/training/late.py)."""
        return self.budget.left_s() - self.final_reserve_s - self.margin_s - self.update_after_s(micro_batch_s)

    def update_after_s(self, micro_batch_s: float) -> float:
        """The update's cautious cost; before one is timed, UNTIMED_UPDATE of the micro-batch before it (the first
        AdamW step also makes the optimizers' state: 3.5 s after three 10 s micro-batches on a busy 2-core machine,
        and a run whose first step was its last ended 4.8 s past 72 s counting it 0)."""
        return self.timer.update_s if self.timer.updates.ready else UNTIMED_UPDATE * micro_batch_s

    def may_start_step(self) -> bool:
        return self.room_for(self.one_more_step_s)

    def next_window(self) -> WindowShape:
        """The window of the next step, decided before it starts: its micro-batches one after another, each
        taken while it leaves room for one more clip and the update; the last cut to the clips that fit
        (at least one: a step that started runs at least one clip). Nothing timed yet: the whole window."""
        timer = self.timer
        whole = WindowShape(timer.accumulation, timer.accumulation, timer.clips, timer.clips)
        if not timer.micro_batches.ready:
            return whole
        free = self.budget.left_s() - self.final_reserve_s - self.margin_s - timer.update_s
        clip_s = max(timer.clip_s, 1e-9)
        for index in range(1, timer.accumulation + 1):
            clips = timer.clips if timer.clips <= 1 else max(1, min(timer.clips, int(free / clip_s)))
            if clips < timer.clips:  # cut to what fits: this one is the last
                return WindowShape(timer.accumulation, index, timer.clips, clips)
            free -= timer.micro_batch_s
            if free < clip_s and index < timer.accumulation:  # not one more clip after it: the last
                return WindowShape(timer.accumulation, index, timer.clips, timer.clips)
        return whole

    def eval_due(self, step: int) -> bool:
        return self.plan is not None and self.plan.evaluation_due(step)

    def checkpoint_due(self, epoch_ended: bool, since_checkpoint_s: float) -> bool:
        """Every `checkpoint_every_s` inside an epoch, and at an epoch's end unless the last checkpoint is
        younger than `checkpoint_min_s` (a small corpus's epochs on a GPU: a 1 GB checkpoint every minute or
        two). The first (after the benchmark's steps) and the final one are written whatever the time."""
        if not self.costs.checkpoints:
            return False
        return since_checkpoint_s >= self.checkpoint_every_s or (
            epoch_ended and since_checkpoint_s >= self.checkpoint_min_s
        )

    def step_is_last(self, step: int, window: WindowShape) -> bool:
        """Before a step: whether it is the run's last (its window was shortened, the plan's epochs are done,
        or after its window and update not even one more clip would fit)."""
        if window.shortened:
            return True
        if self.plan is not None and self.plan.limited_by == "max_epochs" and step >= self.plan.total_steps:
            return True
        window_s = window.micro_batches * self.timer.micro_batch_s + self.timer.update_s
        return not self.room_for(window_s + self.one_more_step_s)

    def room_for_due(self, due_s: float) -> bool:
        """After a step: whether what fell due (an evaluation, a checkpoint; `due_s` seconds) leaves room
        for one more step. When it does not, it is left to the final save a step later: doing it, then
        stopping, would leave the time of the steps it displaced unused (on a slow machine a sixth of a
        short budget is one step, and an evaluation due after every one)."""
        return self.room_for(due_s + self.one_more_step_s)

    def evaluation_limit(self, final: bool) -> TimeLimit:
        """Until when an evaluation's scoring and test sentences may run. After them come its report
        and, if it is the best so far, an export; then the final save (the final evaluation: its own
        exports, the last checkpoint and the closing report). Those are kept free, slowed down as much
        as training has lately, with the safety margin."""
        now = self.budget.clock.now()
        return TimeLimit(
            self.budget.clock.now, now + self.budget.left_s() - self.margin_s - self.after_evaluation_s(final)
        )

    def after_evaluation_s(self, final: bool) -> float:
        """Seconds kept free after an evaluation's scoring (see evaluation_limit)."""
        costs = self.costs
        # The final evaluation redraws no report (the closing one, in after_final_eval_s, follows it).
        after = costs.after_final_eval_s if final else costs.report_s + costs.export_s + costs.final_s
        return after * self.slowdown

    def foretold_plan(self, steps_per_epoch: int, steps_done: int) -> Plan | None:
        """The plan the steps timed so far give (None before the first): the one the learning rate of the
        benchmark's steps spans (schedule.rates). Without it they warmed up over the whole --warmup_steps, which
        the plan then cut to a tenth of its steps: a 225 s fine-tune at the second scale ran its 25 benchmark
        steps, half of its 48, at 0.2-5% of its rate, and then began its cosine half way down."""
        if not self.timer.ready:
            return None
        return self.plan_now(steps_per_epoch, steps_done, 0, evaluations_planned=True)

    def replan(self, steps_per_epoch: int, steps_done: int, eval_every: int, evaluations_planned: bool) -> Plan:
        self.plan = self.plan_now(steps_per_epoch, steps_done, eval_every, evaluations_planned)
        return self.plan

    def plan_now(self, steps_per_epoch: int, steps_done: int, eval_every: int, evaluations_planned: bool) -> Plan:
        costs = self.costs
        return make_plan(
            self.budget.left_s(),
            self.timer.step_s,
            costs.eval_s + costs.export_s,
            costs.checkpoint_s if costs.checkpoints else 0.0,
            costs.final_s,
            steps_per_epoch,
            steps_done,
            self.warmup_steps,
            self.budget.safety_s,
            eval_every=eval_every,
            max_epochs=self.max_epochs,
            checkpoint_every_s=self.checkpoint_every_s,
            checkpoint_min_s=self.checkpoint_min_s,
            evaluations_planned=evaluations_planned,
        )
