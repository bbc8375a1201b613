"""One optimizer step of VITS training: the bookkeeping around the objective.

For each micro-batch of an accumulation window:
  1. generator forward (objective.generator_forward);
  2. discriminator loss on real audio and the *detached* generated audio, backward into the
     discriminator only;
  3. generator loss with the discriminator frozen (requires_grad off), backward into the generator only.
A CUDA out-of-memory error inside a window drops that window the same way (counted, logged with the
batch shape and the flags that help) and training goes on.

Then, once per window: if any loss was not finite the window is dropped (gradients zeroed, no optimizer
step, so nothing reaches the weights or the Adam moments); otherwise gradients are unscaled, clipped,
and both AdamW optimizers step (discriminator first). Both use the discriminator as it was during the
window, so all micro-batches of a window see the same one.

Freezing the discriminator in step 3 is what keeps its gradients clean: without it, the generator's
adversarial loss would add gradients to the discriminator that its own optimizer then applies (a known
bug in a public fine-tuning script).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch
from transformers import VitsModel

from .data import Batch
from .discriminator import Discriminator
from .features import Features
from .losses import LossWeights, discriminator_loss
from .objective import GeneratorLosses, generator_forward, generator_losses, real_segments

ADAM_BETAS = (0.8, 0.99)  # original VITS
ADAM_EPS = 1e-9


@dataclass(frozen=True)
class Precision:
    name: str  # "fp32", "fp16" or "bf16"
    autocast_dtype: torch.dtype | None  # None: no autocast

    @property
    def uses_scaler(self) -> bool:
        return self.autocast_dtype == torch.float16


def resolve_precision(device: torch.device, fp16: bool | None, bf16: bool) -> Precision:
    """fp16 is the default on CUDA; CPU runs fp32. Asking for fp16/bf16 without CUDA is an error."""
    if device.type != "cuda":
        if fp16 or bf16:
            raise ValueError("--fp16/--bf16 need a CUDA device; on the CPU training runs in fp32")
        return Precision("fp32", None)
    if bf16:
        return Precision("bf16", torch.bfloat16)
    if fp16 is False:
        return Precision("fp32", None)
    return Precision("fp16", torch.float16)


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


@dataclass
class StepSettings:
    learning_rate: float = 2e-5
    discriminator_learning_rate: float = 2e-5
    max_grad_norm: float = 10.0  # clip each model's gradient norm to this (0: no clipping)
    segment_frames: int = 32  # 32 frames x 256 = 8192 samples, as in VITS
    weight_decay: float = 0.01  # AdamW's default


@dataclass
class StepResult:
    applied: bool  # False when the window was dropped
    losses: dict[str, float] = field(default_factory=dict)  # averaged over micro-batches
    grad_norm_generator: float = float("nan")
    grad_norm_discriminator: float = float("nan")
    reason: str = ""  # why it was dropped


class TrainStep:
    """Owns the two optimizers and gradient scalers; `run(micro_batches, adversarial)` is one step."""

    def __init__(self, model: VitsModel, discriminator: Discriminator, features: Features, weights: LossWeights,
                 settings: StepSettings, precision: Precision, device: torch.device):
        self.model, self.discriminator, self.features = model, discriminator, features
        self.weights, self.settings, self.precision, self.device = weights, settings, precision, device
        self.generator_params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer_g = torch.optim.AdamW(self.generator_params, lr=settings.learning_rate, betas=ADAM_BETAS,
                                             eps=ADAM_EPS, weight_decay=settings.weight_decay)
        self.optimizer_d = torch.optim.AdamW(discriminator.parameters(), lr=settings.discriminator_learning_rate,
                                             betas=ADAM_BETAS, eps=ADAM_EPS, weight_decay=settings.weight_decay)
        scaler_on = precision.uses_scaler
        self.scaler_g = torch.amp.GradScaler(device.type, enabled=scaler_on)
        self.scaler_d = torch.amp.GradScaler(device.type, enabled=scaler_on)
        self.nonfinite_skips = 0
        self.overflow_skips = 0
        self.oom_skips = 0

    def autocast(self):
        if self.precision.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.precision.autocast_dtype)

    def set_learning_rates(self, generator_lr: float, discriminator_lr: float) -> None:
        for group in self.optimizer_g.param_groups:
            group["lr"] = generator_lr
        for group in self.optimizer_d.param_groups:
            group["lr"] = discriminator_lr

    def accumulate(self, batch: Batch, adversarial: bool, scale: float) -> dict[str, torch.Tensor]:
        """Forward and backward for one micro-batch; `scale` is 1 / micro-batches per step.
        Returns the loss terms as detached tensors (no sync)."""
        out, real_audio, mel_real = self.forward(batch)
        d_loss, real_features = self.discriminator_backward(real_audio, out.audio, adversarial, scale)
        g_losses = self.generator_backward(out, mel_real, real_features, adversarial, scale)
        terms = {k: v.detach() for k, v in g_losses.terms().items()}
        terms["discriminator"] = d_loss.detach()
        return terms

    def forward(self, batch: Batch):
        """Generator forward plus the matching real segments: (GeneratorForward, real audio, real log-mel)."""
        with self.autocast():
            out = generator_forward(self.model, batch, self.features, self.settings.segment_frames)
            real_audio, mel_real = real_segments(batch, self.features, out.segment_starts, self.settings.segment_frames)
        return out, real_audio, mel_real

    def discriminator_backward(self, real_audio: torch.Tensor, generated_audio: torch.Tensor, adversarial: bool,
                               scale: float) -> tuple[torch.Tensor, list[list[torch.Tensor]] | None]:
        """Discriminator loss on real and detached generated audio (one pass over both), backward into the
        discriminator. Returns the loss and, when the generator needs them, the real features (detached)."""
        size = real_audio.shape[0]
        with self.autocast():
            scores, features = self.discriminator(torch.cat([real_audio, generated_audio.detach()]))
        d_loss = discriminator_loss([s[:size] for s in scores], [s[size:] for s in scores])
        self.scaler_d.scale(d_loss * scale).backward()
        real_features = [[f[:size].detach() for f in fs] for fs in features] if adversarial else None
        return d_loss, real_features

    def generator_backward(self, out, mel_real: torch.Tensor, real_features, adversarial: bool,
                           scale: float) -> GeneratorLosses:
        """Generator loss with the discriminator frozen, backward into the generator only."""
        mel_generated = self.features.mel(out.audio.squeeze(1))
        fake_scores = fake_features = None
        if adversarial:
            with frozen(self.discriminator), self.autocast():
                fake_scores, fake_features = self.discriminator(out.audio)
        g_losses = generator_losses(out, mel_real, mel_generated, fake_scores, fake_features, real_features, self.weights)
        self.scaler_g.scale(g_losses.total * scale).backward()
        return g_losses

    def run(self, micro_batches: list[Batch], adversarial: bool) -> StepResult:
        """One optimizer step over `micro_batches` (gradient accumulation)."""
        scale = 1.0 / len(micro_batches)
        totals: dict[str, torch.Tensor] = {}
        try:
            for batch in micro_batches:
                for name, value in self.accumulate(batch, adversarial, scale).items():
                    totals[name] = totals.get(name, 0.0) + value * scale
        except torch.cuda.OutOfMemoryError:
            return self._out_of_memory(micro_batches)
        return self.apply(totals)

    def _out_of_memory(self, micro_batches: list[Batch]) -> StepResult:
        """A window too big for the GPU: drop it (no partial update), free the cache, and say which."""
        self.optimizer_g.zero_grad(set_to_none=True)
        self.optimizer_d.zero_grad(set_to_none=True)
        self.oom_skips += 1
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        longest = max(int(b.frame_lengths.max()) for b in micro_batches)
        reason = (f"CUDA out of memory on {len(micro_batches)} micro-batches of up to {max(len(b) for b in micro_batches)} "
                  f"clips (longest {longest} frames): skipped; lower --batch_size (and raise "
                  f"--gradient_accumulation_steps) or prepare with a lower --max_seconds")
        return StepResult(applied=False, reason=reason)

    def apply(self, totals: dict[str, torch.Tensor]) -> StepResult:
        """End of an accumulation window: drop it if any loss is not finite, else clip and step."""
        values = torch.stack(list(totals.values())).tolist()  # a sync point: finiteness decides the step
        losses = dict(zip(totals, values))
        if not all(map(torch.isfinite, torch.tensor(values))):
            return self._drop(losses, "non-finite loss")
        return self._step_optimizers(losses)

    def _drop(self, losses: dict[str, float], reason: str) -> StepResult:
        self.optimizer_g.zero_grad(set_to_none=True)
        self.optimizer_d.zero_grad(set_to_none=True)
        self.nonfinite_skips += 1
        return StepResult(applied=False, losses=losses, reason=reason)

    def _clip(self, optimizer, scaler, params) -> torch.Tensor:
        scaler.unscale_(optimizer)
        max_norm = self.settings.max_grad_norm or float("inf")
        return torch.nn.utils.clip_grad_norm_(params, max_norm)

    def _step_optimizers(self, losses: dict[str, float]) -> StepResult:
        norm_d = self._clip(self.optimizer_d, self.scaler_d, list(self.discriminator.parameters()))
        norm_g = self._clip(self.optimizer_g, self.scaler_g, self.generator_params)
        if not self.precision.uses_scaler and not bool(torch.isfinite(norm_d) & torch.isfinite(norm_g)):
            return self._drop(losses, "non-finite gradient")
        scale_before = self.scaler_g.get_scale() if self.precision.uses_scaler else None
        self.scaler_d.step(self.optimizer_d)
        self.scaler_g.step(self.optimizer_g)
        self.scaler_d.update()
        self.scaler_g.update()
        if scale_before is not None and self.scaler_g.get_scale() < scale_before:
            self.overflow_skips += 1  # fp16 overflow: the scaler skipped the step and lowered its scale
        self.optimizer_d.zero_grad(set_to_none=True)
        self.optimizer_g.zero_grad(set_to_none=True)
        return StepResult(applied=True, losses=losses, grad_norm_generator=float(norm_g),
                          grad_norm_discriminator=float(norm_d))

    def state_dict(self) -> dict:
        return {"optimizer_g": self.optimizer_g.state_dict(), "optimizer_d": self.optimizer_d.state_dict(),
                "scaler_g": self.scaler_g.state_dict(), "scaler_d": self.scaler_d.state_dict(),
                "nonfinite_skips": self.nonfinite_skips, "overflow_skips": self.overflow_skips,
                "oom_skips": self.oom_skips}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer_g.load_state_dict(state["optimizer_g"])
        self.optimizer_d.load_state_dict(state["optimizer_d"])
        for scaler, saved in ((self.scaler_g, state["scaler_g"]), (self.scaler_d, state["scaler_d"])):
            if saved and scaler.is_enabled():  # empty when the checkpoint ran without fp16: start a fresh scale
                scaler.load_state_dict(saved)
        self.nonfinite_skips = state.get("nonfinite_skips", 0)
        self.overflow_skips = state.get("overflow_skips", 0)
        self.oom_skips = state.get("oom_skips", 0)
