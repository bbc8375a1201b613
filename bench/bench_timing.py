#!/usr/bin/env python3
"""How long does a voice speak its held-out sentences, one request at a time, as an app makes them? For a
model folder and the held-out clips of a prepared corpus:

  1. stock transformers (`VitsModel.forward` on the text, as `pipeline("text-to-speech")` runs it: one
     duration draw a request), each sentence --draws times with other seeds: the median length ratio of
     a request (synthesised / recorded) and the draw spread (each sentence's geometric standard
     deviation between requests, median over sentences), at the folder's config.json settings (fitted by
     the tool unless trained with --inference_settings model) and at the model's own (eval.json's
     inference_settings.model_own; speaking_rate 1, noise_scale_duration 0.8 when it has none);
  2. what the evaluation's estimate says for the same clips: the median of 8 draws of the duration
     predictor alone (finetune/reporting/evaluation.py) and, as judged before issue 28, the mean of them;
  3. the median length of a request at each noise_scale_duration (speaking_rate 1): how much a narrower
     draw shortens speech and steadies it;
  4. with --onnx DIR (export_onnx.py's folder of the same model): sherpa-onnx as its documented snippet
     runs it (nothing set but the files), each sentence --draws times: its median length against the
     stock pipeline's with config.json (what an app on a device hears against what a desktop one does).

    .venv/bin/python bench/bench_timing.py --model demo/work/final_model --data_dir demo/work/data --speaker ciya
    .venv/bin/python bench/bench_timing.py --model M --data_dir D --onnx voice_onnx    # and sherpa-onnx's
    .venv/bin/python bench/bench_timing.py --smoke        # seconds: an untrained tiny voice, 2 demo clips
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from bench.machine import describe
from finetune.reporting.evaluation import DURATION_DRAWS
from finetune.vits.inference import duration_draws
from finetune.vits.tempo_fit import geometric_spread

REPO = Path(__file__).resolve().parent.parent

NOISE_SCALES = (0.0, 0.333, 0.5, 0.667, 0.8, 1.0)


def stock_requests(model, tokens: list[np.ndarray], samples: np.ndarray, draws: int) -> np.ndarray:
    """Length ratios [sentences, draws] of stock VitsModel.forward, one request a seed."""
    ratios = np.zeros((len(tokens), draws))
    for i, ids in enumerate(tokens):
        for d in range(draws):
            torch.manual_seed(1000 * d + i)
            with torch.no_grad():
                out = model(input_ids=torch.from_numpy(ids.astype(np.int64)).unsqueeze(0))
            ratios[i, d] = int(out.sequence_lengths[0]) / samples[i]
    return ratios


def describe_ratios(ratios: np.ndarray) -> str:
    spread = np.median([geometric_spread(r) for r in ratios])
    inside = np.mean((ratios >= 0.9) & (ratios <= 1.1))
    return (
        f"median x{np.median(ratios):.3f}, spread x{spread:.3f} a request; sentences' own medians "
        f"x{np.min(np.median(ratios, axis=1)):.2f}-x{np.max(np.median(ratios, axis=1)):.2f}; "
        f"{100 * inside:.0f}% of requests within 0.9-1.1"
    )


def own_settings(folder: Path | None) -> dict:
    """The model's own inference settings, as the tool's eval.json records them beside the fitted ones."""
    evaluation = folder / "eval.json" if folder else None
    if evaluation and evaluation.is_file():
        fit = json.loads(evaluation.read_text(encoding="utf-8")).get("inference_settings")
        if fit:
            return fit["model_own"]
    return {"speaking_rate": 1.0, "noise_scale_duration": 0.8}


def sherpa_requests(onnx_dir: Path, texts: list[str], samples: np.ndarray, draws: int) -> np.ndarray:
    """Length ratios [sentences, draws] of sherpa-onnx's documented snippet (nothing set but the files)."""
    from finetune.vits.onnx_export import sherpa_run

    speech = sherpa_run(onnx_dir, texts, None, None, repeats=draws)
    return np.array(speech["samples"], dtype=float) / samples[:, None]


def compare_device(
    model, tokens: list[np.ndarray], texts: list[str], samples: np.ndarray, draws: int, onnx_dir: Path
) -> None:
    """sherpa-onnx's default snippet against the stock pipeline at config.json's settings, same sentences."""
    stock = stock_requests(model, tokens, samples, draws)
    device = sherpa_requests(onnx_dir, texts, samples, draws)
    print(f"\n| what speaks ({draws} requests a sentence) | one request |\n| --- | --- |")
    print(f"| stock pipeline, config.json | {describe_ratios(stock)} |")
    print(f"| sherpa-onnx, nothing set ({onnx_dir}) | {describe_ratios(device)} |")
    print(
        f"sherpa-onnx's median request is x{np.median(device) / np.median(stock):.3f} the stock pipeline's "
        f"(per sentence, median of the ratios of their medians x"
        f"{np.median(np.median(device, axis=1) / np.median(stock, axis=1)):.3f})",
        flush=True,
    )


