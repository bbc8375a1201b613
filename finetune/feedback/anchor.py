"""The voice held where a round does not correct it, from text alone: the text encoder's prior (what each token
is said as: its mean and spread in the flow's latent space) on the voice's own sentences and on the tokens of the
corrections that are not what they correct, held to the starting voice's.

A round learns a correction's reading on the tokens it corrects (finetune/feedback/focus.py). What it trains (a
letter's embedding, or the text encoder's layers for a word) also feeds every other token through the encoder's
attention; with no audio the voice's own sentences would only hold through the replayed clips. So each micro-batch
also takes `batch` sentences (the voice's corpus and the corrections' texts, drawn in turn with a seed), runs them
through the text encoder as it is and as it started (both without dropout: the function, not its noise), and adds

    weight x mean over the tokens held, of the squared difference of the prior's means and log spreads

A text pass costs a small share of a micro-batch (no audio, no flow, no decoder). The duration predictor is not
held here: a round freezes it (the correctors' tempo is theirs, not the voice's).
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
        for parameter in self.start.parameters():
            parameter.requires_grad_(False)
        self.order = np.random.default_rng(seed).permutation(len(texts))
        self.next = 0

    def draw(self) -> list[int]:
        picked = [int(self.order[(self.next + i) % len(self.order)]) for i in range(min(self.batch, len(self.texts)))]
        self.next = (self.next + len(picked)) % len(self.order)
        return picked

    def loss(self, model) -> torch.Tensor:
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
        encoder, was_training = model.text_encoder, model.text_encoder.training
        encoder.eval()  # the function without its dropout noise, as the start is read
        try:
            now = encode_text(model, ids, attention)
        finally:
            encoder.train(was_training)
        with torch.no_grad():
            start = self.start(input_ids=ids, padding_mask=attention.unsqueeze(-1).float(), attention_mask=attention)
        m_start, logs_start = start.prior_means.transpose(1, 2), start.prior_log_variances.transpose(1, 2)
        squared = (now.m_p.float() - m_start.float()) ** 2 + (now.logs_p.float() - logs_start.float()) ** 2
        per_token = squared.mean(1)  # [batch, tokens]
        return self.weight * (per_token * held).sum() / held.sum().clamp(min=1.0)
