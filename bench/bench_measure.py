#!/usr/bin/env python3
"""Does the evaluation measure rank models as training does? Scores a fresh (untrained) scratch:tiny
model and any model folders (trained, or deliberately broken) on the held-out clips of a prepared
corpus, by several measures: MCD over c1..c24 averaged over the DTW path (the common variant), over
c0..c24 averaged over the path, over c0..c24 averaged per recording frame (ours, what evaluation uses),
log-mel L1 after DTW, and the ratio of synthesised to real length.

    .venv/bin/python bench/bench_measure.py --data_dir demo/work/data demo/work/final_model
"""

from __future__ import annotations

import argparse
from pathlib import Path

import librosa
import numpy as np
import torch

from bench.machine import describe
from finetune.data.corpus import load_examples
from finetune.data.features import FeatureConfig, Features
from finetune.reporting.measures import MCD_SCALE, mcd_dtw, mel_cepstrum
from finetune.training.assembly import corpus_texts, seed_everything
from finetune.vits.generator import scratch_generator
from finetune.vits.inference import ceiling_for_text, speak

REPO = Path(__file__).resolve().parent.parent


def dtw_mean(a: np.ndarray, b: np.ndarray, distance) -> float:
    _, path = librosa.sequence.dtw(X=a, Y=b, metric="euclidean")
    return float(distance(a[:, path[:, 0]], b[:, path[:, 1]]).mean())


def measures(features: Features, synthesised: np.ndarray, real: np.ndarray) -> dict[str, float]:
    mel_s = features.mel(torch.from_numpy(synthesised).unsqueeze(0))[0].numpy()
    mel_r = features.mel(torch.from_numpy(real / 32768.0).float().unsqueeze(0))[0].numpy()
    cep_s, cep_r = mel_cepstrum(mel_s), mel_cepstrum(mel_r)
    euclid = lambda x, y: np.linalg.norm(x - y, axis=0)  # noqa: E731
    return {
        "MCD c1..24 path": MCD_SCALE * dtw_mean(cep_s[1:], cep_r[1:], euclid),
        "MCD c0..24 path": MCD_SCALE * dtw_mean(cep_s, cep_r, euclid),
        "MCD c0..24 per real frame (ours)": mcd_dtw(mel_s, mel_r),
        "mel L1 DTW": dtw_mean(mel_s, mel_r, lambda x, y: np.abs(x - y).mean(axis=0)),
        "length ratio": mel_s.shape[1] / mel_r.shape[1],
    }


def score(model, tokenizer, data_dir: Path, features: Features) -> dict[str, float]:
    examples, _ = load_examples(data_dir, "metadata_val.csv", tokenizer, 256, 16000)
    model.eval()
    rows = [
        measures(
            features,
            speak(model, [e.token_ids], torch.device("cpu"), i, [ceiling_for_text(len(e.token_ids))]).waveforms[0],
            e.audio,
        )
        for i, e in enumerate(examples)
    ]
    return {k: float(np.mean([r[k] for r in rows])) for k in rows[0]} | {"clips": len(rows)}


def main() -> None:
    from transformers import VitsModel, VitsTokenizer

    parser = argparse.ArgumentParser()
    parser.add_argument("--data_dir", required=True)
    parser.add_argument("models", nargs="*")
    args = parser.parse_args()
    data_dir, features = Path(args.data_dir), Features(FeatureConfig())
    seed_everything(1234)
    fresh = scratch_generator("tiny", sorted(set("".join(corpus_texts(data_dir)))), 16000)
    print(f"machine: {describe()}")
    results = {"untrained scratch:tiny": score(fresh.model, fresh.tokenizer, data_dir, features)}
    for folder in args.models:
        results[folder] = score(
            VitsModel.from_pretrained(folder), VitsTokenizer.from_pretrained(folder), data_dir, features
        )
    for name, values in results.items():
        print(
            f"{name:40s} "
            + "  ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in values.items())
        )


if __name__ == "__main__":
    main()
