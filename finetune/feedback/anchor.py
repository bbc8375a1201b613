"""The voice held where a round does not correct it, from text alone: the text encoder's prior (what each token
is said as: its mean and spread in the flow's latent space) on the voice's own sentences and on the tokens of the
corrections that are not what they correct, held to the starting voice's.

A round learns a correction's reading on the tokens it corrects (finetune/feedback/focus.py). What it trains (a
letter's embedding, or the text encoder's layers for a word) also feeds every other token through the encoder's
attention; with no audio the voice's own sentences would only hold through the replayed clips. So each micro-batch
also takes `batch` sentences (the voice's corpus and the corrections' texts, drawn in turn with a seed), runs them
through the text encoder as it is and as it started (both without dropout: the function, not its noise), and adds

    weight x mean over the tokens held, of the squared difference of the prior's means and log spreads, and of
             what the duration predictor reads of the text there

The duration predictor itself is frozen in a round (the correctors' tempo is theirs, not the voice's), but it reads
the text encoder's hidden states, which a word's round trains: held on the prior alone, the voice's own clips came
out 12% longer after a round on "min" (bench/log/2026-12-04.md). So what it reads is held too: the stochastic
predictor's conditioning of its flows (its conv_pre, DDSConv and projection of the hidden states: every input of
its reverse pass but the noise), the hidden states themselves for a deterministic one. A text pass costs a small
share of a micro-batch (no audio, no flow, no decoder).
"""

from __future__ import annotations

import copy

import numpy as np
import torch

from finetune.vits.objective import encode_text


class TextAnchor:
    """A finetune.training.step.Regulariser: `loss(model)` on the next `batch` texts."""

    name = "anchor"

    def __init__(
        self,
        model,
        texts: list[np.ndarray],
        held: list[np.ndarray],
        weight: float,
        batch: int = 8,
        seed: int = 0,
    ):
        """`texts`: token id sequences; `held`: for each, [tokens] bool, the tokens to hold (the rest may move)."""
        if not texts:
            raise ValueError("a text anchor needs at least one text")
        self.texts, self.held, self.weight, self.batch = texts, held, weight, batch
        self.start = copy.deepcopy(model.text_encoder).eval()
        self.start_predictor = copy.deepcopy(model.duration_predictor).eval()
        for parameter in [*self.start.parameters(), *self.start_predictor.parameters()]:
            parameter.requires_grad_(False)
        self.stochastic = bool(model.config.use_stochastic_duration_prediction)
        self.order = np.random.default_rng(seed).permutation(len(texts))
        self.next = 0

    def draw(self) -> list[int]:
        picked = [int(self.order[(self.next + i) % len(self.order)]) for i in range(min(self.batch, len(self.texts)))]
        self.next = (self.next + len(picked)) % len(self.order)
        return picked

    def loss(self, model) -> torch.Tensor:
        prior, durations = self.parts(model)
        return self.weight * (prior + durations)

    def parts(self, model) -> tuple[torch.Tensor, torch.Tensor]:
        """The mean squared moves, over the held tokens of the next texts, of the prior (means and log spreads)
        and of what the duration predictor reads (unweighted)."""
        picked = self.draw()
        device = next(model.text_encoder.parameters()).device
        tokens = max(len(self.texts[i]) for i in picked)
        ids = torch.zeros(len(picked), tokens, dtype=torch.long)
        attention = torch.zeros(len(picked), tokens, dtype=torch.long)
        held = torch.zeros(len(picked), tokens)
        for row, i in enumerate(picked):
            count = len(self.texts[i])
            ids[row, :count] = torch.from_numpy(self.texts[i].astype(np.int64))
            attention[row, :count] = 1
            held[row, :count] = torch.from_numpy(self.held[i].astype(np.float32))
        ids, attention, held = ids.to(device), attention.to(device), held.to(device)
        encoder, predictor = model.text_encoder, model.duration_predictor
        modes = encoder.training, predictor.training
        encoder.eval()  # the function without its dropout noise, as the start is read
        predictor.eval()
        try:
            now = encode_text(model, ids, attention)
            reading = self.duration_reading(predictor, now.hidden, now.mask)
        finally:
            encoder.train(modes[0])
            predictor.train(modes[1])
        with torch.no_grad():
            start = self.start(input_ids=ids, padding_mask=attention.unsqueeze(-1).float(), attention_mask=attention)
            start_reading = self.duration_reading(
                self.start_predictor, start.last_hidden_state.transpose(1, 2), now.mask
            )
        m_start, logs_start = start.prior_means.transpose(1, 2), start.prior_log_variances.transpose(1, 2)
        squared = (now.m_p.float() - m_start.float()) ** 2 + (now.logs_p.float() - logs_start.float()) ** 2
        count = held.sum().clamp(min=1.0)
        prior = (squared.mean(1) * held).sum() / count  # over [batch, tokens]
        durations = (((reading.float() - start_reading.float()) ** 2).mean(1) * held).sum() / count
        return prior, durations

    def duration_reading(self, predictor, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """[batch, channels, tokens]: what `predictor` reads of the hidden states, as transformers' reverse pass
        reads them (without its detach; the voice's speaker conditioning is pinned at zero in a round)."""
        if not self.stochastic:
            return hidden * mask
        return predictor.conv_proj(predictor.conv_dds(predictor.conv_pre(hidden), mask)) * mask
