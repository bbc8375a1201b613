#!/usr/bin/env python3
"""Bounded synthesis: how long an evaluation takes, and how much RAM, when the duration predictor has run
away, against a healthy model; and what stock transformers does with the same runaway model.

Each case runs in a process of its own, forked from bench/launcher.py's server (torch and transformers
imported once, not per case; their pages are in the case's RSS from its start): the table gives its peak RSS
and how far it grew above its RSS at the start. An Evaluator scores the demo corpus's
held-out clips with a model whose duration predictor is blown up to ask for about e^K frames per token
(K = --blow_up), or left alone. `stock` renders one held-out sentence with `VitsModel.forward` under a
memory ceiling (--stock_limit_gib, RLIMIT_AS) and a time limit, and reports how far it got.

    .venv/bin/python bench/bench_synthesis.py --size tiny --size mms
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import tempfile
import time
from pathlib import Path

from bench.demo_data import prepare_demo
from bench.launcher import run_script
from bench.machine import describe

EVALUATION_TIMEOUT_S = 900.0  # a bounded evaluation still running after this is a finding, reported as killed


def build(size: str, data_dir: Path, blow_up: float):
    import torch

    from finetune.data.corpus import load_examples
    from finetune.training.assembly import corpus_texts
    from finetune.vits.generator import scratch_generator

    torch.manual_seed(0)
    loaded = scratch_generator(size, sorted(set("".join(corpus_texts(data_dir)))), 16000)
    model = loaded.model.eval()
    if blow_up:
        with torch.no_grad():  # the elementwise affine is the last flow inference applies: it shifts log-durations
            model.duration_predictor.flows[0].translate[0] = -blow_up
    examples, _ = load_examples(data_dir, "metadata_val.csv", loaded.tokenizer, 256, 16000)
    return model, examples


def case_evaluate(size: str, data_dir: Path, blow_up: float) -> dict:
    import torch

    from finetune.data.features import FeatureConfig, Features
    from finetune.reporting.evaluation import Evaluator

    model, examples = build(size, data_dir, blow_up)
    evaluator = Evaluator(examples, Features(FeatureConfig()), torch.device("cpu"), 16000, batch_size=1)
    started = time.perf_counter()
    result = evaluator.evaluate(model, 0)
    return {
        "seconds": time.perf_counter() - started,
        "clips": len(examples),
        "mcd_db": result.mcd_db,
        "median_length_ratio": result.length_ratio,
        "capped": sum(s.capped for s in result.per_clip.values()),
    }


def case_stock(size: str, data_dir: Path, blow_up: float, limit_gib: float) -> dict:
    import numpy as np
    import torch

    model, examples = build(size, data_dir, blow_up)
    ids = torch.from_numpy(examples[0].token_ids.astype(np.int64)).unsqueeze(0)
    resource.setrlimit(resource.RLIMIT_AS, (int(limit_gib * 2**30), int(limit_gib * 2**30)))
    started = time.perf_counter()
    try:
        with torch.no_grad():
            out = model(input_ids=ids)
        outcome = f"rendered {out.waveform.shape[-1] / 16000:.0f} s of audio"
    except (MemoryError, RuntimeError) as error:
        outcome = f"failed: {type(error).__name__}: {str(error).splitlines()[0][:80]}"
    return {"seconds": time.perf_counter() - started, "outcome": outcome, "recording_s": len(examples[0].audio) / 16000}


def rss_gib() -> float:
    """This process's resident set now (Linux)."""
    with open("/proc/self/statm", encoding="ascii") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30


def run_case(args: list[str], timeout_s: float, log: Path) -> dict:
    """One case in a process of its own; its result (the last line it printed)."""
    started = time.perf_counter()
    code = run_script(Path(__file__), ["--case", *args], log, timeout_s=timeout_s)
    if code is None:
        return {"seconds": time.perf_counter() - started, "outcome": f"still running after {timeout_s:.0f} s: killed"}
    lines = log.read_text(encoding="utf-8", errors="replace").strip().splitlines()
    if code != 0:
        return {"outcome": f"exit {code}: {(lines or ['(no output)'])[-1][:100]}"}
    return json.loads(lines[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", action="append", choices=["tiny", "small", "mms"])
    parser.add_argument("--blow_up", type=float, default=12.0, help="log-duration shift: e^K frames per token")
    parser.add_argument("--stock_limit_gib", type=float, default=8.0)
    parser.add_argument(
        "--stock_timeout_s", type=float, default=300.0, help="the stock case is killed after this many seconds"
    )
    parser.add_argument(
        "--max_samples", type=int, default=0, help="demo clips prepared (0: all; a few for a smoke run)"
    )
    parser.add_argument("--case", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        kind, size, data_dir, blow_up = args.case[0], args.case[1], Path(args.case[2]), float(args.case[3])
        import torch  # noqa: F401  (what every case imports, in its RSS at the start: the growth is the case's)

        import finetune.reporting.evaluation  # noqa: F401
        import finetune.training.assembly  # noqa: F401

        at_start = rss_gib()
        result = (
            case_evaluate(size, data_dir, blow_up)
            if kind == "evaluate"
            else case_stock(size, data_dir, blow_up, args.stock_limit_gib)
        )
        result["peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        result["grew_gib"] = result["peak_rss_gib"] - at_start
        print(json.dumps(result))
        return
    print(f"machine: {describe()}")
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = prepare_demo(Path(tmp) / "data", val_fraction=0.02, max_samples=args.max_samples)
        for size in args.size or ["tiny"]:
            for label, kind, blow_up in (
                ("healthy model, evaluation", "evaluate", 0.0),
                (f"runaway predictor (e^{args.blow_up:g} frames a token), evaluation", "evaluate", args.blow_up),
                ("runaway predictor, stock VitsModel.forward, one clip", "stock", args.blow_up),
            ):
                log = Path(tmp) / f"{size}_{kind}_{blow_up:g}.log"
                timeout_s = args.stock_timeout_s if kind == "stock" else EVALUATION_TIMEOUT_S
                result = run_case([kind, size, str(data_dir), str(blow_up)], timeout_s, log)
                print(
                    f"{size:5s} | {label:62s} | "
                    + ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in result.items()),
                    flush=True,
                )


if __name__ == "__main__":
    main()
