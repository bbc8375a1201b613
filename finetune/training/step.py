"""One optimizer step of VITS training: the bookkeeping around the objective.

For each micro-batch of an accumulation window:
  1. generator forward (objective.generator_forward);
  2. discriminator loss on real audio and the *detached* generated audio, backward into the
     discriminator only;
  3. generator loss with the discriminator frozen (requires_grad off), backward into the generator only.
With --discriminator_every N the discriminator learns in every Nth step only: in the others step 2 is a
forward pass over the real audio alone, without gradients (the features step 3 matches), and its optimizer
does not step. With --duration_every N the duration predictor learns in every Nth step only: in the
others its loss is not computed (its flows' forward and backward are a seventh to a quarter of a step on a CPU,
bench/RESULTS.md), so its parameters get no gradient and AdamW leaves them and their moments as they are.
In a new discriminator's warm-up, the discriminator trains alone: step 1 is cut down to what it needs
(posterior encoder -> random segment -> decoder, no gradients: no text encoder, flow, alignment search
or duration loss) and step 3 is left out; the generator does not change.
TrainStep.optimizer_step is the whole step in one place, top to bottom: the micro-batches drawn one at a
time (finetune/training/window.py draws them, honouring a stop between them), the last one cut to the
clips that fit, forward and backward through the gradient scaler, the out-of-memory and non-finite
guards, unscale, clip, step. How many micro-batches it runs and where the last is cut were decided by
the loop before it started (finetune/training/pacing.py, next_window); an epoch's end ends it early, and
so does the deadline: asked before each micro-batch, and inside one that runs near it (finetune/training/
late.py: given up part-way, its gradients put back, when the machine slowed down under it).
Each clip weighs the same: a micro-batch's mean loss counts in proportion to its clips, and the gradients
are the mean over every clip the window used (so a micro-batch cut to 2 of 8 clips does not weigh each
of them 4 times). A CUDA out-of-memory error inside a window drops that window (counted, logged with the
batch shape and the flags that help) and training goes on.

Data-parallel (torchrun): every process accumulates its own window with no communication, then the
processes decide together (one collective): if any of them ran out of memory, or saw a non-finite loss,
every one drops the window; otherwise the gradients are averaged (one all-reduce per window, in buckets)
and every process takes the same update. An update that fails on one process is failed on all, so all go
back to the same last good state. (DistributedDataParallel reduces inside the backward instead: a process
that fails before its backward leaves the others waiting there, so its decisions cannot be shared.)

Then, once per window: if any loss was not finite the window is dropped (gradients zeroed, no optimizer
step, so nothing reaches the weights or the Adam moments); otherwise gradients are unscaled, clipped,
and both AdamW optimizers step (discriminator first). Both use the discriminator as it was during the
window, so all micro-batches of a window see the same one. Running out of GPU memory inside the update
itself may leave the weights partly updated: the result says so, and the loop goes back to the last
good state.

Freezing the discriminator in step 3 is what keeps its gradients clean: without it, the generator's
adversarial loss would add gradients to the discriminator that its own optimizer then applies (a known
bug in a public fine-tuning script).
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Protocol

import torch
from transformers import VitsModel

from finetune.data.examples import Batch
from finetune.data.features import Features
from finetune.system.profile import section
from finetune.training.distributed import Distributed
from finetune.training.late import MicroBatchLate, given_up_when_late
from finetune.training.pacing import WindowShape
from finetune.training.precision import Precision
from finetune.vits.discriminator import Discriminator
from finetune.vits.losses import LossWeights, discriminator_loss
from finetune.vits.objective import (
    GeneratorLosses,
    generated_segments,
    generator_forward,
    generator_losses,
    real_segments,
    slice_segments,
)

ADAM_BETAS = (0.8, 0.99)  # original VITS
# AdamW's fused kernel (one pass over every tensor) where torch has one: the same update as the per-tensor
# loops, faster: a step's optimizer updates 18.7 -> 9.5 ms for the tiny voice, 291.8 -> 127.1 ms at MMS size
# on a 2-core CPU (bench/bench_step.py, bench/RESULTS.md).
FUSED_ADAM_DEVICES = ("cpu", "cuda")


@contextlib.contextmanager
def frozen(module: torch.nn.Module):
    """Parameters of `module` take no gradient inside the block; restored afterwards."""
    params = [p for p in module.parameters() if p.requires_grad]
    for p in params:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in params:
            p.requires_grad_(True)


class Regulariser(Protocol):
    """A loss on the generator alone, added to the objective's in every micro-batch (a feedback round's text
    anchor: finetune/feedback/anchor.py). Reported as the loss term `name`."""

    name: str

    def loss(self, model) -> torch.Tensor: ...


class GeneratorObjective(torch.nn.Module):
    """The generator's training forward as one module: what profilers and FLOP counters attribute the
    generator's work to (bench/bench_gpu.py), and what data-parallel training could wrap."""

    def __init__(self, model: VitsModel, features: Features, segment_frames: int):
        super().__init__()
        self.model = model
        self.features = [features]  # not a submodule: its buffers are constants, not the generator's state
        self.segment_frames = segment_frames
        self.regulariser: Regulariser | None = None  # a loss beside the objective's (the recipe sets it)

    def forward(self, batch: Batch, duration: bool = True):
        return generator_forward(self.model, batch, self.features[0], self.segment_frames, duration)


