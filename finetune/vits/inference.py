"""Speaking token ids with bounded cost: transformers' VITS inference, with the predicted durations capped
before anything is rendered.

Stock `VitsModel.forward` renders whatever length the duration predictor asks for. A diverged predictor
asks for minutes per clip; the flow and the decoder then run over all of it (a hook on the decoder alone
does not help: the flow has already run), taking many GB and many minutes. Here the same computation
runs in the same order, drawing the same random numbers, with two ceilings applied to the durations
first:

    per token  a token (a character or the blank between two) lasts at most `max_token_s`
               (MAX_TOKEN_S, 1 s; a pause longer than that is not speech a VITS voice makes)
    per clip   the whole utterance lasts at most `max_clip_s` seconds: callers tie it to the recording
               (evaluation) or to the text (ceiling_for_text); past it, every token's duration is
               scaled down by the same factor so that the clip fits

Below both ceilings the waveform equals stock transformers' output for the same seed (tested), so a good
model sounds the same here as in `pipeline("text-to-speech")`. A broken model costs about what a good one
costs, and what it asked for is kept: `requested_frames` is the length the predictor wanted before the
caps, so timing measures still see how wrong it was. Non-finite predicted durations count as the
per-token ceiling.

Shapes: tokens [batch, tokens]; durations [batch, 1, tokens]; latents [batch, flow, frames].
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

MAX_TOKEN_S = 1.0  # ceiling of one token's duration
TEXT_SECONDS_PER_TOKEN = 0.25  # ceiling_for_text: about 7x an average token (two tokens a character)
TEXT_MIN_CEILING_S = 5.0  # ceiling_for_text: even a one-word sentence may take this long


def ceiling_for_text(token_count: int) -> float:
    """Per-clip ceiling (seconds) for text with no recording to compare with: proportional to its length."""
    return max(TEXT_MIN_CEILING_S, TEXT_SECONDS_PER_TOKEN * token_count)


@dataclass
class Speech:
    """What `speak_tokens` returns for a batch of texts."""

    waveforms: list[np.ndarray]  # float32, one per text, as long as rendered (after the caps)
    requested_frames: list[float]  # frames the duration predictor asked for, before any cap
    rendered_frames: list[int]  # frames rendered
    token_frames: list[np.ndarray]  # rendered frames per token (int), one array per text

    @property
    def capped(self) -> list[bool]:
        return [requested > rendered for requested, rendered in zip(self.requested_frames, self.rendered_frames)]


def cap_durations(
    frames: torch.Tensor, mask: torch.Tensor, max_token_frames: float, max_clip_frames: torch.Tensor
) -> torch.Tensor:
    """frames [batch, 1, tokens] as predicted (float, possibly huge or non-finite), mask [batch, 1, tokens],
    max_clip_frames [batch] -> whole frames per token, each at most `max_token_frames`, each clip's sum
    at most its `max_clip_frames` (scaled down together when over it)."""
    frames = torch.nan_to_num(frames, nan=max_token_frames, posinf=max_token_frames, neginf=0.0)
    frames = torch.clamp(torch.ceil(frames), 0.0, math.floor(max_token_frames)) * mask
    total = frames.sum(dim=(1, 2))  # [batch]
    scale = torch.clamp(max_clip_frames / torch.clamp(total, min=1.0), max=1.0)  # 1 where the clip fits
    return torch.where((scale < 1.0).view(-1, 1, 1), torch.floor(frames * scale.view(-1, 1, 1)), frames)


def expand_to_frames(durations: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Whole frames per token [batch, 1, tokens] -> the hard alignment [batch, frames, tokens] (each
    frame belongs to one token) and the frame mask [batch, 1, frames], as transformers builds them."""
    lengths = torch.clamp_min(durations.sum(dim=(1, 2)), 1).long()  # [batch]
    frames = int(lengths.max())
    positions = torch.arange(frames, device=durations.device, dtype=durations.dtype)
    frame_mask = (positions.unsqueeze(0) < lengths.unsqueeze(1)).unsqueeze(1).to(mask.dtype)  # [batch, 1, frames]
    ends = torch.cumsum(durations, dim=-1).transpose(1, 2)  # [batch, tokens, 1]
    before_end = (positions.view(1, 1, -1) < ends).to(mask.dtype)  # [batch, tokens, frames]
    path = before_end - torch.nn.functional.pad(before_end, [0, 0, 1, 0])[:, :-1]  # first-difference over tokens
    path = path * mask.transpose(1, 2) * frame_mask  # [batch, tokens, frames]
    return path.transpose(1, 2), frame_mask


