#!/usr/bin/env python3
"""How noisy is the evaluation's timing, and what does noise_scale_duration do to it? For one model on
the held-out clips of a prepared corpus:

  1. the spread of the median length ratio between evaluations that differ only in their noise draw:
     one draw per clip (the evaluation before: what one synthesis asked for) against the mean of 8
     draws per clip (the evaluation now), over --repeats seeds;
  2. the median expected length ratio (32 draws) at noise_scale_duration 0, 0.5, 0.8 (MMS's default)
     and 1.0: how much a narrower draw shortens speech (frames are ceil(exp(log-duration)), and
     E[exp(x)] > exp(E[x]) the more, the wider x is);
  3. what an evaluation of those clips costs (CPU seconds, one thread): one draw, 8 draws, and 8 draws
     with the naturalness predictor (when its extra is installed).

    .venv/bin/python bench/bench_timing.py --model VOICE --data_dir DATA
    .venv/bin/python bench/bench_timing.py --smoke        # seconds: an untrained tiny voice, 2 demo clips

Only the text encoder and the duration predictor run (no flow, no decoder), as in evaluation.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from bench.machine import describe  # noqa: E402
from finetune.reporting.evaluation import DURATION_DRAWS  # noqa: E402
from finetune.vits.inference import duration_draws  # noqa: E402

NOISE_SCALES = (0.0, 0.5, 0.8, 1.0)


def medians(model, tokens: list[np.ndarray], frames: np.ndarray, seed: int, draws: int) -> tuple[float, float]:
    """(median over clips of the first draw's ratio, median over clips of the mean of `draws` draws)."""
    lengths = np.stack([duration_draws(model, [t], torch.device("cpu"), seed + i, draws)[0] for i, t in enumerate(tokens)])
    ratios = lengths / frames[:, None]  # [clips, draws]
    return float(np.median(ratios[:, 0])), float(np.median(ratios.mean(axis=1)))


def spread(model, tokens, frames, repeats: int) -> dict[str, list[float]]:
    rows = [medians(model, tokens, frames, 1000 * r, DURATION_DRAWS) for r in range(repeats)]
    return {"one draw": [r[0] for r in rows], f"mean of {DURATION_DRAWS} draws": [r[1] for r in rows]}


def by_noise_scale(model, tokens, frames) -> dict[float, float]:
    saved, result = model.noise_scale_duration, {}
    for scale in NOISE_SCALES:
        model.noise_scale_duration = scale
        result[scale] = medians(model, tokens, frames, 7, 32)[1]
    model.noise_scale_duration = saved
    return result


def report(model, tokens, frames, repeats: int) -> None:
    model.eval()
    print(f"clips: {len(tokens)}; model noise_scale_duration {model.noise_scale_duration}")
    print("\n| estimate | median length ratio per repeat | mean | std | range |\n| --- | --- | ---: | ---: | ---: |")
    for name, values in spread(model, tokens, frames, repeats).items():
        v = np.array(values)
        print(f"| {name} | {', '.join(f'{x:.3f}' for x in v)} | {v.mean():.3f} | {v.std():.3f} | {v.max() - v.min():.3f} |")
    print("\n| noise_scale_duration | median expected length ratio (32 draws) |\n| ---: | ---: |")
    for scale, ratio in by_noise_scale(model, tokens, frames).items():
        print(f"| {scale} | {ratio:.3f} |")


def evaluation_cost(model, examples) -> None:
    import time

    from finetune.data.features import FeatureConfig, Features
    from finetune.reporting.evaluation import Evaluator
    from finetune.reporting.naturalness import Naturalness, available

    cases = [("warm-up (not counted)", 1, False), ("1 draw", 1, False), (f"{DURATION_DRAWS} draws", DURATION_DRAWS, False)]
    cases += [(f"{DURATION_DRAWS} draws + naturalness (DNSMOS OVRL)", DURATION_DRAWS, True)] if available() else []
    print(f"\n| evaluation of {len(examples)} clips | CPU s | wall s |\n| --- | ---: | ---: |")
    for label, draws, natural in cases:
        evaluator = Evaluator(examples, Features(FeatureConfig()), torch.device("cpu"), 16000, None, [], batch_size=1,
                              duration_draws=draws, naturalness=Naturalness() if natural else None)
        cpu, wall = time.process_time(), time.monotonic()
        evaluator.evaluate(model, 0)
        print(f"| {label} | {time.process_time() - cpu:.2f} | {time.monotonic() - wall:.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a model folder (VitsModel.from_pretrained)")
    parser.add_argument("--data_dir", help="prepared corpus: its metadata_val.csv clips are used")
    parser.add_argument("--clips", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=6, help="evaluations (seeds) compared")
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
        frames = np.array([sf.info(str(corpus / "wavs" / f"{item}.mp3")).duration * 16000 / 256 for item, _ in rows])
        report(voice.model, [tokenize(voice.tokenizer, t) for t in texts], frames, 2)
        return
    if not args.model or not args.data_dir:
        parser.error("--model and --data_dir are needed (or --smoke)")
    from transformers import VitsModel, VitsTokenizer

    from finetune.data.corpus import load_examples

    model, tokenizer = VitsModel.from_pretrained(args.model), VitsTokenizer.from_pretrained(args.model)
    examples, _ = load_examples(Path(args.data_dir), "metadata_val.csv", tokenizer, 256, 16000)
    examples = examples[: args.clips]
    report(model, [e.token_ids for e in examples], np.array([e.frame_count(256) for e in examples], dtype=float),
           args.repeats)
    evaluation_cost(model, examples[:8])


if __name__ == "__main__":
    main()