def report(model, tokens: list[np.ndarray], samples: np.ndarray, draws: int, folder: Path | None) -> None:
    model.eval()
    hop = 256
    settings = {
        "config.json": {"speaking_rate": model.speaking_rate, "noise_scale_duration": model.noise_scale_duration},
        "the model's own": own_settings(folder),
    }
    print(f"{len(tokens)} held-out sentences, {draws} requests each (stock VitsModel.forward)\n")
    print("| settings | speaking_rate | noise_scale_duration | one request, stock |\n| --- | ---: | ---: | --- |")
    for name, values in settings.items():
        model.speaking_rate, model.noise_scale_duration = values["speaking_rate"], values["noise_scale_duration"]
        print(
            f"| {name} | {values['speaking_rate']:g} | {values['noise_scale_duration']:g} | "
            f"{describe_ratios(stock_requests(model, tokens, samples, draws))} |",
            flush=True,
        )
    own = settings["the model's own"]
    frames = samples / hop
    estimate = (
        np.stack(
            [
                duration_draws(
                    model,
                    [t],
                    torch.device("cpu"),
                    7 + i,
                    DURATION_DRAWS,
                    speaking_rate=own["speaking_rate"],
                    noise_scale_duration=own["noise_scale_duration"],
                )[0]
                for i, t in enumerate(tokens)
            ]
        )
        / frames[:, None]
    )
    print(
        f"\nThe evaluation's estimate at the model's own settings ({DURATION_DRAWS} draws of the duration predictor a "
        f"clip): median draw x{np.median(estimate):.3f} (judged now); median over clips of the mean of draws "
        f"x{np.median(estimate.mean(axis=1)):.3f} (judged before)"
    )
    print("\n| noise_scale_duration | median request (32 draws, rate 1) | spread |\n| ---: | ---: | ---: |")
    for scale in NOISE_SCALES:
        lengths = duration_draws(
            model, tokens, torch.device("cpu"), 11, 32, noise_scale_duration=scale, speaking_rate=1.0
        )
        ratios = lengths / frames[:, None]
        print(f"| {scale} | {np.median(ratios):.3f} | x{np.median([geometric_spread(r) for r in ratios]):.3f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a model folder (VitsModel.from_pretrained)")
    parser.add_argument("--data_dir", help="prepared corpus: its metadata_val.csv clips are used")
    parser.add_argument("--speaker", default="", help="a crowd's corpus: only this speaker's held-out clips")
    parser.add_argument("--clips", type=int, default=16)
    parser.add_argument("--draws", type=int, default=8, help="requests a sentence (seeds)")
    parser.add_argument("--onnx", default=None, help="export_onnx.py's folder of --model: also sherpa-onnx's length")
    parser.add_argument("--smoke", action="store_true", help="an untrained tiny voice and 2 demo clips")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"machine: {describe()}")
    if args.smoke:
        import soundfile as sf

        from finetune.data.corpus import tokenize
        from finetune.vits.generator import scratch_generator

        corpus = REPO / "demo" / "corpus"
        rows = [line.split("|", 1) for line in (corpus / "metadata.csv").read_text(encoding="utf-8").splitlines()[:2]]
        texts = [text.lower() for _, text in rows]
        torch.manual_seed(0)
        voice = scratch_generator("tiny", sorted(set("".join(texts))), 16000)
        samples = np.array([sf.info(str(corpus / "wavs" / f"{item}.mp3")).duration * 16000 for item, _ in rows])
        tokens = [tokenize(voice.tokenizer, t) for t in texts]
        report(voice.model, tokens, samples, 2, None)
        smoke_device(voice, tokens, texts, samples)
        return
    if not args.model or not args.data_dir:
        parser.error("--model and --data_dir are needed (or --smoke)")
    from transformers import VitsModel, VitsTokenizer

    from finetune.data.corpus import load_examples
    from finetune.data.metadata import read_rows

    data = Path(args.data_dir)
    listing = "metadata_val.csv"
    if args.speaker:
        rows = [(i, t) for i, s, t in read_rows(data / listing) if s == args.speaker]
        if not rows:
            parser.error(f"no held-out clip of {args.speaker} in {data / listing}")
        listing = f"bench_timing_{args.speaker}.csv"
        (data / listing).write_text("".join(f"{i}|{t}\n" for i, t in rows), encoding="utf-8")
    model, tokenizer = VitsModel.from_pretrained(args.model), VitsTokenizer.from_pretrained(args.model)
    examples, _ = load_examples(data, listing, tokenizer, 256, 16000)
    examples = examples[: args.clips]
    samples = np.array([len(e.audio) for e in examples], dtype=float)
    report(model, [e.token_ids for e in examples], samples, args.draws, Path(args.model))
    if args.onnx:
        from finetune.vits.synthesis import load_voice

        texts = dict((i, t) for i, _, t in read_rows(data / listing))
        normalizer = load_voice(args.model, torch.device("cpu")).normalizer
        model = VitsModel.from_pretrained(args.model).eval()  # config.json's settings again (report() changed them)
        compare_device(
            model,
            [e.token_ids for e in examples],
            [normalizer(texts[e.item_id]).text for e in examples],
            samples,
            args.draws,
            Path(args.onnx),
        )


def smoke_device(voice, tokens: list[np.ndarray], texts: list[str], samples: np.ndarray) -> None:
    """The untrained voice exported with a fitted-looking config (speaking_rate 0.8) and heard by sherpa-onnx."""
    import tempfile

    from finetune.reporting.tracking import installed
    from finetune.vits.onnx_export import export_voice

    if not installed("sherpa_onnx"):
        print("sherpa-onnx is not installed: its comparison is not made")
        return
    voice.model.speaking_rate = 0.8
    with tempfile.TemporaryDirectory() as folder:
        export_voice(voice.model.eval(), voice.tokenizer, Path(folder) / "onnx", "kmr")
        compare_device(voice.model, tokens, texts, samples, 2, Path(folder) / "onnx")


if __name__ == "__main__":
    main()
