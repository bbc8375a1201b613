"""Judges of what is said, whoever says it (finetune/reporting/judges.py has the panel that asks them, and
which of them vote):

    phonetic    hama's CTC phoneme recogniser (4.7 MB, IPA posteriors on 16 kHz waveforms; weights in the
                package, numpy and its own engine only): DTW over the two clips' phoneme posteriorgrams,
                blank frames left out, each frame pair's cost -log of the probability both frames say the
                same phone; lower is nearer. What is said, whoever says it and at whatever tempo: a
                recognizer's posteriors carry little of the voice.
    phone_errors  the same recogniser's greedy phone strings, edit distance over the recording's length
                (a phone error rate); lower is nearer.
    asr         --asr_model (a transformers CTC model: hub id or folder, e.g. MMS's all-languages model with
                its Kurmanji adapter): character error rate of its transcript against the clip's text.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from finetune.reporting.judge_audio import JUDGE_RATE, AudioMemo, to_judge_rate


class PhonemeRecogniser:
    """hama's waveform CTC model: per-frame log posteriors over its phones, and the greedy phone string."""

    def __init__(self):
        from hama.asr import ASRModel

        self.model = ASRModel()
        self.blank = self.model.blank_id
        self.memo = AudioMemo()

    def log_posteriors(self, waveform: np.ndarray, sample_rate: int) -> np.ndarray:
        """[frames, phones] log probabilities (the model's own output, before any decoding; remembered)."""
        return self.memo.get(waveform, sample_rate, self.recognise)

    def recognise(self, waveform: np.ndarray, sample_rate: int) -> np.ndarray:
        audio = to_judge_rate(waveform, sample_rate)
        if len(audio) < JUDGE_RATE // 10:  # shorter than its receptive field: nothing to hear
            audio = np.concatenate([audio, np.zeros(JUDGE_RATE // 10 - len(audio), np.float32)])
        model = self.model
        log_probs, lengths = model.session.run(
            [model._log_probs_output_name, model._out_lengths_output_name],
            {
                model._waveform_input_name: audio.reshape(1, -1),
                model._waveform_lengths_input_name: np.array([len(audio)], dtype=np.int64),
            },
        )
        return np.asarray(log_probs[0][: int(np.asarray(lengths).reshape(-1)[0])], dtype=np.float64)

    def phones(self, log_posteriors: np.ndarray) -> list[int]:
        """Greedy CTC decoding: the frames' best phones, repeats collapsed, blanks dropped."""
        best = np.argmax(log_posteriors, axis=1)
        keep = np.concatenate([[True], best[1:] != best[:-1]]) & (best != self.blank)
        return best[keep].tolist()


@dataclass
class PhoneticJudge:
    """DTW over phoneme posteriorgrams (blank frames out): what is said, independent of who says it."""

    recogniser: PhonemeRecogniser = field(default_factory=PhonemeRecogniser)
    references: dict = field(default_factory=dict)  # item id -> the recording's speech frames' posteriors
    name: str = "phonetic"
    kind: str = "phonetic"
    higher_is_better: bool = False

    def speech_frames(self, waveform: np.ndarray, sample_rate: int) -> np.ndarray:
        """[frames, phones] posteriors of the frames whose best guess is a phone, renormalised without the
        blank (a CTC model's blank fills most frames, and would match any silence with any other)."""
        log_p = self.recogniser.log_posteriors(waveform, sample_rate)
        p = np.exp(log_p)
        speech = p[np.argmax(log_p, axis=1) != self.recogniser.blank]
        if len(speech) == 0:  # nothing recognised as speech: the least likely frame for blank stands in
            speech = p[[int(np.argmin(p[:, self.recogniser.blank]))]]
        speech = np.delete(speech, self.recogniser.blank, axis=1)
        return speech / np.maximum(speech.sum(axis=1, keepdims=True), 1e-12)

    def reference(self, item_id: str, waveform: np.ndarray, sample_rate: int) -> np.ndarray:
        if item_id not in self.references:
            self.references[item_id] = self.speech_frames(waveform, sample_rate)
        return self.references[item_id]

    def score(self, waveform: np.ndarray, sample_rate: int, reference: tuple, item_id: str = "", **_) -> float:
        """`reference` (waveform, rate) of what the clip should say; its posteriors kept by `item_id`."""
        return posteriorgram_distance(
            self.speech_frames(waveform, sample_rate), self.reference(item_id or str(id(reference)), *reference)
        )


def posteriorgram_distance(a: np.ndarray, b: np.ndarray) -> float:
    """Mean DTW cost between posteriorgrams a [frames_a, phones] and b [frames_b, phones], per frame of b: each
    pair's -log(a . b), the probability that both frames are the same phone (floored at 1e-4: 9.2 nats)."""
    import librosa

    cost = -np.log(np.clip(a @ b.T, 1e-4, None))
    _, path = librosa.sequence.dtw(C=cost)
    per_b = np.zeros(len(b))
    pairs = np.zeros(len(b))
    np.add.at(per_b, path[:, 1], cost[path[:, 0], path[:, 1]])
    np.add.at(pairs, path[:, 1], 1.0)
    return float((per_b / np.maximum(pairs, 1)).mean())


@dataclass
class PhoneErrorJudge:
    """Edit distance between the two clips' greedy phone strings, over the recording's: a phone error rate."""

    recogniser: PhonemeRecogniser = field(default_factory=PhonemeRecogniser)
    references: dict = field(default_factory=dict)
    name: str = "phone_errors"
    kind: str = "phonetic"
    higher_is_better: bool = False

    def score(self, waveform: np.ndarray, sample_rate: int, reference: tuple, item_id: str = "", **_) -> float:
        key = item_id or str(id(reference))
        if key not in self.references:
            self.references[key] = self.recogniser.phones(self.recogniser.log_posteriors(*reference))
        said = self.recogniser.phones(self.recogniser.log_posteriors(waveform, sample_rate))
        wanted = self.references[key]
        return edit_distance(said, wanted) / max(1, len(wanted))


def edit_distance(a: list, b: list) -> int:
    """Levenshtein distance (insertions, deletions, substitutions each 1)."""
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        previous, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (x != y))
    return row[-1]


class AsrJudge:
    """A transformers CTC model (--asr_model: hub id or folder): character error rate against the text."""

    kind, higher_is_better = "asr", False

    def __init__(self, model_name: str):
        from transformers import AutoModelForCTC, AutoProcessor

        self.name = "asr"
        self.processor = AutoProcessor.from_pretrained(model_name)
        self.model = AutoModelForCTC.from_pretrained(model_name).eval()

    def transcribe(self, waveform: np.ndarray, sample_rate: int) -> str:
        import torch

        audio = to_judge_rate(waveform, sample_rate)
        inputs = self.processor(audio, sampling_rate=JUDGE_RATE, return_tensors="pt")
        with torch.no_grad():
            logits = self.model(**inputs).logits
        return self.processor.batch_decode(torch.argmax(logits, dim=-1))[0]

    def score(self, waveform: np.ndarray, sample_rate: int, text: str = "", **_) -> float:
        wanted = " ".join(text.lower().split())
        said = " ".join(self.transcribe(waveform, sample_rate).lower().split())
        return edit_distance(list(said), list(wanted)) / max(1, len(wanted))
