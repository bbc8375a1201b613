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
the time left when it starts; it is cut short there, and says so), it consumes data like training
steps (so a resumed run continues where it stopped), and the plan is made after it, from what is left.
"""

from __future__ import annotations

from collections import deque

from finetune.training.budget import StepTimer
from finetune.system.interrupt import StopRequested
from finetune.training.pacing import Pacer
from finetune.system.progress import format_duration

MARGIN_WINDOW = 20  # steps the margin is averaged over before the warm-up may end


def warm_up(loop) -> None:
    """Run the discriminator alone until it separates real from generated speech (its score margin, over
    the last MARGIN_WINDOW steps, reaches --discriminator_warmup_margin), for at most
    --discriminator_warmup_steps steps and --discriminator_warmup_share of the time left. Nothing to do
    for a loaded discriminator, or one a resumed run already warmed up."""
    config, state, budget = loop.config, loop.state, loop.budget
    limit = config.discriminator_warmup_steps
    if state.discriminator_warmup_finished or state.discriminator_warmup_done >= limit:
        return
    timer = StepTimer(config.gradient_accumulation_steps)
    pacer = Pacer(budget, timer, loop.costs, config.gradient_accumulation_steps, config.checkpoint_every_s, 0, 0,
                  config.discriminator_warmup_learning_rate, 1.0)
    allowed_s = config.discriminator_warmup_share * budget.left_s()
    started = budget.clock.now()
    first = last = None
    margins: deque[float] = deque(maxlen=MARGIN_WINDOW)
    loop.step.set_learning_rates(0.0, config.discriminator_warmup_learning_rate)
    loop.logger.info(f"discriminator warm-up: alone at learning rate {config.discriminator_warmup_learning_rate:g} until its "
                     f"real-minus-generated margin reaches {config.discriminator_warmup_margin:g}, at most "
                     f"{limit - state.discriminator_warmup_done} steps and {format_duration(allowed_s)}; "
                     "the generator is untouched")
    ended = f"the step limit (--discriminator_warmup_steps {limit})"
    while state.discriminator_warmup_done < limit:
        spent = budget.clock.now() - started
        stop, no_room = loop.dist.any_of(loop.stop.requested, not pacer.may_start_step()
                                         or (timer.ready and spent + timer.cautious_step_s > allowed_s))
        if stop:
            raise StopRequested(loop.stop.signal_name or "SIGTERM")
        if no_room:
            ended = "the budget (it may take at most --discriminator_warmup_share of the time left)"
            break
        losses = one_step(loop, pacer)
        first, last = first or losses, losses or last
        if losses:
            margins.append(losses["margin"])
        if len(margins) == MARGIN_WINDOW and sum(margins) / MARGIN_WINDOW >= config.discriminator_warmup_margin:
            ended = "separating real from generated"
            break
    state.discriminator_warmup_finished = True
    if first and last:
        level = loop.logger.info if ended.startswith("separating") else loop.logger.warning
        level(f"discriminator warm-up ended by {ended}: {state.discriminator_warmup_done} steps in "
              f"{format_duration(budget.clock.now() - started)}; loss {first['discriminator']:.3f} -> "
              f"{last['discriminator']:.3f}, real-minus-generated score margin {first['margin']:.3f} -> "
              f"{last['margin']:.3f}")
        loop.run_log.event("discriminator_warmup", steps=state.discriminator_warmup_done, ended_by=ended,
                           first_loss=first["discriminator"], last_loss=last["discriminator"],
                           first_margin=first["margin"], last_margin=last["margin"])


def one_step(loop, pacer: Pacer) -> dict[str, float] | None:
    """One discriminator-only step; its losses, or None when it was dropped."""
    loop.window_start()
    window = loop.step.accumulate_window(loop.micro_batches(pacer), loop.config.gradient_accumulation_steps, generator=False)
    update_started = loop.budget.clock.now()
    result = loop.step.apply(window)
    pacer.timer.updates.add(loop.budget.clock.now() - update_started)
    loop.boundary = None
    loop.state.discriminator_warmup_done += 1
    loop.state.samples_seen += window.used * loop.config.batch_size
    if loop.window_epoch_ended:
        loop.state.epoch += 1
    if not result.applied:
        loop.logger.warning(f"discriminator warm-up step {loop.state.discriminator_warmup_done}: skipped ({result.reason})")
        return None
    line = (f"discriminator warm-up {loop.state.discriminator_warmup_done}/{loop.config.discriminator_warmup_steps} | "
            f"disc {result.losses['discriminator']:.3f} margin {result.losses['margin']:.3f} | "
            f"deadline in {format_duration(loop.budget.left_s())}")
    if loop.run_log.display is not None and loop.dist.is_main:
        loop.run_log.display.step(loop.budget.clock.now(), line, f"disc {result.losses['discriminator']:.3f}",
                                  advance=False)
    return result.losses
