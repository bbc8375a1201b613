"""A new discriminator's warm-up: it trains alone before its gradients reach a pretrained generator.

MMS checkpoints carry no discriminator. A new one is random: its first gradients would pull a good voice
towards whatever a random network prefers. So before joint training it trains alone, on the generator's
output, until it tells real from generated (its mean score on real minus generated audio, over the last
20 steps, reaches --discriminator_warmup_margin): the generator runs without gradients and does not change,
and the discriminator learns at its own constant rate (--discriminator_warmup_learning_rate, default 2e-4, the
original VITS rate: the joint schedule's small fine-tuning rate, ramping up from zero, would leave it
random). Its loss and its real-minus-generated score margin (near 0 while it cannot tell them apart) are
logged at the start and the end.

The warm-up is part of the run: it counts against the budget (at most --discriminator_warmup_share of
the time left when it first starts; it is cut short there, and says so), it consumes data like training
steps, and the plan is made after it, from what is left. Like training it writes a checkpoint every
--checkpoint_every_minutes (and at an epoch's end), so a kill loses at most that much of it; a resumed
run continues it where it was (its step count, its time cap and time spent, its latest margins). A
step that fails (non-finite losses many times in a row, out of memory inside the update) sends it back
to the last good state like a training step does (finetune/training/recovery.py). When it ends, that
state is taken again (a checkpoint, else a copy in RAM): a later rollback must not bring back the
random discriminator while the warm-up stays marked as done.
"""

from __future__ import annotations

from collections import deque

from finetune.training.budget import StepTimer
from finetune.system.interrupt import StopRequested
from finetune.training.pacing import Pacer
from finetune.system.progress import format_duration

MARGIN_WINDOW = 20  # steps the margin is averaged over before the warm-up may end


def warm_up(loop) -> str | None:
    """Run the discriminator alone until it separates real from generated speech (its score margin, over
    the last MARGIN_WINDOW steps, reaches --discriminator_warmup_margin), for at most
    --discriminator_warmup_steps steps and --discriminator_warmup_share of the time left. Nothing to do
    for a loaded discriminator, or one a resumed run already warmed up. Returns a stop reason when
    its steps keep failing ("diverged", "out_of_memory"), else None."""
    config, state, budget = loop.config, loop.state, loop.budget
    limit = config.discriminator_warmup_steps
    if state.discriminator_warmup_finished or state.discriminator_warmup_done >= limit:
        return None
    if state.discriminator_warmup_allowed_s <= 0:  # its first start; a resumed warm-up keeps its cap
        state.discriminator_warmup_allowed_s = config.discriminator_warmup_share * budget.left_s()
    pacer = Pacer(budget, StepTimer(config.gradient_accumulation_steps), loop.costs, config.gradient_accumulation_steps, config.checkpoint_every_s,
                  0, 0, config.discriminator_warmup_learning_rate, 1.0)
    left_s = state.discriminator_warmup_allowed_s - state.discriminator_warmup_s
    loop.logger.info(f"discriminator warm-up: alone at learning rate {config.discriminator_warmup_learning_rate:g} until its "
                     f"real-minus-generated margin reaches {config.discriminator_warmup_margin:g}, at most "
                     f"{limit - state.discriminator_warmup_done} steps and {format_duration(max(0.0, left_s))}; "
                     "the generator is untouched" + (f" (resumed at step {state.discriminator_warmup_done})"
                                                     if state.discriminator_warmup_done else ""))
    started_s = state.discriminator_warmup_s
    ended, failure = run_steps(loop, pacer)
    if failure:
        return failure
    state.discriminator_warmup_finished = True
    retake_last_good(loop)
    report_end(loop, ended, state.discriminator_warmup_s - started_s)
    return None


