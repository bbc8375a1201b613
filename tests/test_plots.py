"""Every label of the report's figures stays inside the picture. The figures are laid out with fixed margins
(finetune/reporting/plots.py: measuring each label cost a third of each figure), so a label longer than the
margins allow would be cut at an edge: drawn here at the extremes a run can reach, no edge holds ink."""

from __future__ import annotations

import base64
import io

import numpy as np
from PIL import Image

from finetune.reporting import plots, run_report
from finetune.reporting.prepare_page import MEASURES, histogram
from finetune.reporting.run_report import LOSS_TERMS
from finetune.system.profile import PHASES


def edges_with_ink(png: bytes, frame: int = 2) -> list[str]:
    """The sides of the picture whose outer `frame` pixels are not all background (white)."""
    pixels = np.asarray(Image.open(io.BytesIO(png)).convert("L"))
    sides = {"left": pixels[:, :frame], "right": pixels[:, -frame:], "top": pixels[:frame], "bottom": pixels[-frame:]}
    return [side for side, strip in sides.items() if strip.min() < 250]


def extreme_run() -> list[dict]:
    """metrics.jsonl's records of a long fp16 run at the edges of what a run can log: six-digit steps, loss
    terms from 1e-3 to 1e5, MMS's learning rate decaying to 1e-7, a day's budget in seconds."""
    steps = list(range(0, 120_001, 4_000))
    records = [
        {
            "kind": "train",
            "step": step,
            **{term: float(v) * (i + 1) for i, term in enumerate(LOSS_TERMS)},
            "lr": 2e-5 * (1 - step / 120_000) + 1e-7,
            "loss_scale_generator": 2.0 ** (16 - (step // 20_000)),
            "loss_scale_discriminator": 65536.0,
            "fp16_overflow_skips": step // 20_000,
            "time_used_s": 86_400 * step / 120_000,
        }
        for step, v in zip(steps, np.geomspace(1e5, 1e-3, len(steps)))
    ]
    records += [
        {
            "kind": "eval",
            "step": step,
            "mcd_db": 12.0 - step / 20_000,
            "mcd_se_db": 0.2,
            "length_ratio": 0.6 + step / 200_000,
            "draw_spread": 1.1,
            "duration_error": 0.7,
            "naturalness": 2.5,
        }
        for step in steps[::3]
    ]
    plan = {"steps_done": 0, "total_steps": 120_000, "time_used_s": 60.0, "step_s": 0.7, "budget_target_s": 86_400.0}
    shares = {phase: 1 / len(PHASES) for phase in PHASES}
    return [*records, {"kind": "plan", **plan}, {"kind": "end", "profile_shares": shares}]


def test_the_run_report_at_the_extremes_of_a_run_keeps_its_labels_inside(tmp_path):
    made = run_report.draw(tmp_path, extreme_run(), max_length_ratio=1.25)
    assert len(made) == 8  # losses, learning rate, loss scale, MCD, timing, naturalness, budget, profile
    for name, _ in made:
        assert edges_with_ink((tmp_path / "report" / name).read_bytes()) == [], name


def test_the_mel_pair_and_the_preparation_histograms_keep_their_labels_inside():
    rng = np.random.default_rng(0)
    rgb = plots.mel_comparison_rgb(rng.normal(size=(80, 900)), rng.normal(size=(80, 1000)), "step 120000, kmr_1234567")
    buffer = io.BytesIO()
    Image.fromarray(rgb).save(buffer, format="PNG")
    assert edges_with_ink(buffer.getvalue()) == []

    for title in MEASURES.values():  # counts up to 100,000 clips on the y axis
        png = base64.b64decode(histogram(list(rng.normal(20, 5, size=100_000)), title))
        assert edges_with_ink(png) == [], title


def test_a_label_cut_at_the_edge_is_seen(tmp_path):
    """The check itself: a tick label wider than the margin reaches the left edge."""
    pyplot, figure = plots._figure()
    axis = figure.add_subplot(1, 1, 1)
    axis.set_yticks([0, 1], ["a label far too long for any margin", "b"])
    assert "left" in edges_with_ink(plots._save(pyplot, figure, tmp_path / "cut.png"))
