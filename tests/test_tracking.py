"""What a run shows besides its log: TensorBoard events (read back with tensorboard's own reader), the
step profile, and report.html."""

import json
import re

import pytest

import train_vits
from finetune.system.profile import PHASES
from tests.conftest import clock_for
from tests.test_train import args, metrics


@pytest.fixture(scope="module")
def tracked_run(prepared_demo, tmp_path_factory):
    from tests.conftest import micro_batches_take

    run_dir = tmp_path_factory.mktemp("tracked")
    with pytest.MonkeyPatch.context() as patch:
        fake = micro_batches_take(patch)
        code = train_vits.main(
            args(
                prepared_demo,
                run_dir,
                "--target_hours",
                "1",
                "--max_epochs",
                "2",
                "--val_every",
                "3",
                "--report_to",
                "tensorboard",
            ),
            clock=clock_for(fake),
        )
    assert code == 0
    return run_dir


def test_tensorboard_holds_the_scalars_audio_and_images(tracked_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(
        str(tracked_run / "checkpoints" / "tensorboard"), size_guidance={"scalars": 0, "audio": 0, "images": 0}
    )
    events.Reload()
    tags = events.Tags()
    for tag in (
        "train/loss/mel",
        "train/loss/kl",
        "train/loss/duration",
        "train/loss/discriminator",
        "train/lr",
        "train/discriminator_lr",
        "train/grad_norm_generator",
        "train/samples_per_s",
        "eval/mcd_db",
        "eval/length_ratio",
        "eval/duration_error",
        "eval/val_mel",
        "profile/generator_backward",
    ):
        assert tag in tags["scalars"], tag
    steps = [event.step for event in events.Scalars("train/loss/mel")]
    assert steps == list(range(1, len(steps) + 1)) and len(steps) == 10  # every step of 2 epochs of 5 batches
    evaluated = [r["step"] for r in metrics(tracked_run, "eval")]
    assert [e.step for e in events.Scalars("eval/mcd_db")] == evaluated and len(evaluated) >= 3
    assert "samples/sentence_01" in tags["audio"]
    assert events.Audio("samples/sentence_01")[0].sample_rate == 16000
    assert "eval/mel_synthesised_vs_recorded" in tags["images"]
    from finetune.reporting.naturalness import available

    assert "eval/naturalness" not in tags["scalars"] or available()  # off by default on a CPU
    assert "eval/draw_spread" in tags["scalars"]


def test_the_step_profile_accounts_for_the_step_time(tracked_run):
    end = metrics(tracked_run, "end")[0]
    assert set(end["profile_shares"]) == set(PHASES)
    assert sum(end["profile_shares"].values()) == pytest.approx(1.0, abs=1e-3)
    assert all(end["profile_s"][phase] > 0 for phase in PHASES), end["profile_s"]
    log = (tracked_run / "checkpoints" / "train.log").read_text()
    assert re.search(r"time: steps \d+s \(data [\d.]+%, generator forward [\d.]+%, alignment", log)


def test_the_run_report_shows_the_plots_the_scores_and_the_samples(tracked_run):
    run = tracked_run / "checkpoints"
    page = (run / "report.html").read_text(encoding="utf-8")
    images = re.findall(r'<img src="([^"]+)"', page)
    assert {
        "report/losses.png",
        "report/mcd.png",
        "report/timing.png",
        "report/budget.png",
        "report/learning_rate.png",
        "report/profile.png",
        "report/mel_latest.png",
    } <= set(images)
    from finetune.reporting.naturalness import available

    assert "report/naturalness.png" not in images or available()
    for image in images:
        assert (run / image).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    players = re.findall(r'<audio controls src="([^"]+)"', page)
    assert players and all((run / player).is_file() for player in players)
    best = json.loads((run / "best_model" / "eval.json").read_text()) if (run / "best_model").exists() else None
    assert ("held-out clip" in page) == (best is not None)
    end = metrics(tracked_run, "end")[0]
    assert f"Finished (max_epochs): {end['steps']} steps" in page and "<td>nonfinite skips</td><td>0</td>" in page


def test_a_tracker_that_is_not_installed_is_refused_with_what_to_install(prepared_demo, tmp_path, monkeypatch, capsys):
    from finetune.reporting import tracking

    monkeypatch.setattr(tracking, "installed", lambda package: package != "wandb")
    with pytest.raises(SystemExit):
        train_vits.main(args(prepared_demo, tmp_path, "--report_to", "wandb"))
    assert "--report_to wandb: the wandb package is not installed (pip install wandb)" in capsys.readouterr().err


def test_report_is_redrawn_after_an_evaluation_at_most_once_a_minute_and_always_at_the_end(tmp_path, monkeypatch):
    """Evaluations closer together than REPORT_EVERY_S leave report.html as it was (its figures cost CPU);
    the latest evaluation's mel picture waits for the next drawing; the end always draws both."""
    import logging

    import numpy as np
    import torch

    from finetune.reporting import run_log, run_report
    from finetune.reporting.evaluation import EvalResult
    from finetune.reporting.logs import Metrics
    from finetune.reporting.tracking import Tracker
    from finetune.system.profile import StepProfile

    now = {"t": 1000.0}
    monkeypatch.setattr(run_log.time, "monotonic", lambda: now["t"])
    drawn = []
    real_write = run_report.write_report
    monkeypatch.setattr(run_report, "write_report", lambda *a, **k: (drawn.append(now["t"]), real_write(*a, **k)))
    log = run_log.RunLog(
        logging.getLogger("test"),
        Metrics(tmp_path / "metrics.jsonl"),
        Tracker(),
        StepProfile(torch.device("cpu")),
        tmp_path,
        torch.device("cpu"),
    )
    mels = ("clip", np.zeros((80, 20), np.float32), np.ones((80, 20), np.float32))

    def evaluate(step: int, after_s: float) -> None:
        now["t"] += after_s
        log.evaluation(EvalResult(step, 10.0, {}, {}, 1.0), "MCD 10", False, "", 10.0, mels)

    evaluate(0, 0.0)  # the first: drawn
    evaluate(5, 30.0)  # 30 s later: not yet
    assert drawn == [1000.0] and (tmp_path / "report.html").is_file()
    picture = tmp_path / "report" / "mel_latest.png"
    first_picture = picture.read_bytes()
    evaluate(10, 31.0)  # 61 s after the first: drawn, with this evaluation's picture
    assert drawn == [1000.0, 1061.0] and picture.read_bytes() != first_picture
    evaluate(15, 1.0)
    log.end({"steps": 15})
    assert drawn == [1000.0, 1061.0, 1062.0]