@torch.no_grad()
def speak_tokens(
    model,
    token_ids: list[np.ndarray],
    device: torch.device,
    max_clip_s: list[float],
    max_token_s: float = MAX_TOKEN_S,
    speaker: int | None = None,
) -> Speech:
    """Waveforms for token id sequences with a VitsModel in eval mode, each clip at most its
    `max_clip_s`. Random numbers come from the global generator (callers seed it), drawn as stock
    transformers draws them. `speaker`: whose voice, for a model conditioned on speakers."""
    config = model.config
    hop = math.prod(config.upsample_rates)
    frames_per_s = config.sampling_rate / hop
    count = len(token_ids)
    dtype = model.text_encoder.embed_tokens.weight.dtype
    encoded, hidden, mask = encode_text(
        model, token_ids, device
    )  # hidden [batch, hidden, tokens], mask [batch, 1, tokens]
    g = speaker_conditioning(model, speaker, count, device)
    log_duration = predict_log_duration(model, hidden, mask, g, model.noise_scale_duration)
    length_scale = 1.0 / model.speaking_rate
    requested = torch.exp(log_duration.float()) * mask * length_scale  # [batch, 1, tokens], may be inf
    ceilings = torch.tensor([s * frames_per_s for s in max_clip_s], device=device, dtype=torch.float32)
    durations = cap_durations(requested, mask.float(), max_token_s * frames_per_s * length_scale, ceilings).to(dtype)
    path, frame_mask = expand_to_frames(durations, mask)  # [batch, frames, tokens], [batch, 1, frames]
    prior_means = torch.matmul(path, encoded.prior_means).transpose(1, 2)  # [batch, flow, frames]
    prior_log_std = torch.matmul(path, encoded.prior_log_variances).transpose(1, 2)
    latents = prior_means + torch.randn_like(prior_means) * torch.exp(prior_log_std) * model.noise_scale
    latents = model.flow(latents, frame_mask, g, reverse=True)
    waveform = model.decoder(latents * frame_mask, g).squeeze(1).float().cpu().numpy()  # [batch, samples]
    rendered = torch.clamp_min(durations.sum(dim=(1, 2)), 1).long().tolist()
    wanted = torch.ceil(torch.nan_to_num(requested, nan=float("inf"))).sum(dim=(1, 2)).tolist()
    return Speech(
        waveforms=[waveform[i, : rendered[i] * hop] for i in range(count)],
        requested_frames=[float(w) for w in wanted],
        rendered_frames=rendered,
        token_frames=[durations[i, 0, : len(token_ids[i])].long().cpu().numpy() for i in range(count)],
    )


