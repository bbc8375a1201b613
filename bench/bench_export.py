#!/usr/bin/env python3
"""Real-time factor on the CPU of one voice three ways: PyTorch (this tool's bounded inference, as
synthesize.py runs), onnxruntime on the exported graph, and sherpa-onnx on the exported folder, on the
same sentences with the same thread count. RTF = seconds of compute / seconds of audio (below 1 is faster
than real time).

    .venv/bin/python bench/bench_export.py demo/work/checkpoints/best_model
    .venv/bin/python bench/bench_export.py --size mms          # MMS-size architecture, random weights

A model folder gives real durations; `--size mms` builds an MMS-size VITS (36M parameters) with random
weights and a length scale that makes it speak about 12 frames a token (a realistic audio length), so the
figure shows what the architecture costs, not what it says.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.machine import describe

REPO = Path(__file__).resolve().parent.parent

SENTENCES = [
    "rojbaş tu çawa yî",
    "ez ji te hez dikim û ez ê her tim li vir bim",
    "sibê em ê zû rabin ji ber ku rêwîtiyek dirêj li pêşiya me ye",
    "av ewqas zelal bû ku me kevirên binî didîtin",
    "her kes dikare tiştekî nû fêr bibe",
]


def build(args):
    import torch

    from finetune.vits.generator import scratch_generator
    from finetune.vits.synthesis import load_voice
    from tests.conftest import KURMANJI_LETTERS

    if args.model_dir:
        voice = load_voice(args.model_dir, torch.device("cpu"))
        return voice.model, voice.tokenizer, 1.0
    torch.manual_seed(0)
    loaded = scratch_generator(args.size, list(KURMANJI_LETTERS + " "), 16000)
    return loaded.model.eval(), loaded.tokenizer, args.length_scale


def timed(function, repeats: int) -> tuple[float, float]:
    """(compute seconds, audio seconds) over `repeats` passes after one warm-up pass."""
    function()
    started, audio = time.perf_counter(), 0.0
    for _ in range(repeats):
        audio += function()
    return time.perf_counter() - started, audio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir", nargs="?", default=None)
    parser.add_argument("--size", default="mms", choices=["tiny", "small", "mms"])
    parser.add_argument(
        "--length_scale", type=float, default=0.0, help="for --size: 0 picks --frames_per_token frames a token"
    )
    parser.add_argument(
        "--frames_per_token", type=float, default=12.0, help="random weights' durations scaled to this (speech: ~12)"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    import onnxruntime
    import torch

    from finetune.vits.inference import speak_tokens, synthesise_graph
    from finetune.vits.onnx_export import export_voice

    torch.set_num_threads(args.threads)
    model, tokenizer, length_scale = build(args)
    ids = [np.asarray(tokenizer(s).input_ids, dtype=np.int64) for s in SENTENCES]
    if not length_scale:  # random weights: scale the durations to about --frames_per_token frames a token
        with torch.no_grad():
            natural = (
                synthesise_graph(
                    model,
                    torch.from_numpy(ids[2]).unsqueeze(0),
                    torch.tensor([0.0]),
                    torch.tensor([1.0]),
                    torch.tensor([0.0]),
                ).shape[-1]
                / 256
            )
        length_scale = args.frames_per_token * len(ids[2]) / max(natural, 1.0)
    model.speaking_rate = 1.0 / length_scale
    rate = int(model.config.sampling_rate)
    print(f"machine: {describe()}; {args.threads} threads")
    print(
        f"model: {args.model_dir or f'scratch:{args.size} (random weights)'}, "
        f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, length scale {length_scale:.2f}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        out = export_voice(model, tokenizer, Path(tmp) / "voice", "kmr")
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = args.threads
        session = onnxruntime.InferenceSession(str(out / "model.onnx"), options, providers=["CPUExecutionProvider"])

        def pytorch() -> float:
            speech = speak_tokens(model, [i.astype(np.int32) for i in ids[:1]], torch.device("cpu"), [120.0])
            total = len(speech.waveforms[0])
            for one in ids[1:]:
                total += len(speak_tokens(model, [one.astype(np.int32)], torch.device("cpu"), [120.0]).waveforms[0])
            return total / rate

        def onnx() -> float:
            total = 0
            for one in ids:
                y = session.run(
                    None,
                    {
                        "x": one[None],
                        "x_length": np.array([len(one)]),
                        "noise_scale": np.array([0.667], np.float32),
                        "length_scale": np.array([length_scale], np.float32),
                        "noise_scale_w": np.array([0.8], np.float32),
                    },
                )[0]
                total += y.shape[-1]
            return total / rate

        rows = [("PyTorch (bounded inference)", pytorch), ("onnxruntime", onnx)]
        try:
            import sherpa_onnx

            vits = sherpa_onnx.OfflineTtsVitsModelConfig(
                model=str(out / "model.onnx"),
                lexicon="",
                tokens=str(out / "tokens.txt"),
                data_dir="",
                length_scale=length_scale,
            )
            tts = sherpa_onnx.OfflineTts(
                sherpa_onnx.OfflineTtsConfig(
                    model=sherpa_onnx.OfflineTtsModelConfig(vits=vits, num_threads=args.threads, provider="cpu")
                )
            )
            generation = sherpa_onnx.GenerationConfig()
            generation.sid, generation.speed, generation.silence_scale = 0, 1.0 / length_scale, 1.0

            def sherpa() -> float:
                return sum(len(tts.generate(s, generation).samples) for s in SENTENCES) / rate

            rows.append(("sherpa-onnx", sherpa))
        except ImportError:
            print("sherpa-onnx not installed: its row is left out")
        with torch.no_grad():
            for name, function in rows:
                compute, audio = timed(function, args.repeats)
                print(f"| {name} | {compute / audio:.3f} | {audio:.1f} s of audio in {compute:.2f} s |", flush=True)


if __name__ == "__main__":
    main()