@dataclass
class StepSettings:
    learning_rate: float = 2e-5
    discriminator_learning_rate: float = 2e-5
    max_grad_norm: float = 10.0  # clip each model's gradient norm to this (0: no clipping)
    segment_frames: int = 32  # 32 frames x 256 = 8192 samples, as in VITS
    weight_decay: float = 0.01  # AdamW's default
    adam_eps: float = 1e-9  # original VITS
    discriminator_loss_weight: float = 1.0  # the discriminator's loss is scaled by this before its backward
    discriminator_every: int = 1  # it learns in steps 1, 1+N, 1+2N...; in the others it only scores
    duration_every: int = 1  # the duration predictor learns in steps 1, 1+N, 1+2N...; in the others no duration loss
    anchor_weight: float = 0.0  # >0: the generator decays toward its starting weights (rate: this x lr), not zero


@dataclass
class StepResult:
    """What one optimizer step did: its window (what ran, how long each part took) and its update."""

    applied: bool  # False when the window was dropped
    losses: dict[str, float] = field(default_factory=dict)  # a mean over the clips used
    grad_norm_generator: float = float("nan")
    grad_norm_discriminator: float = float("nan")
    reason: str = ""  # why it was dropped
    update_failed: bool = False  # the optimizer update itself failed: the weights may be partly updated
    used: int = 0  # micro-batches run
    clips: int = 0  # clips in them (fewer than used x the micro-batch when one was cut or short)
    epoch_ended: bool = False  # its last micro-batch ended an epoch
    cut_to: int = 0  # its last micro-batch was cut to this many clips (0: not cut)
    oom: str = ""  # the window ran out of GPU memory on this (then nothing was applied)
    first_update: bool = False  # the optimizers had no state before it (their state is made at the first update)
    micro_batch_s: list[float] = field(
        default_factory=list
    )  # each whole micro-batch's seconds (data, forward, backward)
    update_s: float = 0.0  # seconds of the update (the finiteness check, averaging, clipping, the optimizers)
    cut_by_deadline: bool = False  # the window ended before its planned micro-batches: they no longer fitted
    given_up_s: float = 0.0  # seconds a micro-batch ran before it was given up at the deadline (0: none was)


@dataclass
class Skips:
    """Steps the optimizers did not take, by cause (kept in checkpoints, reported at the end)."""

    nonfinite: int = 0  # a loss or gradient was not finite
    overflow: int = 0  # fp16: a gradient scaler skipped its step and lowered its scale
    oom: int = 0  # out of GPU memory in the window or the update


class MicroBatchSource(Protocol):
    """Where a step draws its micro-batches (finetune/training/window.py): `draw(index)` gives micro-batch
    `index` (1-based) and whether it ended an epoch, having first honoured a stop request (None: the deadline
    ends the window before it); `now` times them."""

    def draw(self, index: int) -> tuple[Batch | None, bool]: ...

    def late_check(self) -> Callable[[], bool] | None:
        """For the micro-batch just drawn: what says when it can no longer end in time (then it is given up:
        finetune/training/late.py), or None where it is not watched."""
        ...

    def now(self) -> float: ...


