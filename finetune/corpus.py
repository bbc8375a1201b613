"""A prepared corpus (DATA_DIR/metadata*.csv + wavs/) read into RAM as Examples.

Clips are read as int16 (2 bytes a sample) and cut to a whole number of frames. A clip is left out,
with its reason counted, when its WAV is missing or when its text has more tokens than its audio has
frames (alignment needs at least one frame per token). A WAV at another sample rate than the model's is
an error: preparation was run for another model.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .audio import read_pcm16
from .data import Example


class CorpusError(Exception):
    """The prepared folder cannot be used as it is; the message says what to run."""


def read_metadata(path: Path) -> list[tuple[str, str]]:
    """id|text lines; a line without '|' is a CorpusError naming the line."""
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        item_id, sep, text = line.partition("|")
        if not sep:
            raise CorpusError(f"{path}:{number}: expected 'id|text', found {line[:60]!r}")
        rows.append((item_id, text))
    return rows


@dataclass
class LoadReport:
    loaded: int = 0
    skipped: Counter = field(default_factory=Counter)  # reason -> count
    examples_skipped: list[str] = field(default_factory=list)  # "id: reason", the first few


def tokenize(tokenizer, text: str) -> np.ndarray:
    return np.asarray(tokenizer(text).input_ids, dtype=np.int32)


def load_examples(data_dir: Path, metadata_name: str, tokenizer, hop: int, sample_rate: int,
                  max_samples: int = 0) -> tuple[list[Example], LoadReport]:
    path = data_dir / metadata_name
    if not path.is_file():
        raise CorpusError(f"{path} not found: run prepare_data.py --data_dir {data_dir} first")
    rows = read_metadata(path)
    if max_samples:
        rows = rows[:max_samples]
    examples, report = [], LoadReport()
    for item_id, text in rows:
        example, reason = load_example(data_dir / "wavs" / f"{item_id}.wav", item_id, text, tokenizer, hop, sample_rate)
        if example is None:
            report.skipped[reason] += 1
            if len(report.examples_skipped) < 10:
                report.examples_skipped.append(f"{item_id}: {reason}")
            continue
        examples.append(example)
    report.loaded = len(examples)
    return examples, report


def load_example(wav: Path, item_id: str, text: str, tokenizer, hop: int, sample_rate: int) -> tuple[Example | None, str]:
    if not wav.is_file():
        return None, "missing wav"
    audio, rate = read_pcm16(wav)
    if rate != sample_rate:
        raise CorpusError(f"{wav} is {rate} Hz but the model runs at {sample_rate} Hz: prepare the data again "
                          f"for this model (prepare_data.py --model_name ... or --sample_rate {sample_rate})")
    token_ids = tokenize(tokenizer, text)
    frames = len(audio) // hop
    if len(token_ids) == 0:
        return None, "no tokens"
    if len(token_ids) > frames:
        return None, "more tokens than audio frames"
    return Example(item_id, token_ids, audio[: frames * hop]), ""
