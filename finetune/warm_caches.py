"""Pay once, when the environment is set up, what a fresh environment's first run would otherwise pay inside
its budget: the numba functions a run compiles on first use (librosa's DTW of the evaluation measure, the
monotonic alignment search of every training step) and matplotlib's font cache (report.html's plots).

numba writes what it compiles into a cache beside the package (`cache=True`), and matplotlib its font list
into its config folder, so every later process loads them in a second or two. Paid inside the first run
instead, they were "evaluation's one-time costs paid in 32.1s" of a 180 s budget on a 2-core machine: 59 steps
where a second run made more. `make setup` (and so `make demo` and `make test`) runs this once:

    python -m finetune.warm_caches
"""

from __future__ import annotations

import time

import numpy as np
import torch


def warm() -> dict[str, float]:
    """Compile (or load from the cache) what a run uses first; seconds each took."""
    import matplotlib

    matplotlib.use("Agg")
    timings = {}
    started = time.monotonic()
    from finetune.reporting.measures import mcd_dtw

    rng = np.random.default_rng(0)
    mcd_dtw(rng.standard_normal((80, 40)), rng.standard_normal((80, 50)))  # librosa.sequence.dtw's numba core
    timings["dtw"] = time.monotonic() - started

    started = time.monotonic()
    from finetune.vits.alignment import maximum_path

    maximum_path(torch.zeros(1, 6, 3), torch.tensor([6]), torch.tensor([3]))
    timings["alignment"] = time.monotonic() - started

    started = time.monotonic()
    import matplotlib.pyplot as plt

    plt.figure()
    plt.close("all")
    timings["matplotlib"] = time.monotonic() - started
    return timings


if __name__ == "__main__":
    took = warm()
    print("caches warmed: " + ", ".join(f"{name} {seconds:.1f}s" for name, seconds in took.items()))