class ListSource:
    """A list of micro-batches as a source (tests, benches): no epochs, no stops, the process's clock."""

    def __init__(self, batches: list[Batch]):
        self.batches = batches

    def draw(self, index: int) -> tuple[Batch, bool]:
        return self.batches[index - 1], False

    def late_check(self) -> None:
        return None

    def now(self) -> float:
        return time.perf_counter()


class TrainStep:
    """Owns the two optimizers and gradient scalers. One step: `optimizer_step` (or `run` for a list of
    micro-batches)."""

    def __init__(
        self,
        model: VitsModel,
        discriminator: Discriminator,
        features: Features,
        weights: LossWeights,
        settings: StepSettings,
        precision: Precision,
        device: torch.device,
        dist: Distributed = Distributed(),
    ):
        self.model, self.discriminator = model, discriminator
        self.generator_objective = GeneratorObjective(model, features, settings.segment_frames)
        self.weights, self.settings, self.precision, self.device, self.dist = weights, settings, precision, device, dist
        dist.broadcast_module(model)  # every process starts from the main one's weights
        dist.broadcast_module(discriminator)
        self.generator_params = [p for p in model.parameters() if p.requires_grad]
        # L2-SP: with an anchor the generator's weights decay toward where they started instead of toward zero
        self.start_weights = [p.detach().clone() for p in self.generator_params] if settings.anchor_weight > 0 else None
        self.optimizer_g = torch.optim.AdamW(
            self.generator_params,
            lr=settings.learning_rate,
            betas=ADAM_BETAS,
            eps=settings.adam_eps,
            weight_decay=0.0 if self.start_weights is not None else settings.weight_decay,
            fused=device.type in FUSED_ADAM_DEVICES,
        )
        self.optimizer_d = torch.optim.AdamW(
            discriminator.parameters(),
            lr=settings.discriminator_learning_rate,
            betas=ADAM_BETAS,
            eps=settings.adam_eps,
            weight_decay=settings.weight_decay,
            fused=device.type in FUSED_ADAM_DEVICES,
        )
        self.scaler_g = torch.amp.GradScaler(device.type, enabled=precision.uses_scaler)
        self.scaler_d = torch.amp.GradScaler(device.type, enabled=precision.uses_scaler)
        self.skips = Skips()

    @property
    def features(self) -> Features:
        """The spectrogram features the objective compares (held by the objective, not a second time here)."""
        return self.generator_objective.features[0]

    def autocast(self):
        if self.precision.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.precision.autocast_dtype)

    def scaler_figures(self) -> dict[str, float]:
        """The fp16 gradient scalers' scales and the steps they skipped (empty without fp16). A scale that
        keeps falling means gradients overflow fp16 again and again: the step is not learning."""
        if not self.precision.uses_scaler:
            return {}
        return {
            "loss_scale_generator": float(self.scaler_g.get_scale()),
            "loss_scale_discriminator": float(self.scaler_d.get_scale()),
            "fp16_overflow_skips": self.skips.overflow,
        }

    def set_learning_rates(self, generator_lr: float, discriminator_lr: float) -> None:
        for group in self.optimizer_g.param_groups:
            group["lr"] = generator_lr
        for group in self.optimizer_d.param_groups:
            group["lr"] = discriminator_lr

    def discriminator_learns(self, number: int) -> bool:
        """Whether the discriminator learns in optimizer step `number` (1-based): in steps 1, 1 + N, 1 + 2N, ...
        for --discriminator_every N, in every step by default."""
        return (number - 1) % self.settings.discriminator_every == 0

    def duration_learns(self, number: int) -> bool:
        """Whether the duration predictor learns in optimizer step `number` (1-based): in steps 1, 1 + N, ...
        for --duration_every N, in every step by default."""
        return (number - 1) % self.settings.duration_every == 0

    def accumulate(
        self, batch: Batch, scale: float, generator: bool = True, discriminator: bool = True, duration: bool = True
    ) -> dict[str, torch.Tensor]:
        """Forward and backward for one micro-batch; `scale` is 1 / micro-batches per step. With
        `generator` False only the discriminator learns (its warm-up): the generator runs without
        gradients and is left untouched. With `discriminator` False only the generator learns: the
        discriminator scores the real audio without gradients (the features the generator matches) and the
        generated audio for the generator's losses, and takes no gradient. With `duration` False the duration
        loss is not computed (no "duration" term; the duration predictor takes no gradient). The gradients stay
        this process's own until the update. Returns the loss terms as detached tensors (no sync)."""
        return self._accumulate(batch, scale, generator, discriminator, duration)

    def _accumulate(
        self, batch: Batch, scale: float, generator: bool, discriminator: bool, duration: bool
    ) -> dict[str, torch.Tensor]:
        if not generator:
            return self._accumulate_discriminator(batch, scale)
        with section("generator_forward"):
            out, real_audio, mel_real = self.forward(batch, duration)
        with section("discriminator"):
            if discriminator:
                d_loss, margin, real_features = self.discriminator_backward(real_audio, out.audio, True, scale)
            else:
                real_features = self.real_features(real_audio)
        with section("generator_backward"):
            g_losses = self.generator_backward(out, mel_real, real_features, scale)
        terms = {k: v.detach() for k, v in g_losses.terms().items()}
        regulariser = self.generator_objective.regulariser
        if regulariser is not None:
            with section("generator_backward"):
                extra = regulariser.loss(self.model)
                self.scaler_g.scale(extra * scale).backward()
            terms[regulariser.name] = extra.detach()
        if not discriminator:
            return terms
        return {**terms, "discriminator": d_loss.detach(), "margin": margin.detach()}

    def _accumulate_discriminator(self, batch: Batch, scale: float) -> dict[str, torch.Tensor]:
        """The warm-up's micro-batch: only the generated segments the discriminator sees (posterior
        encoder -> random segment -> decoder, no gradients), then its loss and backward."""
        with section("generator_forward"):
            generated, real_audio = self.forward_segments(batch)
        with section("discriminator"):
            d_loss, margin, _ = self.discriminator_backward(real_audio, generated, False, scale)
        return {"discriminator": d_loss.detach(), "margin": margin.detach()}

    def forward_segments(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """Generated and real audio segments [batch, 1, samples], for the discriminator alone (the generator
        takes no gradient here)."""
        with self.autocast():
            generated, starts = generated_segments(self.model, batch, self.features, self.settings.segment_frames)
        hop = self.features.config.hop_length
        real_audio = slice_segments(batch.audio.unsqueeze(1), starts * hop, self.settings.segment_frames * hop)
        return generated, real_audio

    def forward(self, batch: Batch, duration: bool = True):
        """Generator forward plus the matching real segments: (GeneratorForward, real audio, real log-mel);
        `duration` False: without the duration loss."""
        with self.autocast():
            out = self.generator_objective(batch, duration)
            real_audio, mel_real = real_segments(batch, self.features, out.segment_starts, self.settings.segment_frames)
        return out, real_audio, mel_real

    def discriminator_backward(
        self, real_audio: torch.Tensor, generated_audio: torch.Tensor, keep_real_features: bool, scale: float
    ) -> tuple[torch.Tensor, torch.Tensor, list[list[torch.Tensor]] | None]:
        """Discriminator loss on real and detached generated audio (one pass over both), backward into the
        discriminator. Returns the loss, the real-minus-generated score margin (mean over
        sub-discriminators: near 0 while it cannot tell them apart), and the real features (detached)
        when the generator needs them."""
        size = real_audio.shape[0]
        with self.autocast():
            scores, features = self.discriminator(torch.cat([real_audio, generated_audio.detach()]))
        real_scores, fake_scores = [s[:size].float() for s in scores], [s[size:].float() for s in scores]
        d_loss = discriminator_loss(real_scores, fake_scores)
        self.scaler_d.scale(d_loss * (scale * self.settings.discriminator_loss_weight)).backward()
        margin = torch.stack([r.mean() - f.mean() for r, f in zip(real_scores, fake_scores)]).mean()
        real_features = [[f[:size].detach() for f in fs] for fs in features] if keep_real_features else None
        return d_loss, margin, real_features

    @torch.no_grad()
    def real_features(self, real_audio: torch.Tensor) -> list[list[torch.Tensor]]:
        """The discriminator's features of the real audio, without gradients: what the generator's
        feature-matching loss compares with, in a step where the discriminator does not learn."""
        with self.autocast():
            _, features = self.discriminator(real_audio)
        return features

    def generator_backward(self, out, mel_real: torch.Tensor, real_features, scale: float) -> GeneratorLosses:
        """Generator loss with the discriminator frozen, backward into the generator only."""
        mel_generated = self.features.mel(out.audio.squeeze(1))
        with frozen(self.discriminator), self.autocast():
            fake_scores, fake_features = self.discriminator(out.audio)
        g_losses = generator_losses(
            out, mel_real, mel_generated, fake_scores, fake_features, real_features, self.weights
        )
        self.scaler_g.scale(g_losses.total * scale).backward()
        return g_losses

    def optimizer_step(
        self,
        source: MicroBatchSource,
        window: WindowShape,
        generator: bool = True,
        discriminator: bool = True,
        duration: bool = True,
    ) -> StepResult:
        """One optimizer step, top to bottom, over the window the loop decided before it started
        (finetune/training/pacing.py: how many micro-batches, the last cut to the clips that fit), at the
        learning rates already set. With `generator` False only the discriminator learns (its warm-up);
        with `discriminator` False only the generator (--discriminator_every); with `duration` False the
        duration predictor sits it out (--duration_every).

        Each clip weighs the same: a micro-batch's mean loss counts by its clips, and the gradients are the
        mean over every clip the window used (a micro-batch cut to 2 of 8 clips does not weigh each of them
        4 times). Out of GPU memory in the window: it is dropped (`oom` says on what; in a data-parallel run
        every process drops it, and one that ran out still draws its remaining micro-batches without
        computing them, so that every process's data position and collectives stay in step). Any other
        exception (a stop request, for one) clears the gradients before it propagates."""
        optimizer = self.optimizer_g if generator else self.optimizer_d
        result = StepResult(applied=False, first_update=not optimizer.state)
        whole = window.planned * window.clips if window.clips > 1 else 0  # 0: whole = the first micro-batch's size
        totals: dict[str, torch.Tensor] = {}
        longest = widest = 0
        # 1. The micro-batches: drawn one at a time, the last cut to the clips that fit, forward and backward
        #    each into .grad through the gradient scaler; the window ends early at an epoch's end.
        try:
            while result.used < window.micro_batches and not result.epoch_ended:
                started = source.now()
                batch, result.epoch_ended = source.draw(result.used + 1)
                if batch is None:  # the deadline, asked again at the speed the last micro-batch ran
                    result.cut_by_deadline = True
                    break
                result.used += 1
                if result.used == window.micro_batches and window.last_clips < min(len(batch), window.clips):
                    batch, result.cut_to = batch.first(window.last_clips), window.last_clips
                whole = whole or window.planned * len(batch)
                scale = len(batch) / whole  # its share of a whole window's clips
                result.clips += len(batch)
                longest, widest = max(longest, int(batch.frame_lengths.max())), max(widest, len(batch))
                if not result.oom:
                    try:
                        with given_up_when_late(source.late_check(), [self.model, self.discriminator]):
                            terms = self.accumulate(batch, scale, generator, discriminator, duration)
                    except MicroBatchLate:  # its gradients are back as the earlier micro-batches left them
                        result.used, result.clips, result.cut_to = result.used - 1, result.clips - len(batch), 0
                        result.cut_by_deadline, result.given_up_s = True, source.now() - started
                        break
                    except torch.OutOfMemoryError:  # torch.cuda.OutOfMemoryError is this type
                        self.zero_grad()
                        result.oom = "out of GPU memory"
                    else:
                        for name, value in terms.items():
                            totals[name] = totals.get(name, 0.0) + value * scale
                if not result.cut_to:  # a cut micro-batch is not what a whole one costs
                    result.micro_batch_s.append(source.now() - started)
        except BaseException:
            self.zero_grad()
            raise
        if result.oom:
            result.oom = f"{result.used} micro-batches of up to {widest} clips (longest {longest} frames)"
        if result.used == 0:  # its only micro-batch given up: nothing to apply
            self.zero_grad()
            result.reason = "its first micro-batch given up: the deadline came before it ended"
            return result
        started = source.now()
        with section("optimizer"):
            self.update(result, totals, whole, generator, discriminator)
        result.update_s = source.now() - started
        return result

    def update(
        self,
        result: StepResult,
        totals: dict[str, torch.Tensor],
        whole: int,
        generator: bool = True,
        discriminator: bool = True,
    ) -> None:
        """The update after a window whose gradients are in .grad (`totals`: its loss terms, weighed by clips;
        `whole`: a whole window's clips): dropped on out of memory (on any process) or a non-finite loss;
        else the gradients made a mean over the clips used and averaged over processes, unscaled, clipped,
        and the optimizers stepped (the discriminator first, each unless it sat out), then the anchor's
        pull. `result` says what happened."""
        # 2. Out of memory anywhere: every process drops the window.
        if self.dist.any(bool(result.oom)) and not result.oom:
            self.zero_grad()
            result.oom = "another process's share of this window"
        if result.oom:
            return self._out_of_memory(result)
        # 3. The mean over the clips used (the scales summed to clips / whole).
        factor = whole / result.clips if 0 < result.clips != whole else 1.0
        if factor != 1.0:
            for param in [*self.generator_params, *self.discriminator.parameters()]:
                if param.grad is not None:
                    param.grad.mul_(factor)
        values = (torch.stack(list(totals.values())) * factor).tolist()  # a sync point: finiteness decides
        result.losses = dict(zip(totals, values))
        # 4. The non-finite guard: one process's NaN is every process's (gradients are averaged).
        if self.dist.any(not all(map(math.isfinite, values))):
            return self._drop(result, "non-finite loss")
        self.dist.average_gradients([*self.discriminator.parameters(), *self.generator_params])
        # 5. Unscale, clip and step; out of GPU memory here may leave the weights partly updated.
        pairs = [(self.optimizer_d, self.scaler_d, list(self.discriminator.parameters()))] if discriminator else []
        if generator:
            pairs.append((self.optimizer_g, self.scaler_g, self.generator_params))
        failed, norms, nonfinite = "", [], False
        try:
            for optimizer, scaler, params in pairs:
                scaler.unscale_(optimizer)
                norms.append(torch.nn.utils.clip_grad_norm_(params, self.settings.max_grad_norm or float("inf")))
            # fp32 and bf16: a non-finite gradient drops the step (fp16's scaler skips its step by itself)
            nonfinite = not self.precision.uses_scaler and not all(bool(torch.isfinite(n)) for n in norms)
            if not nonfinite:
                scales_before = [scaler.get_scale() for _, scaler, _ in pairs] if self.precision.uses_scaler else []
                for optimizer, scaler, _ in pairs:
                    scaler.step(optimizer)  # fp16: skipped (and the scale lowered) when its gradients overflowed
                    scaler.update()
                if any(scaler.get_scale() < before for (_, scaler, _), before in zip(pairs, scales_before)):
                    self.skips.overflow += 1
                if generator:
                    self._pull_toward_start()
        except torch.OutOfMemoryError:  # torch.cuda.OutOfMemoryError is this type
            failed = "CUDA out of memory inside the optimizer update (the weights may be partly updated)"
        if self.dist.any(bool(failed)):  # one process's torn update is every process's: all go back together
            return self._update_failed(
                result,
                failed
                or "CUDA out of memory inside another process's optimizer update (the processes' weights may differ)",
            )
        if nonfinite:
            return self._drop(result, "non-finite gradient")
        self.zero_grad()
        result.applied = True
        result.grad_norm_discriminator = float(norms[0]) if discriminator else float("nan")
        result.grad_norm_generator = float(norms[-1]) if generator else float("nan")

    def run(
        self, micro_batches: list[Batch], generator: bool = True, discriminator: bool = True, duration: bool = True
    ) -> StepResult:
        """One optimizer step over a list of micro-batches (gradient accumulation), none cut."""
        count = len(micro_batches)
        return self.optimizer_step(
            ListSource(micro_batches), WindowShape(count, count, 1, 1), generator, discriminator, duration
        )

    def zero_grad(self) -> None:
        self.optimizer_g.zero_grad(set_to_none=True)
        self.optimizer_d.zero_grad(set_to_none=True)

    def _update_failed(self, result: StepResult, reason: str) -> None:
        """After an update that failed half way (on this process or another): gradients dropped, cache freed,
        and the gradient scalers made afresh at the scale they had: a scaler whose unscale_ ran but whose
        update() never came would refuse the next step ("unscale_() has already been called")."""
        self.zero_grad()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        self.scaler_g, self.scaler_d = (
            fresh_scaler(self.scaler_g, self.device),
            fresh_scaler(self.scaler_d, self.device),
        )
        self.skips.oom += 1
        result.update_failed, result.reason = True, reason

    def _out_of_memory(self, result: StepResult) -> None:
        """A window too big for the GPU: dropped (no partial update), the cache freed, and said which."""
        self.zero_grad()
        self.skips.oom += 1
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        result.reason = (
            f"CUDA out of memory on {result.oom}: skipped; lower --batch_size (and raise "
            "--gradient_accumulation_steps) or prepare with a lower --max_seconds"
        )

    def _drop(self, result: StepResult, reason: str) -> None:
        self.zero_grad()
        self.skips.nonfinite += 1
        result.reason = reason

    @torch.no_grad()
    def _pull_toward_start(self) -> None:
        """Each trained generator weight moves the fraction anchor_weight x lr of the way back to its start:
        a weight the data keeps pushing settles about 1/anchor_weight from it (AdamW's steps are about lr),
        one pushed this way and that by noise stays near it."""
        if self.start_weights is None:
            return
        rate = min(1.0, self.optimizer_g.param_groups[0]["lr"] * self.settings.anchor_weight)
        for weight, start in zip(self.generator_params, self.start_weights):
            weight.lerp_(start, rate)

    def state_dict(self) -> dict:
        return {
            "optimizer_g": self.optimizer_g.state_dict(),
            "optimizer_d": self.optimizer_d.state_dict(),
            "scaler_g": self.scaler_g.state_dict(),
            "scaler_d": self.scaler_d.state_dict(),
            "nonfinite_skips": self.skips.nonfinite,
            "overflow_skips": self.skips.overflow,
            "oom_skips": self.skips.oom,
            **({"start_weights": self.start_weights} if self.start_weights is not None else {}),
        }

    def load_state_dict(self, state: dict) -> None:
        self.load_optimizers(state)
        if self.start_weights is not None and state.get("start_weights") is not None:  # a resumed run's anchor
            self.start_weights = [saved.to(self.device) for saved in state["start_weights"]]
        self.skips = Skips(state.get("nonfinite_skips", 0), state.get("overflow_skips", 0), state.get("oom_skips", 0))

    def load_optimizers(self, state: dict) -> None:
        """Both optimizers and gradient scalers from a saved state (the skip counters stay as they are). The
        states held now are freed first: loading beside them would need twice their memory, on a card that
        may just have run out of it."""
        self.reset_optimizers()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        self.optimizer_g.load_state_dict(state["optimizer_g"])
        self.optimizer_d.load_state_dict(state["optimizer_d"])
        for scaler, saved in ((self.scaler_g, state["scaler_g"]), (self.scaler_d, state["scaler_d"])):
            if saved and scaler.is_enabled():  # empty when the checkpoint ran without fp16: start a fresh scale
                scaler.load_state_dict(saved)

    def reset_optimizers(self) -> None:
        """Empty optimizer states (as at the start of a fresh run), learning rates kept."""
        for optimizer in (self.optimizer_g, self.optimizer_d):
            optimizer.state.clear()


def fresh_scaler(scaler: torch.amp.GradScaler, device: torch.device) -> torch.amp.GradScaler:
    """A new gradient scaler with `scaler`'s scale and growth state, and no per-optimizer stage."""
    fresh = torch.amp.GradScaler(device.type, enabled=scaler.is_enabled())
    if scaler.is_enabled():
        fresh.load_state_dict(scaler.state_dict())
    return fresh
