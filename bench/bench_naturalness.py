#!/usr/bin/env python3
"""Which offline naturalness predictor ranks voices as a listener would? Each model speaks the held-out
texts of a prepared corpus; every candidate measure scores the speech (and the recordings themselves).
A measure earns its place when it ranks an untrained model, an early one, a trained one and the
recordings in that order, and rates the trained model at length_scale 0.7 (too fast) and 1.4 (too
slow) below the same model at 1.0.

    .venv/bin/python bench/bench_naturalness.py --data_dir DATA \\
        --model random=random:VOICE --model early=RUN/checkpoint_epoch_1_step_25.pt --model trained=VOICE \\
        --tempo trained
    .venv/bin/python bench/bench_naturalness.py --smoke       # seconds: an untrained tiny model, 2 demo clips

A model is a model folder, a checkpoint (.pt) of train_vits.py, or random:FOLDER (that folder's
architecture with fresh weights). Candidates: DNSMOS P.835 OVRL / SIG / BAK and P.808 (speechmos, ONNX
weights in the wheel); DistillMOS (distillmos, weights in the wheel) when importable: it imports
torchaudio only for its file reader, and torchaudio has no build for this project's torch, so the bench
stands a stub in for that import (evidence only: the product could not ship that way).
"""

from __future__ import annotations

import argparse
import sys
import time
import types
from pathlib import Path

import numpy as np
import torch

from bench.machine import describe
from finetune.data.audio import write_pcm16
from finetune.data.features import FeatureConfig, Features
from finetune.reporting.measures import mcd_dtw
from finetune.reporting.naturalness import Naturalness
from finetune.vits.inference import speak

REPO = Path(__file__).resolve().parent.parent

TEMPOS = (0.7, 1.4)  # length scales: too fast, too slow


def distillmos_model():
    """DistillMOS, or None when it is not installed."""
    stubbed = False
    try:
        import torchaudio  # noqa: F401
    except (ImportError, OSError):
        stub = types.ModuleType("torchaudio")  # distillmos imports it for its file reader only
        stub.load = stub.transforms = None
        sys.modules["torchaudio"], stubbed = stub, True
    try:
        from distillmos import ConvTransformerSQAModel
    except ImportError:
        return None
    finally:
        if stubbed:  # gone again, so that transformers does not take the stub for the real package
            del sys.modules["torchaudio"]
    model = ConvTransformerSQAModel()
    return model.eval()


def load_model(spec: str):
    """(model, tokenizer) from a folder, a train_vits.py checkpoint, or random:FOLDER."""
    from transformers import VitsModel, VitsTokenizer

    from finetune.training.assembly import generator_from_checkpoint

    if spec.startswith("random:"):
        folder = spec.split(":", 1)[1]
        torch.manual_seed(0)
        return VitsModel(VitsModel.config_class.from_pretrained(folder)), VitsTokenizer.from_pretrained(folder)
    if spec.endswith(".pt"):
        loaded = generator_from_checkpoint(torch.load(spec, map_location="cpu", weights_only=False))
        return loaded.model, loaded.tokenizer
    return VitsModel.from_pretrained(spec), VitsTokenizer.from_pretrained(spec)


class Scorer:
    def __init__(self):
        self.dnsmos, self.distill = Naturalness(), distillmos_model()
        self.features = Features(FeatureConfig())

    def score(self, wave: np.ndarray, real: np.ndarray | None) -> dict[str, float]:
        d = self.dnsmos.score(wave, 16000)
        row = {"DNSMOS OVRL": d.overall, "DNSMOS SIG": d.signal, "DNSMOS BAK": d.background, "P.808": d.p808}
        if self.distill is not None:
            with torch.no_grad():
                row["DistillMOS"] = float(self.distill(torch.from_numpy(wave).float().unsqueeze(0))[0])
        if real is not None:
            mel = lambda w: self.features.mel(torch.from_numpy(w).float().unsqueeze(0))[0].numpy()  # noqa: E731
            row["MCD dB"] = mcd_dtw(mel(wave), mel(real))
            row["length"] = len(wave) / len(real)
        return row


def speak_clips(model, examples, length_scale: float) -> list[np.ndarray]:
    model.eval()
    model.speaking_rate = 1.0 / length_scale
    waves = [
        speak(model, [e.token_ids], torch.device("cpu"), i, [3.0 * len(e.audio) / 16000]).waveforms[0]
        for i, e in enumerate(examples)
    ]
    model.speaking_rate = 1.0
    return waves


