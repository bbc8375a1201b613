"""A new discriminator's warm-up: it trains alone before its gradients reach a pretrained generator.

MMS checkpoints carry no discriminator. A new one is random: its first gradients would pull a good voice
towards whatever a random network prefers. So before joint training it trains alone, on the generator's
output, until it tells real from generated: the generator runs without gradients and does not change,
and the discriminator learns at its own constant rate (--discriminator_warmup_lr, default 2e-4, the
original VITS rate: the joint schedule's small fine-tuning rate, ramping up from zero, would leave it
random). Its loss and its real-minus-generated score margin (near 0 while it cannot tell them apart) are
logged at the start and the end.

The warm-up is part of the run: it counts against the budget (at most --discriminator_warmup_share of
the time left when it starts; it is cut short there, and says so), it consumes data like training
steps (so a resumed run continues where it stopped), and the plan is made after it, from what is left.
"""

from __future__ import annotations

from .budget import StepTimer
from .pacing import Pacer
from .progress import format_duration


def warm_up(loop) -> None:
    """Run the discriminator-only steps still to do (none for a loaded or resumed-past-it discriminator)."""
    config, state, budget = loop.config, loop.state, loop.budget
    target = config.discriminator_warmup_steps
    if state.discriminator_warmup_done >= target:
        return
    timer = StepTimer(config.accumulation)
    pacer = Pacer(budget, timer, loop.costs, config.accumulation, config.checkpoint_every_s, 0, 0,
                  config.discriminator_warmup_lr, 1.0)
    allowed_s = config.discriminator_warmup_share * budget.left_s()
    started = budget.clock.now()
    first = last = None
    loop.step.set_learning_rates(0.0, config.discriminator_warmup_lr)
    loop.logger.info(f"discriminator warm-up: {target - state.discriminator_warmup_done} steps alone at learning rate "
                     f"{config.discriminator_warmup_lr:g}, at most {format_duration(allowed_s)}; the generator is untouched")
    while state.discriminator_warmup_done < target:
        loop.stop.check()
        spent = budget.clock.now() - started
        if not pacer.may_start_step() or (timer.ready and spent + timer.cautious_step_s > allowed_s):
            loop.logger.warning(f"discriminator warm-up cut short by the budget after {state.discriminator_warmup_done} "
                                f"of {target} steps")
            break
        losses = one_step(loop, pacer)
        first = first or losses
        last = losses or last
    if first and last:
        loop.logger.info(f"discriminator warm-up done: {state.discriminator_warmup_done} steps in "
                         f"{format_duration(budget.clock.now() - started)}; loss {first['discriminator']:.3f} -> "
                         f"{last['discriminator']:.3f}, real-minus-generated score margin {first['margin']:.3f} -> "
                         f"{last['margin']:.3f}")
        loop.metrics.write("discriminator_warmup", steps=state.discriminator_warmup_done,
                           first_loss=first["discriminator"], last_loss=last["discriminator"],
                           first_margin=first["margin"], last_margin=last["margin"])


def one_step(loop, pacer: Pacer) -> dict[str, float] | None:
    """One discriminator-only step; its losses, or None when it was dropped."""
    loop.window_start()
    window = loop.step.accumulate_window(loop.micro_batches(pacer), loop.config.accumulation, generator=False)
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
    if loop.display is not None:
        loop.display.step(loop.budget.clock.now(), line, f"disc {result.losses['discriminator']:.3f}")
    return result.losses