@torch.no_grad()
def duration_draws(
    model,
    token_ids: list[np.ndarray],
    device: torch.device,
    seed: int,
    draws: int,
    speaker: int | None = None,
    noise_scale_duration: float | None = None,
    speaking_rate: float | None = None,
) -> np.ndarray:
    """Frames the duration predictor asks for, [texts, draws]: each text's length (before any cap) under
    `draws` independent noise draws, as stock transformers computes it (ceil(exp(log duration)) per token,
    summed), at the model's own `noise_scale_duration` and `speaking_rate` unless others are given. Each
    draw is what one request of the stock pipeline would ask for. Seeded, in a forked RNG. Cost: the text
    encoder once and the duration predictor over `draws` copies of the batch (no flow, no decoder): a
    small share of one synthesis. Non-finite lengths come back as inf."""
    config = model.config
    noise = model.noise_scale_duration if noise_scale_duration is None else noise_scale_duration
    rate = model.speaking_rate if speaking_rate is None else speaking_rate
    if not config.use_stochastic_duration_prediction:
        draws = 1  # a deterministic predictor: every draw is the same
    with fork_rng(device):
        torch.manual_seed(seed)
        encoded, hidden, mask = encode_text(model, token_ids, device)
        hidden, mask = hidden.repeat_interleave(draws, dim=0), mask.repeat_interleave(draws, dim=0)
        g = speaker_conditioning(model, speaker, hidden.shape[0], device)
        log_duration = predict_log_duration(model, hidden, mask, g, noise)
    return requested_frames(log_duration, mask, rate).view(len(token_ids), draws).cpu().numpy()


def requested_frames(log_duration: torch.Tensor, mask: torch.Tensor, speaking_rate: float) -> torch.Tensor:
    """[rows]: the frames each row's durations ask for, as stock transformers computes them (ceil(exp(log
    duration) / rate) per token, summed); inf where they are not finite."""
    frames = torch.ceil(torch.exp(log_duration.float()) * mask / speaking_rate)  # [rows, 1, tokens]
    return torch.nan_to_num(frames, nan=float("inf")).sum(dim=(1, 2))