def mean_row(rows: list[dict[str, float]]) -> dict[str, float]:
    return {k: float(np.mean([r[k] for r in rows])) for k in rows[0]}


def table(results: dict[str, dict[str, float]]) -> str:
    columns = list(next(iter(results.values())).keys())
    lines = ["| model | " + " | ".join(columns) + " |", "| --- |" + " ---: |" * len(columns)]
    lines += [
        f"| {name} | " + " | ".join(f"{row.get(c, float('nan')):.3f}" for c in columns) + " |"
        for name, row in results.items()
    ]
    return "\n".join(lines)


def run(data_dir: Path, models: list[tuple[str, str]], tempo_of: list[str], clips: int, wav_dir: Path | None) -> None:
    from finetune.data.corpus import load_examples

    scorer = Scorer()
    results: dict[str, dict[str, float]] = {}
    examples = None
    for label, spec in models:
        model, tokenizer = load_model(spec)
        examples, _ = load_examples(data_dir, "metadata_val.csv", tokenizer, 256, 16000)
        examples = examples[:clips]
        for scale in (1.0, *(TEMPOS if label in tempo_of else ())):
            started = time.monotonic()
            waves = speak_clips(model, examples, scale)
            name = label if scale == 1.0 else f"{label}, length_scale {scale}"
            results[name] = mean_row([scorer.score(w, e.audio / 32768.0) for w, e in zip(waves, examples)])
            if wav_dir is not None:
                for w, e in zip(waves[:3], examples):
                    write_pcm16(wav_dir / name.replace(", ", "_").replace(" ", "") / f"{e.item_id}.wav", w, 16000)
            print(f"{name}: {time.monotonic() - started:.0f}s", file=sys.stderr)
    if examples is not None:
        results["recordings"] = mean_row([scorer.score(e.audio / 32768.0, e.audio / 32768.0) for e in examples])
    print(table(results))


def smoke() -> None:
    """An untrained scratch:tiny voice against two demo recordings, every measure: seconds on a CPU."""
    import librosa
    import soundfile as sf

    from finetune.data.corpus import tokenize
    from finetune.vits.generator import scratch_generator

    corpus = REPO / "demo" / "corpus"
    rows = [line.split("|", 1) for line in (corpus / "metadata.csv").read_text(encoding="utf-8").splitlines()[:2]]
    texts = [text.lower() for _, text in rows]
    torch.manual_seed(0)
    voice = scratch_generator("tiny", sorted(set("".join(texts))), 16000)
    scorer = Scorer()
    results: dict[str, list] = {"untrained": [], "recordings": []}
    for index, ((item, _), text) in enumerate(zip(rows, texts)):
        audio, rate = sf.read(str(corpus / "wavs" / f"{item}.mp3"), dtype="float32")
        real = librosa.resample(audio, orig_sr=rate, target_sr=16000)
        wave = speak(
            voice.model.eval(), [tokenize(voice.tokenizer, text)], torch.device("cpu"), index, [10.0]
        ).waveforms[0]
        results["untrained"].append(scorer.score(wave, real))
        results["recordings"].append(scorer.score(real, real))
    print(table({k: mean_row(v) for k, v in results.items()}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data_dir", help="prepared corpus whose metadata_val.csv clips are spoken")
    parser.add_argument(
        "--model", action="append", default=[], help="LABEL=SPEC (folder, .pt, random:FOLDER); repeatable"
    )
    parser.add_argument("--tempo", action="append", default=[], help="LABEL: also score it at length_scale 0.7 and 1.4")
    parser.add_argument("--clips", type=int, default=16, help="held-out clips spoken per model")
    parser.add_argument("--wav_dir", help="write the first 3 clips of each model here, for listening")
    parser.add_argument("--smoke", action="store_true", help="seconds: an untrained tiny voice, 2 demo recordings")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"machine: {describe()}")
    if args.smoke:
        smoke()
        return
    if not args.data_dir or not args.model:
        parser.error("--data_dir and at least one --model are needed (or --smoke)")
    models = [tuple(m.split("=", 1)) for m in args.model]
    run(Path(args.data_dir), models, args.tempo, args.clips, Path(args.wav_dir) if args.wav_dir else None)


if __name__ == "__main__":
    main()
