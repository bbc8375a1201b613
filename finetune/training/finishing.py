"""The end of a run that was not stopped, part by part, each checked against the time left before it starts.

The final save is kept in reserve all through training at what each of its parts last cost, slowed down as
much as the machine has lately (pacing.py). A machine that gets busy in the run's last moments still makes
the finish slower than that reserve: so before each part that may be left out, the time left is asked
again, with each part's cost as planned times how much slower the machine runs now (the pacer's slowdown,
and how much longer than planned the finish's own parts have taken so far). In order:

    final evaluation    inside its time limit (pacing.py, evaluation_limit); it may export best_model, with
                        its tempo fit only where that still fits (run_evaluations.py, tempo_fits). How fast it
                        scored its clips against its planned cost a clip tells how much slower the parts
                        after it will run (a machine that got busy during the last step is seen here)
    final_model         the output folder, a copy of best_model (or the last weights): always written
    last checkpoint     left out when it no longer fits (the previous checkpoint stays)
    last_model          a copy of best_model when best_model holds these very weights (no second export,
                        no second tempo fit); else an export with its inference settings fitted; without
                        the fit when only the export fits; left out when neither does

What the user loads (final_model, and best_model, written by the evaluations) is never left out, but the
final evaluation's best_model may lose its tempo fit; last_model goes first (its tempo fit before it), then the
last checkpoint. Each part left out is said in the log and
in metrics.jsonl (`left_out`), with the seconds it needed and the seconds that were left.

`finish` runs the parts over the loop's own (finetune/training/loop.py: its state, evaluations, exports and
checkpoints); FinishTimes decides which still fit.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from finetune.system.interrupt import StopRequested
from finetune.training.outcome import LoopResult
from finetune.training.pacing import SLOWER_BY, Costs, Pacer

if TYPE_CHECKING:  # the loop calls these; only its type is named here
    from finetune.training.loop import TrainingLoop

LAST_MODEL_CHOICES = ("copy of best_model", "export", "export without its tempo fit", "left out")
TIMED_FROM_S = 1.0  # a part of the finish planned shorter than this does not tell how slow the machine is


def fits(part_s: float, then_s: float, slowdown: float, margin_s: float, left_s: float) -> bool:
    """Whether a part of `part_s` seconds (as planned), with `then_s` of what must still follow it, both
    `slowdown` times slower than planned, and the margin, fit in `left_s`."""
    return (part_s + then_s) * slowdown + margin_s <= left_s


def last_model_choice(same_as_best: bool, room_for_copy: bool, room_for_export: bool, room_without_fit: bool) -> str:
    """How last_model is written (one of LAST_MODEL_CHOICES): a copy of best_model when that holds the same
    weights, else an export with its tempo fit, or without it, as the time left allows."""
    if same_as_best:
        return LAST_MODEL_CHOICES[0] if room_for_copy else LAST_MODEL_CHOICES[3]
    if room_for_export:
        return LAST_MODEL_CHOICES[1]
    return LAST_MODEL_CHOICES[2] if room_without_fit else LAST_MODEL_CHOICES[3]


@dataclass
class FinishTimes:
    """The finish's view of time: the costs as they stood when it began (`planned`: a part timed during the
    finish is already as slow as the machine is), and how much slower than planned the machine runs
    (`slowdown`, only ever raised)."""

    pacer: Pacer
    planned: Costs
    slowdown: float
    copy_s: float | None = None  # what copying best_model into the output folder took, in this finish

    @classmethod
    def starting(cls, pacer: Pacer) -> "FinishTimes":
        return cls(pacer, replace(pacer.costs), pacer.slowdown)

    def took(self, planned_s: float, seconds: float) -> None:
        """A part of the finish that was planned at `planned_s` took `seconds`: the parts after it are
        expected to be as much slower. Parts planned under TIMED_FROM_S are not believed (a 0.2 s checkpoint
        that took 0.45 s made a busy run leave out last_model's tempo fit it had the time for)."""
        if planned_s >= TIMED_FROM_S:
            self.slowdown = max(self.slowdown, seconds / planned_s)

    def evaluated(self, clips_scored: int, clips_planned: int, seconds: float) -> None:
        """The final evaluation scored `clips_scored` of `clips_planned` clips in `seconds`: at its planned cost a
        clip, the parts after it are expected to be as much slower. Many clips make one figure that a single
        short part does not (TIMED_FROM_S): a machine that got busy during the last step scored 12 of 16 clips
        in 3.1 s against 1.0 s planned for 16, and the finish's copies and closing report then ran 0.1 s past a
        72 s budget."""
        if clips_scored and clips_planned and self.planned.eval_s > 0:
            slower = seconds / (self.planned.eval_s * clips_scored / clips_planned)
            if slower >= SLOWER_BY:  # below it, the spread of evaluations on an idle machine
                self.slowdown = max(self.slowdown, slower)

    @property
    def then_s(self) -> float:
        """What follows every part, and is never left out: the closing report and the recipe's own end."""
        return self.planned.report_s + self.planned.after_loop_s

    @property
    def margin_s(self) -> float:
        return self.pacer.margin_s  # as set, not slowed down (Pacer.margin_s)

    def room(self, part_s: float) -> bool:
        return fits(part_s, self.then_s, self.slowdown, self.margin_s, self.pacer.budget.left_s())

    def room_for_copy(self) -> bool:
        """Whether a second copy of best_model fits: as long as the first took, in this finish (as planned, a
        copy is counted at an export's or a checkpoint's cost, the larger it can be)."""
        if self.copy_s is None:
            return self.room(self.planned.copy_s)
        return self.copy_s + self.then_s * self.slowdown + self.margin_s <= self.pacer.budget.left_s()

    def needed_s(self, part_s: float) -> float:
        return (part_s + self.then_s) * self.slowdown + self.margin_s

    def left_out(self, run_log, what: str, planned_s: float) -> None:
        """Said in the log and in metrics.jsonl: a part of the finish (planned at `planned_s`) the time left could
        not hold."""
        left_s, needed_s = self.pacer.budget.left_s(), self.needed_s(planned_s)
        slower = (
            f", the machine running {self.slowdown:.1f}x slower than when it was timed" if self.slowdown > 1 else ""
        )
        run_log.logger.warning(
            f"warning: {what} left out: it needs about {needed_s:.1f}s with what must follow "
            f"and the safety margin{slower}; {max(0.0, left_s):.1f}s are left: the deadline comes first"
        )
        run_log.event("left_out", part=what.split(" (")[0], needed_s=round(needed_s, 2), left_s=round(left_s, 2))


def finish(loop: TrainingLoop, reason: str) -> LoopResult:
    """The end of a run that was not stopped: on a failure, the best model trained so far published;
    otherwise the final evaluation (unless the last one saw these weights), best_model copied to the
    output folder, a checkpoint, then last_model, each part checked against the time left before it
    starts (FinishTimes: last_model, then the checkpoint, are left out when they no longer fit). In that
    order of worth: on a full disk the final saves may free older checkpoints, and last_model/ (the
    checkpoint holds the same weights) is the one left out. A stop request
    meanwhile still publishes (TrainingLoop.stop_cleanly): the budget is spent, so no resume would."""
    if reason == "interrupted":
        raise StopRequested(loop.context.stop.signal_name or "SIGINT")
    if reason == "out_of_memory":
        publish_trained_best(loop)  # nothing more fits on the card; what the run learnt still reaches the app
        return loop.result(reason)
    loop.progress.finishing = True
    times = FinishTimes.starting(loop.pacer)
    if loop.evaluations.last_step != loop.state.step:
        final_evaluation(loop, times)
    started, copied = loop.context.now(), (loop.context.paths.best_dir / "config.json").is_file()
    loop.progress.final_saved = loop.context.dist.broadcast(loop.context.on_main(lambda: save_final(loop)))
    took_s = loop.context.now() - started
    if not copied:  # an export, timed as one; a copy's planned figure is only a bound (an export's or less)
        times.took(times.planned.export_s, took_s)
    times.copy_s = took_s if copied else None
    checkpointed = final_checkpoint(loop, times)
    loop.context.on_main(lambda: save_last(loop, times, checkpointed))
    return loop.result(reason)


def final_checkpoint(loop: TrainingLoop, times: FinishTimes) -> bool:
    """The last checkpoint, where the run writes them and the time left holds one (a joint decision:
    writing one is a collective); whether it was written."""
    if not loop.pacer.costs.checkpoints:
        return False
    if not loop.context.dist.broadcast(times.room(times.planned.checkpoint_s)):
        times.left_out(
            loop.context.run_log, "the last checkpoint (the one before it stays)", times.planned.checkpoint_s
        )
        return False
    started = loop.context.now()
    path = loop.checkpoints.write(end_of_epoch=loop.parts.sampler.state.position == 0, final=True)
    times.took(times.planned.checkpoint_s, loop.context.now() - started)
    return path is not None


def final_evaluation(loop: TrainingLoop, times: FinishTimes) -> None:
    """The final evaluation; how fast it scored its clips, and a best model it exports, tell how much slower
    than planned the rest of the finish will run (shared: each process decides the finish's parts alike)."""
    best_before = loop.state.best.step
    loop.windows.match_threads()
    result = loop.evaluations.evaluate(final=True)
    done = loop.context.dist.broadcast((result.clips_scored, result.clips_planned, result.seconds) if result else None)
    if done:
        times.evaluated(*done)
    if loop.state.best.step == loop.state.step != best_before:
        times.took(times.planned.export_s, loop.pacer.costs.export_s)


def save_last(loop: TrainingLoop, times: FinishTimes, checkpointed: bool) -> None:
    """last_model/, written as the time left allows (finishing.py, last_model_choice)."""
    paths, costs, step = loop.context.paths, times.planned, loop.state.step
    same_as_best = loop.state.best.step == step and (paths.best_dir / "config.json").is_file()
    choice = last_model_choice(
        same_as_best,
        times.room_for_copy(),
        times.room(costs.export_s),
        costs.tempo_fit_s > 0 and times.room(costs.export_s - costs.tempo_fit_s),
    )
    summary = {"training_summary.json": final_summary(loop)}
    if choice == LAST_MODEL_CHOICES[0]:
        loop.exports.copy_best_as_last(summary, step)
    elif choice == LAST_MODEL_CHOICES[3]:
        held = "the last checkpoint holds its weights" if checkpointed else "its weights are not kept"
        times.left_out(loop.context.run_log, f"last_model ({held})", costs.copy_s if same_as_best else costs.export_s)
    else:
        fitted = choice == LAST_MODEL_CHOICES[1]
        if not fitted:
            times.left_out(
                loop.context.run_log,
                "last_model's tempo fit (its config.json keeps the model's own settings)",
                costs.export_s,
            )
        loop.exports.export(paths.last_dir, summary, step, loop.last_evaluation_here(), tempo=fitted)


def save_final(loop: TrainingLoop) -> bool:
    """OUTPUT_DIR: a copy of best_model, or the last weights when there is none; its
    training_summary.json says which."""
    paths, best = loop.context.paths, loop.state.best
    has_best = (paths.best_dir / "config.json").is_file()
    loop.progress.final_source = f"best_model (step {best.step})" if has_best else "the last weights (no best_model)"
    extra = {"training_summary.json": final_summary(loop)}
    if not has_best:
        return loop.exports.export(
            paths.output_dir, extra, loop.state.step, loop.last_evaluation_here(), final=True, tempo=True
        )
    return loop.exports.publish_best(extra, best.step)


def publish_trained_best(loop: TrainingLoop) -> None:
    """best_model copied to the output folder, when a trained one is there (a run stopped by a failure:
    its last weights are not worth publishing, and the starting model is no news to the app)."""
    trained = loop.state.best.step > 0 and (loop.context.paths.best_dir / "config.json").is_file()
    if loop.context.dist.broadcast(trained):
        loop.progress.final_saved = loop.context.dist.broadcast(loop.context.on_main(lambda: save_final(loop)))


def final_summary(loop: TrainingLoop) -> dict:
    return {**loop.summary("finished"), "final_model_holds": loop.progress.final_source}
