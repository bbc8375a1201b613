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

from finetune.system.progress import format_duration
from finetune.training.budget import StepTimer
from finetune.training.context import Run
from finetune.training.pacing import Costs, Pacer
from finetune.training.run_settings import WarmupSettings
from finetune.training.state import WarmupProgress
from finetune.training.step import StepResult

MARGIN_WINDOW = 20  # steps the margin is averaged over before the warm-up may end
BUDGET_END = "the budget (it may take at most --discriminator_warmup_share of the time left)"


class DiscriminatorWarmup:
    """What the warm-up decides and reports; the training loop runs its steps (finetune/training/loop.py)."""

    def __init__(self, settings: WarmupSettings, progress: WarmupProgress, context: Run):
        self.settings, self.progress, self.context = settings, progress, context
        self.margins: deque[float] = deque(progress.margins, maxlen=MARGIN_WINDOW)
        self.started_s = progress.seconds

    def needed(self) -> bool:
        """Nothing to do for a loaded discriminator, or one a resumed run already warmed up."""
        return not self.progress.finished and self.progress.done < self.settings.steps

    def start(self, costs: Costs, accumulation: int, checkpoint_every_s: float, checkpoint_min_s: float = 0.0) -> Pacer:
        """Its time cap (fixed at its first start: a resumed warm-up keeps it), its start line, and the
        pacer of its steps (a timer of its own: its steps cost less than training's)."""
        progress, settings = self.progress, self.settings
        if progress.allowed_s <= 0:
            progress.allowed_s = settings.share * self.context.budget.left_s()
        left_s = progress.allowed_s - progress.seconds
        self.context.run_log.logger.info(
            f"discriminator warm-up: alone at learning rate {settings.learning_rate:g} until its real-minus-generated "
            f"margin reaches {settings.margin:g}, at most {settings.steps - progress.done} steps and "
            f"{format_duration(max(0.0, left_s))}; the generator is untouched"
            + (f" (resumed at step {progress.done})" if progress.done else "")
        )
        return Pacer(
            self.context.budget, StepTimer(accumulation), costs, checkpoint_every_s, checkpoint_min_s=checkpoint_min_s
        )

    def out_of_room(self, pacer: Pacer) -> bool:
        """Whether the next step would not fit: the run's deadline, or the warm-up's own time cap."""
        left_s = self.progress.allowed_s - self.progress.seconds
        return not pacer.may_start_step() or (pacer.timer.ready and pacer.timer.cautious_step_s > left_s)

    def record(self, result: StepResult, seconds: float) -> str:
        """A step done: counted, its losses kept and shown. Returns why the warm-up ends now ("" when not:
        it ends once the margin, averaged over the last MARGIN_WINDOW steps, reaches its target)."""
        progress, losses = self.progress, result.losses
        progress.done += 1
        progress.seconds += seconds
        if not result.applied:
            self.context.run_log.logger.warning(
                f"discriminator warm-up step {progress.done}: skipped ({result.reason})"
            )
            return ""
        self.margins.append(losses["margin"])
        progress.margins = list(self.margins)
        progress.first = progress.first or dict(losses)
        progress.last = dict(losses)
        self.show(losses)
        full = len(self.margins) == MARGIN_WINDOW
        return (
            "separating real from generated"
            if full and sum(self.margins) / MARGIN_WINDOW >= self.settings.margin
            else ""
        )

    def show(self, losses: dict[str, float]) -> None:
        context = self.context
        line = (
            f"discriminator warm-up {self.progress.done}/{self.settings.steps} | disc {losses['discriminator']:.3f} "
            f"margin {losses['margin']:.3f} | deadline in {format_duration(context.budget.left_s())}"
        )
        display = context.run_log.display
        if display is not None and context.dist.is_main:
            display.step(context.now(), line, f"disc {losses['discriminator']:.3f}", advance=False)

    def end(self, ended: str) -> None:
        """The closing line and event: what ended it, its steps and time, first and last loss and margin."""
        progress, context = self.progress, self.context
        progress.finished = True
        first, last = progress.first, progress.last
        if not first or not last:
            return
        level = context.run_log.logger.info if ended.startswith("separating") else context.run_log.logger.warning
        level(
            f"discriminator warm-up ended by {ended}: {progress.done} steps in "
            f"{format_duration(progress.seconds - self.started_s)}; loss {first['discriminator']:.3f} -> "
            f"{last['discriminator']:.3f}, real-minus-generated score margin {first['margin']:.3f} -> {last['margin']:.3f}"
        )
        context.run_log.event(
            "discriminator_warmup",
            steps=progress.done,
            epochs=round(progress.epochs, 3),
            ended_by=ended,
            first_loss=first["discriminator"],
            last_loss=last["discriminator"],
            first_margin=first["margin"],
            last_margin=last["margin"],
        )