class DurationSampler:
    """The frames the duration predictor asks for, for a fixed set of texts measured many times over
    (fit_tempo: a grid of settings, then halves of the clips, then refinements). What does not depend on
    the noise is computed once: the text encoder, and the predictor's conditioning on it (its conv_pre,
    speaker input, DDSConv and projection, once a clip rather than once a draw); each call then runs the
    predictor's inverse flows over every setting and draw in one pass. The arithmetic is transformers'
    reverse pass (`VitsStochasticDurationPredictor.forward(reverse=True)`), the noise drawn as it draws it
    (a standard normal [rows, 2, tokens] on the CPU generator, times the setting's noise_scale_duration):
    with one setting, the draws are `duration_draws`' (tests/test_tempo_fit.py)."""

    def __init__(self, model, token_ids: list[np.ndarray], device: torch.device, draws: int, speaker=None):
        self.model, self.device = model, device
        self.stochastic = bool(model.config.use_stochastic_duration_prediction)
        self.draws = draws if self.stochastic else 1  # a deterministic predictor: every draw is the same
        self.lengths = [len(t) for t in token_ids]
        with torch.no_grad():
            _, hidden, self.mask = encode_text(model, token_ids, device)  # [texts, hidden | 1, tokens]
            g = speaker_conditioning(model, speaker, len(token_ids), device)
            if self.stochastic:
                predictor = model.duration_predictor
                conditioning = predictor.conv_pre(hidden)
                if g is not None:
                    conditioning = conditioning + predictor.cond(g)
                conditioning = predictor.conv_dds(conditioning, self.mask)
                self.conditioning = predictor.conv_proj(conditioning) * self.mask  # [texts, channels, tokens]
            else:
                self.log_duration = predict_log_duration(model, hidden, self.mask, None, None)

    @torch.no_grad()
    def frames(self, clips: list[int], noise_scales: list[float], speaking_rate: float, seed: int) -> np.ndarray:
        """[settings, clips, draws]: each clip's length under `draws` noise draws at each noise_scale_duration
        of `noise_scales` (ignored by a deterministic predictor) and `speaking_rate`, as stock transformers
        computes it (ceil(exp(log duration)) per token, summed). Seeded, in a forked RNG. Non-finite
        lengths come back as inf."""
        index = torch.as_tensor(clips, device=self.device)
        longest = max(self.lengths[i] for i in clips)
        mask = self.mask[index, :, :longest]
        if self.stochastic:
            settings, rows = len(noise_scales), len(noise_scales) * len(clips) * self.draws  # [setting, clip, draw]
            mask = mask.repeat_interleave(self.draws, dim=0).repeat(settings, 1, 1)
            conditioning = self.conditioning[index, :, :longest].repeat_interleave(self.draws, dim=0)
            conditioning = conditioning.repeat(settings, 1, 1)
            dtype = conditioning.dtype
            noise = torch.tensor(noise_scales, device=self.device, dtype=dtype).repeat_interleave(rows // settings)
            flows = list(reversed(self.model.duration_predictor.flows))
            flows = flows[:-2] + [flows[-1]]  # as transformers: the flow that only moves the noise channel left out
            with fork_rng(self.device):
                torch.manual_seed(seed)
                latents = torch.randn(rows, 2, longest).to(device=self.device, dtype=dtype) * noise.view(-1, 1, 1)
            for flow in flows:
                latents = torch.flip(latents, [1])
                latents, _ = flow(latents, mask, global_conditioning=conditioning, reverse=True)
            log_duration = latents[:, :1]
        else:
            settings, log_duration = 1, self.log_duration[index, :, :longest]
        totals = requested_frames(log_duration, mask, speaking_rate).view(settings, len(clips), self.draws)
        return totals.expand(len(noise_scales), -1, -1).cpu().numpy()


def speaker_conditioning(model, speaker: int | None, count: int, device: torch.device) -> torch.Tensor | None:
    """g [count, embedding, 1] for one speaker of a conditioned model; None for a plain model."""
    from finetune.vits.speaker_layers import conditioning

    ids = None if speaker is None else torch.full((count,), int(speaker), dtype=torch.long, device=device)
    return conditioning(model, ids)


def predict_log_duration(
    model, hidden: torch.Tensor, mask: torch.Tensor, g: torch.Tensor | None, noise_scale_w
) -> torch.Tensor:
    """log frames per token [batch, 1, tokens], drawn as stock transformers draws them (a deterministic
    predictor is never conditioned on the speaker: finetune/vits/speaker_layers.py)."""
    if model.config.use_stochastic_duration_prediction:
        return model.duration_predictor(hidden, mask, g, reverse=True, noise_scale=noise_scale_w)
    return model.duration_predictor(hidden, mask, None)


def encode_text(model, token_ids: list[np.ndarray], device: torch.device):
    """Token id sequences -> (the text encoder's output, hidden [batch, hidden, tokens], mask [batch, 1, tokens])."""
    count, longest = len(token_ids), max(len(t) for t in token_ids)
    input_ids = torch.zeros(count, longest, dtype=torch.long)
    attention = torch.zeros(count, longest, dtype=torch.long)
    for i, ids in enumerate(token_ids):
        input_ids[i, : len(ids)] = torch.from_numpy(ids.astype(np.int64))
        attention[i, : len(ids)] = 1
    input_ids, attention = input_ids.to(device), attention.to(device)
    token_mask = attention.unsqueeze(-1).to(model.text_encoder.embed_tokens.weight.dtype)  # [batch, tokens, 1]
    encoded = model.text_encoder(input_ids=input_ids, padding_mask=token_mask, attention_mask=attention)
    return encoded, encoded.last_hidden_state.transpose(1, 2), token_mask.transpose(1, 2)


def fork_rng(device: torch.device):
    """A block whose random draws leave the caller's generators (CPU, and this CUDA device) as they were."""
    devices = [device.index or 0] if device.type == "cuda" else []
    return torch.random.fork_rng(devices=devices)


def speak(
    model,
    token_ids: list[np.ndarray],
    device: torch.device,
    seed: int,
    max_clip_s: list[float],
    speaker: int | None = None,
) -> Speech:
    """`speak_tokens` seeded with `seed`, inside a forked RNG: the same input gives the same audio, and
    a training run's random state is left exactly as it was (so a resumed run matches an uninterrupted one)."""
    with fork_rng(device):
        torch.manual_seed(seed)
        return speak_tokens(model, token_ids, device, max_clip_s, speaker=speaker)


def synthesise_graph(
    model,
    input_ids: torch.Tensor,
    noise_scale: torch.Tensor,
    length_scale: torch.Tensor,
    noise_scale_w: torch.Tensor,
    token_count: torch.Tensor | None = None,
    speaker_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """One text's waveform [1, 1, samples] from token ids [1, tokens], written with tensor operations only
    (no Python numbers taken from tensors), so that it traces into an ONNX graph with dynamic lengths.
    The scales are [1]-shaped tensors (sherpa-onnx's inputs); the same ceilings as `speak_tokens` apply:
    MAX_TOKEN_S a token, `ceiling_for_text` a clip (both stretched by `length_scale`). With both noise
    scales 0 it equals `speak_tokens` (tested). `token_count` [1] (sherpa-onnx's x_length) marks how many
    of the ids are text; by default all. `speaker_ids` [1] (sherpa-onnx's sid): the speaker of a
    conditioned model (None for a plain one)."""
    from finetune.vits.speaker_layers import conditioning, duration_conditioning

    config = model.config
    g = conditioning(model, speaker_ids)
    frames_per_s = config.sampling_rate / math.prod(config.upsample_rates)
    ones = torch.ones_like(input_ids)
    if token_count is not None:
        ones = (torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0) < token_count.view(-1, 1)).long()
    token_mask = ones.unsqueeze(-1).to(model.text_encoder.embed_tokens.weight.dtype)  # [1, tokens, 1]
    encoded = model.text_encoder(input_ids=input_ids, padding_mask=token_mask, attention_mask=ones)
    hidden, mask = encoded.last_hidden_state.transpose(1, 2), token_mask.transpose(1, 2)  # [1, H, T], [1, 1, T]
    if config.use_stochastic_duration_prediction:
        log_duration = model.duration_predictor(
            hidden, mask, duration_conditioning(model, g), reverse=True, noise_scale=noise_scale_w
        )
    else:
        log_duration = model.duration_predictor(hidden, mask, duration_conditioning(model, g))
    frames = torch.ceil(torch.exp(log_duration) * mask * length_scale)  # [1, 1, T]
    token_cap = torch.floor(MAX_TOKEN_S * frames_per_s * length_scale)
    frames = torch.where(torch.isnan(frames), token_cap, torch.minimum(frames, token_cap))
    tokens = mask.sum()
    clip_cap = torch.clamp(tokens * TEXT_SECONDS_PER_TOKEN, min=TEXT_MIN_CEILING_S) * frames_per_s * length_scale
    scale = torch.clamp(clip_cap / torch.clamp(frames.sum(), min=1.0), max=1.0)
    frames = torch.where(scale < 1.0, torch.floor(frames * scale), frames)
    total = torch.clamp(frames.sum(), min=1.0).long()
    positions = torch.arange(total, device=frames.device).to(frames.dtype)  # [F]
    ends = torch.cumsum(frames, dim=-1).transpose(1, 2)  # [1, T, 1]
    before_end = (positions.view(1, 1, -1) < ends).to(frames.dtype)  # [1, T, F]
    path = (before_end - torch.nn.functional.pad(before_end, [0, 0, 1, 0])[:, :-1]).transpose(1, 2)  # [1, F, T]
    prior_means = torch.matmul(path, encoded.prior_means).transpose(1, 2)  # [1, flow, F]
    prior_log_std = torch.matmul(path, encoded.prior_log_variances).transpose(1, 2)
    latents = prior_means + torch.randn_like(prior_means) * torch.exp(prior_log_std) * noise_scale
    frame_mask = torch.ones_like(latents[:, :1])  # [1, 1, F]: one text, no padding
    latents = model.flow(latents, frame_mask, g, reverse=True)
    return model.decoder(latents, g)  # [1, 1, samples]