def run_steps(loop, pacer: Pacer) -> tuple[str, str | None]:
    """Warm-up steps until one of its ends: (what ended it, a stop reason if its steps keep failing)."""
    config, state = loop.config, loop.state
    limit = config.discriminator_warmup_steps
    margins: deque[float] = deque(state.discriminator_warmup_margins, maxlen=MARGIN_WINDOW)
    while state.discriminator_warmup_done < limit:
        left_s = state.discriminator_warmup_allowed_s - state.discriminator_warmup_s
        stop, no_room = loop.dist.any_of(loop.stop.requested, not pacer.may_start_step()
                                         or (pacer.timer.ready and pacer.timer.cautious_step_s > left_s))
        if stop:
            raise StopRequested(loop.stop.signal_name or "SIGTERM")
        if no_room:
            return "the budget (it may take at most --discriminator_warmup_share of the time left)", None
        outcome = one_step(loop, pacer)
        failure = loop.after_failure(outcome, f"discriminator warm-up step {state.discriminator_warmup_done}")
        if failure:
            return "", failure
        if outcome.result.applied:
            margins.append(outcome.result.losses["margin"])
            state.discriminator_warmup_margins = list(margins)
            state.discriminator_warmup_first = state.discriminator_warmup_first or dict(outcome.result.losses)
            state.discriminator_warmup_last = dict(outcome.result.losses)
        if len(margins) == MARGIN_WINDOW and sum(margins) / MARGIN_WINDOW >= config.discriminator_warmup_margin:
            return "separating real from generated", None
        checkpoint_if_due(loop, pacer, outcome.epoch_ended)
    return f"the step limit (--discriminator_warmup_steps {limit})", None


def one_step(loop, pacer: Pacer):
    """One discriminator-only step (its outcome: applied, or dropped and why), timed into the warm-up's
    share of the budget."""
    from finetune.training.loop import StepOutcome

    state, clock = loop.state, loop.budget.clock
    started = clock.now()
    loop.step.set_learning_rates(0.0, loop.config.discriminator_warmup_learning_rate * state.lr_scale)
    loop.window_start()
    window = loop.step.accumulate_window(loop.micro_batches(pacer), loop.config.gradient_accumulation_steps, generator=False)
    first_update = not loop.step.optimizer_d.state
    update_started = clock.now()
    result = loop.step.apply(window)
    pacer.timer.updates.add(clock.now() - update_started)
    loop.boundary = None
    state.discriminator_warmup_done += 1
    state.samples_seen += window.used * loop.config.batch_size
    if loop.window_epoch_ended:
        state.epoch += 1
    state.discriminator_warmup_s += clock.now() - started
    if not result.applied:
        loop.logger.warning(f"discriminator warm-up step {state.discriminator_warmup_done}: skipped ({result.reason})")
    else:
        show(loop, result.losses)
    return StepOutcome(result, loop.window_epoch_ended, last=False, first_update=first_update)


def show(loop, losses: dict[str, float]) -> None:
    state = loop.state
    line = (f"discriminator warm-up {state.discriminator_warmup_done}/{loop.config.discriminator_warmup_steps} | "
            f"disc {losses['discriminator']:.3f} margin {losses['margin']:.3f} | "
            f"deadline in {format_duration(loop.budget.left_s())}")
    if loop.run_log.display is not None and loop.dist.is_main:
        loop.run_log.display.step(loop.budget.clock.now(), line, f"disc {losses['discriminator']:.3f}", advance=False)


def checkpoint_if_due(loop, pacer: Pacer, epoch_ended: bool) -> None:
    """Every --checkpoint_every_minutes and at an epoch's end, as in training (joint: writing is a collective)."""
    since = loop.budget.clock.now() - loop.last_checkpoint_at
    if loop.dist.any(pacer.checkpoint_due(epoch_ended, since)):
        loop.checkpoint(end_of_epoch=epoch_ended)


def retake_last_good(loop) -> None:
    """The warmed-up discriminator becomes the state to go back to: a checkpoint (which also keeps it
    from a kill), or, where the run writes none or the write failed, a copy in RAM."""
    if loop.state.discriminator_warmup_done == 0:
        return
    path = loop.checkpoint(end_of_epoch=False) if loop.config.checkpoints else None
    if path is None:
        loop.last_good.retake(loop.model, loop.discriminator)


def report_end(loop, ended: str, seconds: float) -> None:
    state = loop.state
    first, last = state.discriminator_warmup_first, state.discriminator_warmup_last
    if not first or not last:
        return
    level = loop.logger.info if ended.startswith("separating") else loop.logger.warning
    level(f"discriminator warm-up ended by {ended}: {state.discriminator_warmup_done} steps in "
          f"{format_duration(seconds)}; loss {first['discriminator']:.3f} -> {last['discriminator']:.3f}, "
          f"real-minus-generated score margin {first['margin']:.3f} -> {last['margin']:.3f}")
    loop.run_log.event("discriminator_warmup", steps=state.discriminator_warmup_done, ended_by=ended,
                       first_loss=first["discriminator"], last_loss=last["discriminator"],
                       first_margin=first["margin"], last_margin=last["margin"])
