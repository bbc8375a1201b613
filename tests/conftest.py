"""Shared test helpers: tiny audio, tiny corpora and a tokenizer folder, all built on the fly (no network)."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

REPO = Path(__file__).resolve().parent.parent
DEMO_CORPUS = REPO / "demo" / "corpus"

# A hub that cannot answer: any test that reaches for the network fails fast instead of hanging.
os.environ["HF_ENDPOINT"] = "http://127.0.0.1:9"
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"


def tone(freq_hz: float = 440.0, seconds: float = 1.0, sample_rate: int = 22050, channels: int = 1,
         amplitude: float = 0.3, pad_silence_s: float = 0.0) -> np.ndarray:
    """A sine of `seconds`, with `pad_silence_s` of silence on each side; float32 [frames] or [frames, ch]."""
    t = np.arange(int(seconds * sample_rate)) / sample_rate
    wave = (amplitude * np.sin(2 * np.pi * freq_hz * t)).astype(np.float32)
    pad = np.zeros(int(pad_silence_s * sample_rate), dtype=np.float32)
    wave = np.concatenate([pad, wave, pad])
    return np.stack([wave] * channels, axis=1) if channels > 1 else wave


def encode(samples: np.ndarray, sample_rate: int, fmt: str = "WAV") -> bytes:
    out = io.BytesIO()
    sf.write(out, samples, sample_rate, format=fmt)
    return out.getvalue()


def write_ljspeech(folder: Path, rows: list[tuple[str, str, np.ndarray | bytes | None]], sample_rate: int = 22050,
                   ext: str = "wav") -> Path:
    """metadata.csv + wavs/<id>.<ext>; a row's audio may be samples, raw bytes (e.g. corrupt), or None (no file)."""
    (folder / "wavs").mkdir(parents=True, exist_ok=True)
    lines = []
    for item_id, text, audio in rows:
        lines.append(f"{item_id}|{text}")
        path = folder / "wavs" / f"{item_id}.{ext}"
        if isinstance(audio, bytes):
            path.write_bytes(audio)
        elif audio is not None:
            sf.write(path, audio, sample_rate)
    (folder / "metadata.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


def make_tokenizer_dir(folder: Path, characters: str) -> Path:
    """A model folder holding only an MMS-style tokenizer whose vocabulary is `characters` (id 0 first)."""
    from transformers import VitsTokenizer

    folder.mkdir(parents=True, exist_ok=True)
    vocab = {char: index for index, char in enumerate(characters)}
    vocab_file = folder / "vocab.json"
    vocab_file.write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    tokenizer = VitsTokenizer(str(vocab_file), pad_token=characters[0], phonemize=False, normalize=True)
    tokenizer.save_pretrained(str(folder))
    return folder


KURMANJI_LETTERS = "abcçdeêfghiîjklmnopqrsştuûvwxyz"


@pytest.fixture
def kurmanji_model_dir(tmp_path: Path) -> Path:
    return make_tokenizer_dir(tmp_path / "model", KURMANJI_LETTERS + " '-")
