"""The VITS training objective on transformers' VITS modules (which refuse to train by themselves).

    text encoder -> prior mean / log std per token               m_p, logs_p  [batch, flow, tokens]
    posterior encoder on the linear spectrogram -> z             z            [batch, flow, frames]
    flow(z) -> z_p; alignment search between z_p and the prior   path         [batch, frames, tokens]
    durations = frames per token -> duration loss (stochastic or deterministic predictor)
    prior expanded to frames by the path -> KL(q(z) || p(z | text))
    a random segment of z (8192 samples) decoded -> audio, compared with the real segment (mel L1)
    with several speakers, the speaker's embedding conditions the posterior encoder, flow, stochastic
    duration predictor and decoder (finetune/vits/speaker_layers.py)
    discriminator on real and generated segments -> adversarial and feature-matching losses

Under fp16/bf16 autocast the encoders, decoder and discriminator run in low precision; the flow, the
duration predictor (whose spline flows are fragile), alignment, features and losses run in fp32
(finetune/vits/fp32_islands.py says why each).
Note: transformers names the prior's log standard deviation `prior_log_variances`; it is used as a
log std (`exp` of it scales the noise), and so it is here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import VitsModel

from finetune.data.examples import Batch
from finetune.data.features import Features
from finetune.system.profile import section
from finetune.vits import losses
from finetune.vits.alignment import maximum_path, prior_log_likelihood
from finetune.vits.duration import stochastic_duration_nll
from finetune.vits.fp32_islands import fp32
from finetune.vits.speaker_layers import conditioning, duration_conditioning


def sequence_mask(lengths: torch.Tensor, max_length: int) -> torch.Tensor:
    """[batch] lengths -> [batch, max_length] float mask (1 inside each length)."""
    positions = torch.arange(max_length, device=lengths.device)
    return (positions.unsqueeze(0) < lengths.unsqueeze(1)).float()


@dataclass
class TextEncoding:
    hidden: torch.Tensor  # [batch, hidden, tokens]
    m_p: torch.Tensor  # [batch, flow, tokens] prior mean
    logs_p: torch.Tensor  # [batch, flow, tokens] prior log std
    mask: torch.Tensor  # [batch, 1, tokens]


def encode_text(model: VitsModel, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> TextEncoding:
    mask = attention_mask.unsqueeze(-1).float()  # [batch, tokens, 1], the layout transformers expects
    out = model.text_encoder(input_ids=input_ids, padding_mask=mask, attention_mask=attention_mask)
    return TextEncoding(
        hidden=out.last_hidden_state.transpose(1, 2),
        m_p=out.prior_means.transpose(1, 2),
        logs_p=out.prior_log_variances.transpose(1, 2),
        mask=mask.transpose(1, 2),
    )


def duration_loss(
    model: VitsModel, text: TextEncoding, durations: torch.Tensor, speaker: torch.Tensor | None = None
) -> torch.Tensor:
    """durations: [batch, 1, tokens] frames per token from the alignment. Runs in fp32. The stochastic
    predictor trains in the original VITS flow order (finetune/vits/duration.py says why); `speaker`
    is its conditioning g (finetune/vits/speaker_layers.py), if any."""
    with fp32(durations.device):
        hidden, mask = text.hidden.float(), text.mask.float()
        if model.config.use_stochastic_duration_prediction:
            g = speaker.float() if speaker is not None else None
            nll = stochastic_duration_nll(model.duration_predictor, hidden, mask, durations.float(), g)  # [batch]
            return torch.sum(nll) / torch.sum(mask)
        log_duration = model.duration_predictor(hidden, mask)  # [batch, 1, tokens]
        return losses.deterministic_duration_loss(log_duration, durations, mask)


def pick_segment_starts(frame_lengths: torch.Tensor, segment_frames: int) -> torch.Tensor:
    """A random first frame per clip such that the segment fits (0 for clips shorter than a segment)."""
    room = torch.clamp(frame_lengths - segment_frames + 1, min=1)
    return (torch.rand(frame_lengths.shape, device=frame_lengths.device) * room).long()


def slice_segments(x: torch.Tensor, starts: torch.Tensor, size: int) -> torch.Tensor:
    """x [batch, channels, length] -> [batch, channels, size] from each clip's start (zero past the end).
    Starts lie within the length (pick_segment_starts), so `size` zeros more always suffice: padding by what
    the largest start needs would read it on the host, a wait for the GPU."""
    x = torch.nn.functional.pad(x, (0, size))
    index = starts.unsqueeze(1) + torch.arange(size, device=x.device).unsqueeze(0)  # [batch, size]
    return torch.gather(x, 2, index.unsqueeze(1).expand(-1, x.shape[1], -1))


@dataclass
class GeneratorForward:
    audio: torch.Tensor  # [batch, 1, segment_samples] generated segment
    segment_starts: torch.Tensor  # [batch] first frame of each segment
    z_p: torch.Tensor  # [batch, flow, frames] posterior sample through the flow
    logs_q: torch.Tensor  # [batch, flow, frames] posterior log std
    m_p: torch.Tensor  # [batch, flow, frames] prior mean, expanded by the alignment
    logs_p: torch.Tensor  # [batch, flow, frames] prior log std, expanded
    frame_mask: torch.Tensor  # [batch, 1, frames]
    duration_loss: torch.Tensor | None  # scalar; None in a step the duration predictor sits out
    durations: torch.Tensor  # [batch, 1, tokens] frames per token from the alignment
    # [batch, 1, frames] how much each frame counts in the KL: the batch's token weights through the alignment
    # (None: every valid frame alike)
    kl_weights: torch.Tensor | None = None


def generator_forward(
    model: VitsModel, batch: Batch, features: Features, segment_frames: int, duration: bool = True
) -> GeneratorForward:
    """Everything the generator computes for one batch (already on the device); `duration` False leaves the
    duration loss out (--duration_every: the predictor's flows, forward and backward, not paid)."""
    if not batch.audio.is_floating_point():
        raise ValueError("batch audio is still int16: move batches with batch.to(device), which scales it to [-1, 1]")
    device = batch.input_ids.device
    g = conditioning(model, batch.speaker_ids)  # [batch, embedding, 1], None for one speaker
    text = encode_text(model, batch.input_ids, batch.attention_mask)
    linear = batch.linear if batch.linear is not None else features.linear(batch.audio)
    frame_mask = sequence_mask(batch.frame_lengths, linear.shape[-1]).unsqueeze(1)  # [batch, 1, frames]
    z, _, logs_q = model.posterior_encoder(linear, frame_mask, g)
    with fp32(device):
        z_p = model.flow(z.float(), frame_mask, g.float() if g is not None else None)
        with torch.no_grad(), section("alignment"):  # the alignment is a target, not a path for gradients
            log_likelihood = prior_log_likelihood(z_p, text.m_p, text.logs_p)  # [batch, frames, tokens]
            path = maximum_path(log_likelihood, batch.frame_lengths, batch.text_lengths)
        durations = path.sum(1).unsqueeze(1)  # [batch, 1, tokens]
        m_p = torch.matmul(path, text.m_p.float().transpose(1, 2)).transpose(1, 2)  # [batch, flow, frames]
        logs_p = torch.matmul(path, text.logs_p.float().transpose(1, 2)).transpose(1, 2)
        kl_weights = None
        if batch.token_weights is not None:  # [batch, frames, tokens] @ [batch, tokens, 1] -> [batch, frames, 1]
            kl_weights = torch.matmul(path, batch.token_weights.float().unsqueeze(-1)).transpose(1, 2) * frame_mask
    starts = pick_segment_starts(batch.frame_lengths, segment_frames)
    audio = model.decoder(slice_segments(z, starts, segment_frames), g)  # [batch, 1, segment_frames * hop]
    duration_nll = duration_loss(model, text, durations, duration_conditioning(model, g)) if duration else None
    return GeneratorForward(
        audio=audio,
        segment_starts=starts,
        z_p=z_p,
        logs_q=logs_q,
        m_p=m_p,
        logs_p=logs_p,
        frame_mask=frame_mask,
        duration_loss=duration_nll,
        durations=durations,
        kl_weights=kl_weights,
    )


@torch.no_grad()
def generated_segments(
    model: VitsModel, batch: Batch, features: Features, segment_frames: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """What a discriminator training alone needs of the generator: random segments decoded from the
    posterior sample, ([batch, 1, segment_samples] audio, [batch] first frames). No text encoder, flow,
    alignment search or duration loss (their results would be thrown away), no gradients."""
    linear = batch.linear if batch.linear is not None else features.linear(batch.audio)
    frame_mask = sequence_mask(batch.frame_lengths, linear.shape[-1]).unsqueeze(1)  # [batch, 1, frames]
    g = conditioning(model, batch.speaker_ids)
    z, _, _ = model.posterior_encoder(linear, frame_mask, g)
    starts = pick_segment_starts(batch.frame_lengths, segment_frames)
    return model.decoder(slice_segments(z, starts, segment_frames), g), starts


def real_segments(
    batch: Batch, features: Features, starts: torch.Tensor, segment_frames: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The real audio [batch, 1, samples] and log-mel [batch, n_mels, frames] matching the generated segments."""
    hop = features.config.hop_length
    audio = slice_segments(batch.audio.unsqueeze(1), starts * hop, segment_frames * hop)
    if batch.mel is None:
        return audio, features.mel(audio.squeeze(1))
    mel = slice_segments(batch.mel, starts, segment_frames)
    # A clip shorter than a segment is read past its end: there the audio is silence (zero padding),
    # and so must the precomputed mel be (its padding is 0, which is loud), as computing it would give.
    frames = starts.unsqueeze(1) + torch.arange(segment_frames, device=starts.device)  # [batch, segment]
    past_end = (frames >= batch.frame_lengths.unsqueeze(1)).unsqueeze(1)  # [batch, 1, segment]
    return audio, torch.where(past_end, features.silence_mel.view(1, -1, 1).to(mel.dtype), mel)


@dataclass
class GeneratorLosses:
    mel: torch.Tensor
    kl: torch.Tensor
    duration: torch.Tensor | None  # None: not computed (a step the duration predictor sits out)
    adversarial: torch.Tensor
    feature_matching: torch.Tensor
    total: torch.Tensor  # weighted sum, what the generator minimises

    def terms(self) -> dict[str, torch.Tensor]:
        return {
            "mel": self.mel,
            "kl": self.kl,
            **({"duration": self.duration} if self.duration is not None else {}),
            "adversarial": self.adversarial,
            "feature_matching": self.feature_matching,
            "generator": self.total,
        }


def generator_losses(
    out: GeneratorForward,
    mel_real: torch.Tensor,
    mel_generated: torch.Tensor,
    fake_scores: list[torch.Tensor] | None,
    fake_features: list[list[torch.Tensor]] | None,
    real_features: list[list[torch.Tensor]] | None,
    weights: losses.LossWeights,
) -> GeneratorLosses:
    """Weighted generator loss; without discriminator outputs (warm-up) the adversarial terms are 0."""
    mel = losses.mel_loss(mel_generated, mel_real)
    kl_mask = out.frame_mask if out.kl_weights is None else out.kl_weights
    kl = losses.kl_loss(out.z_p, out.logs_q, out.m_p, out.logs_p, kl_mask)
    zero = torch.zeros((), device=mel.device)
    adversarial = losses.generator_adversarial_loss(fake_scores) if fake_scores is not None else zero
    matching = (
        losses.feature_matching_loss(real_features, fake_features)
        if fake_features is not None and real_features is not None
        else zero
    )
    total = weights.mel * mel + weights.kl * kl  # summed in this order, as always (resumed runs compare equal)
    if out.duration_loss is not None:
        total = total + weights.duration * out.duration_loss
    total = total + weights.adversarial * adversarial + weights.feature_matching * matching
    return GeneratorLosses(
        mel=mel, kl=kl, duration=out.duration_loss, adversarial=adversarial, feature_matching=matching, total=total
    )


@torch.no_grad()
def reconstruction_mel_l1(model: VitsModel, batch: Batch, features: Features) -> torch.Tensor:
    """Deterministic check of the posterior + decoder: decode each clip's posterior mean whole and
    compare log-mels with the recording over its valid frames. [batch] mean absolute difference."""
    linear = batch.linear if batch.linear is not None else features.linear(batch.audio)
    frame_mask = sequence_mask(batch.frame_lengths, linear.shape[-1]).unsqueeze(1)
    g = conditioning(model, batch.speaker_ids)
    _, z_mean, _ = model.posterior_encoder(linear, frame_mask, g)
    audio = model.decoder(z_mean * frame_mask, g).squeeze(1)
    mel_generated = features.mel(audio)
    mel_real = batch.mel if batch.mel is not None else features.mel(batch.audio)
    frames = min(mel_generated.shape[-1], mel_real.shape[-1])
    diff = (mel_generated[..., :frames] - mel_real[..., :frames]).abs().mean(1)  # [batch, frames]
    mask = frame_mask[:, 0, :frames]
    return (diff * mask).sum(1) / mask.sum(1)
