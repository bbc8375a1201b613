"""Speaking text with a saved model folder: load it with stock transformers, normalise text the way
training did, skip (and name) what the vocabulary cannot say, write 16-bit WAVs. Synthesis is bounded
(finetune/vits/inference.py): a sentence lasts at most ceiling_for_text of its length, whatever the model asks."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from transformers import VitsModel, VitsTokenizer

from finetune.data.audio import write_pcm16
from finetune.data.corpus import tokenize
from finetune.data.text import TextNormalizer, describe_oov
from finetune.vits.inference import ceiling_for_text
from finetune.vits.inference import speak as speak_bounded


@dataclass
class Voice:
    model: VitsModel  # in eval mode
    tokenizer: VitsTokenizer
    normalizer: TextNormalizer
    sample_rate: int
    device: torch.device
    speaker: int | None = None  # the speaker id a multi-speaker model speaks as


def load_voice(
    model_dir: str | Path, device: torch.device, speaking_rate: float = 1.0, speaker: str | None = None
) -> Voice:
    """The folder's voice, with the inference settings of its config.json (fitted to its recordings: the tempo
    the stock pipeline speaks at), `speaking_rate` times faster; with `speaker` (a name or id in
    speakers.json), that speaker of the multi-speaker model the folder holds (train_vits.py writes it in
    multi_speaker/ beside the single voice)."""
    from transformers import VitsTokenizer

    from finetune.vits.generator import load_complete_model
    from finetune.vits.speaker_layers import MULTI_SPEAKER_DIR, speaker_id

    folder, speaker_index = Path(model_dir), None
    if speaker is not None:
        folder = folder / MULTI_SPEAKER_DIR if (folder / MULTI_SPEAKER_DIR).is_dir() else folder
        if not (folder / "speakers.json").is_file():
            raise ValueError(
                f"--speaker {speaker}: {model_dir} holds one voice (no {MULTI_SPEAKER_DIR}/speakers.json); "
                "leave --speaker out"
            )
        speaker_index = speaker_id(folder, speaker)
    model = load_complete_model(folder, str(folder), speakers=speaker is not None).to(device).eval()
    model.speaking_rate = float(model.config.speaking_rate) * speaking_rate  # relative to the voice's own tempo
    tokenizer = VitsTokenizer.from_pretrained(str(folder))
    normalizer = TextNormalizer({t for t in tokenizer.encoder if len(t) == 1})
    return Voice(model, tokenizer, normalizer, int(model.config.sampling_rate), device, speaker_index)


@dataclass
class Line:
    item_id: str
    text: str  # as written
    token_ids: np.ndarray | None  # None when it cannot be said
    problem: str = ""


def prepare_lines(voice: Voice, lines: list[tuple[str, str]]) -> list[Line]:
    """(id, text) -> Lines, each with token ids or the reason it cannot be said."""
    prepared = []
    for item_id, text in lines:
        check = voice.normalizer(text)
        if check.oov or not check.text:
            prepared.append(Line(item_id, text, None, describe_oov(check.oov) or "nothing sayable"))
        else:
            prepared.append(Line(item_id, text, tokenize(voice.tokenizer, check.text)))
    return prepared


def speak(voice: Voice, token_ids: np.ndarray, seed: int = 0) -> np.ndarray:
    ceiling_s = ceiling_for_text(len(token_ids)) / voice.model.speaking_rate  # slower speech may take longer
    return speak_bounded(voice.model, [token_ids], voice.device, seed, [ceiling_s], speaker=voice.speaker).waveforms[0]


def speak_to_folder(voice: Voice, lines: list[Line], folder: Path, seed: int = 0, suffix: str = "") -> list[Path]:
    """Each sayable line to folder/<id><suffix>.wav; returns the paths written."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for line in lines:
        if line.token_ids is None:
            continue
        path = folder / f"{line.item_id}{suffix}.wav"
        write_pcm16(path, speak(voice, line.token_ids, seed), voice.sample_rate)
        paths.append(path)
    return paths


def speak_for_review(voice: Voice, lines: list[Line], folder: Path, seed: int = 0) -> list[tuple[Path, Line]]:
    """The sayable lines to folder/<id>.wav, each text to folder/<id>.txt and all to folder/metadata.csv
    (`id|text`): what corrections are recorded against; each line that cannot be said is named on stderr. Returns (path, line) pairs;
    with nothing sayable, nothing is written."""
    for line in lines:
        if line.token_ids is None:
            print(f"skipped line {line.item_id}: {line.problem}: {line.text}", file=sys.stderr)
    sayable = [line for line in lines if line.token_ids is not None]
    if not sayable:
        return []
    paths = speak_to_folder(voice, sayable, folder, seed)
    (folder / "metadata.csv").write_text("".join(f"{l.item_id}|{l.text}\n" for l in sayable), encoding="utf-8")
    for line in sayable:  # the text of each, as the pair a correction is recorded into
        (folder / f"{line.item_id}.txt").write_text(line.text + "\n", encoding="utf-8")
    return list(zip(paths, sayable))


def numbered(lines: list[str]) -> list[tuple[str, str]]:
    """Sentences -> (id, text) with zero-padded ids 001, 002, ..."""
    width = max(3, len(str(len(lines))))
    return [(f"{i:0{width}d}", text) for i, text in enumerate(lines, start=1)]


def read_sentences(path: str | Path) -> list[str]:
    return [l.strip() for l in Path(path).read_text(encoding="utf-8").splitlines() if l.strip()]
