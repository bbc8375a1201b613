"""Training examples and batches.

An Example is one clip held in RAM compactly: token ids (int32) and audio (int16, 2 bytes a sample),
optionally with precomputed features (float16). `collate` pads a list of them into a Batch whose
tensors are named; audio stays int16 until it reaches the device, so host-to-device copies move half
the bytes, and becomes float there.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import numpy as np
import torch

AUDIO_SCALE = 32768.0


@dataclass
class Example:
    item_id: str
    token_ids: np.ndarray  # [tokens] int32, blanks included
    audio: np.ndarray  # [samples] int16, trimmed to frames * hop
    linear: torch.Tensor | None = None  # [bins, frames] float16 when precomputed
    mel: torch.Tensor | None = None  # [n_mels, frames] float16 when precomputed
    speaker: int = 0  # index into the run's speaker list (0 for a single-speaker corpus)
    # [tokens] float32: how much each token's frames count in the prior's loss (None: all alike). A feedback round
    # learns a correction's reading on the tokens it corrects only, and the voice's on every other token.
    token_weights: np.ndarray | None = None

    def frame_count(self, hop: int) -> int:
        return int(self.audio.shape[0]) // hop

    def nbytes(self) -> int:
        extra = sum(t.numel() * t.element_size() for t in (self.linear, self.mel) if t is not None)
        return int(self.token_ids.nbytes + self.audio.nbytes + extra)


@dataclass
class Batch:
    item_ids: list[str]
    input_ids: torch.Tensor  # [batch, tokens] int64
    attention_mask: torch.Tensor  # [batch, tokens] int64, 1 on real tokens
    text_lengths: torch.Tensor  # [batch] int64
    audio: torch.Tensor  # [batch, frames * hop] int16 on the host, float32 in [-1, 1] after `to`
    frame_lengths: torch.Tensor  # [batch] int64
    linear: torch.Tensor | None = None  # [batch, bins, frames]
    mel: torch.Tensor | None = None  # [batch, n_mels, frames]
    speaker_ids: torch.Tensor | None = None  # [batch] int64
    token_weights: torch.Tensor | None = None  # [batch, tokens] float32, 0 past each text (None: all 1)

    def __len__(self) -> int:
        return len(self.item_ids)

    def first(self, count: int) -> "Batch":
        """Its first `count` clips, padded only to their own longest text and audio (a run's last micro-batch
        cut to the clips its deadline leaves time for)."""
        if count >= len(self):
            return self
        tokens, frames = int(self.text_lengths[:count].max()), int(self.frame_lengths[:count].max())
        hop = self.audio.shape[1] // max(1, int(self.frame_lengths.max()))
        return replace(
            self,
            item_ids=self.item_ids[:count],
            input_ids=self.input_ids[:count, :tokens],
            attention_mask=self.attention_mask[:count, :tokens],
            text_lengths=self.text_lengths[:count],
            audio=self.audio[:count, : frames * hop],
            frame_lengths=self.frame_lengths[:count],
            linear=None if self.linear is None else self.linear[:count, :, :frames],
            mel=None if self.mel is None else self.mel[:count, :, :frames],
            speaker_ids=None if self.speaker_ids is None else self.speaker_ids[:count],
            token_weights=None if self.token_weights is None else self.token_weights[:count, :tokens],
        )

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "Batch":
        """Move every tensor; audio becomes float32 on arrival, features float32."""
        moved = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, torch.Tensor):
                value = value.to(device, non_blocking=non_blocking)
                if f.name == "audio" and value.dtype == torch.int16:
                    value = value.float() / AUDIO_SCALE
                elif f.name in ("linear", "mel"):
                    value = value.float()
            moved[f.name] = value
        return replace(self, **moved)

    def pin_memory(self) -> "Batch":
        """Page-locked host tensors, so `to(cuda, non_blocking=True)` overlaps the copy with compute."""
        pinned = {
            f.name: getattr(self, f.name).pin_memory()
            for f in fields(self)
            if isinstance(getattr(self, f.name), torch.Tensor)
        }
        return replace(self, **pinned)


def collate(examples: list[Example], hop: int) -> Batch:
    """Pad examples to the longest text and the longest audio in the batch."""
    count = len(examples)
    text_lengths = torch.tensor([len(e.token_ids) for e in examples], dtype=torch.long)
    frame_lengths = torch.tensor([e.frame_count(hop) for e in examples], dtype=torch.long)
    max_tokens, max_frames = int(text_lengths.max()), int(frame_lengths.max())
    input_ids = torch.zeros(count, max_tokens, dtype=torch.long)
    attention_mask = torch.zeros(count, max_tokens, dtype=torch.long)
    audio = torch.zeros(count, max_frames * hop, dtype=torch.int16)
    for i, example in enumerate(examples):
        input_ids[i, : len(example.token_ids)] = torch.from_numpy(example.token_ids.astype(np.int64))
        attention_mask[i, : len(example.token_ids)] = 1
        samples = example.frame_count(hop) * hop
        audio[i, :samples] = torch.from_numpy(example.audio[:samples])
    return Batch(
        item_ids=[e.item_id for e in examples],
        input_ids=input_ids,
        attention_mask=attention_mask,
        text_lengths=text_lengths,
        audio=audio,
        frame_lengths=frame_lengths,
        linear=_pad_features([e.linear for e in examples], max_frames),
        mel=_pad_features([e.mel for e in examples], max_frames),
        speaker_ids=torch.tensor([e.speaker for e in examples], dtype=torch.long),
        token_weights=_pad_token_weights(examples, max_tokens),
    )


def _pad_token_weights(examples: list[Example], max_tokens: int) -> torch.Tensor | None:
    """[batch, tokens] of the examples' token weights (1 on each token of one without), None when none has any."""
    if all(e.token_weights is None for e in examples):
        return None
    out = torch.zeros(len(examples), max_tokens, dtype=torch.float32)
    for i, example in enumerate(examples):
        count = len(example.token_ids)
        weights = example.token_weights if example.token_weights is not None else np.ones(count, np.float32)
        out[i, :count] = torch.from_numpy(np.asarray(weights, dtype=np.float32))
    return out


def _pad_features(features: list[torch.Tensor | None], max_frames: int) -> torch.Tensor | None:
    if any(f is None for f in features):
        return None
    out = torch.zeros(len(features), features[0].shape[0], max_frames, dtype=features[0].dtype)
    for i, feature in enumerate(features):
        out[i, :, : feature.shape[1]] = feature
    return out
