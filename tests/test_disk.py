"""A full disk, for real: a small tmpfs mounted for the test (root only; skipped with the reason where
mounting is not allowed). The exceptions are the ones torch, safetensors, soundfile and plain writes
really raise there; nothing is mocked. Each write the run does is tried on it: checkpoints, the best and
final models, metrics.jsonl, train.log, samples, TensorBoard; then whole runs of train_vits.py."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

import train_vits
from finetune.system.atomic import torch_save_atomic, write_text_atomic
from finetune.system.disk import MB, free_bytes, is_write_failure, looks_full
from finetune.training import saving
from finetune.training.checkpoint_file import list_checkpoints, load_checkpoint
from tests import launch
from tests.conftest import TEST_SIZE, clock_for
from tests.test_train import args, metrics

COMMON = ["--target_hours", "1", "--max_samples", "8", "--max_epochs", "4", "--val_every", "4"]  # 2 steps an epoch


def mount_tmpfs(folder: Path, size_mb: float) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={int(size_mb * 1024)}k", "tmpfs", str(folder)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {done.stderr.strip()}")


@pytest.fixture
def small_disk(tmp_path):
    """mount(size_mb) -> a folder on a fresh tmpfs of that size; unmounted after the test."""
    mounted = []

    def mount(size_mb: float, name: str = "disk") -> Path:
        folder = tmp_path / name
        mount_tmpfs(folder, size_mb)
        mounted.append(folder)
        return folder

    yield mount
    for folder in mounted:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def fill(folder: Path, leave_bytes: int) -> None:
    """Take all the room on folder's disk but `leave_bytes`."""
    take = free_bytes(folder) - leave_bytes
    if take > 0:
        with open(folder / "filler", "ab") as handle:
            handle.write(b"\0" * take)


# ---------------------------------------------------------------- the exceptions, as raised


def raised(write) -> BaseException:
    with pytest.raises(Exception) as info:
        write()
    return info.value


def test_each_library_s_full_disk_error_is_recognised_as_one(small_disk):
    disk = small_disk(2)
    fill(disk, 64 * 1024)
    tensors = {"w": torch.zeros(1_000_000)}
    import soundfile as sf
    from safetensors.torch import save_file

    errors = {
        "torch.save": raised(lambda: torch.save(tensors, disk / "a.pt")),
        "safetensors": raised(lambda: save_file(tensors, str(disk / "a.safetensors"))),
        "soundfile": raised(lambda: sf.write(disk / "a.wav", np.zeros(400_000, np.float32), 16000)),
        "open().write": raised(lambda: (disk / "a.txt").write_bytes(b"x" * 2 * MB)),
    }
    assert type(errors["torch.save"]) is RuntimeError  # not an OSError: the old `except OSError` missed it
    assert type(errors["safetensors"]).__name__ == "SafetensorError"
    assert isinstance(errors["open().write"], OSError)
    for name, error in errors.items():
        assert is_write_failure(error), name
        assert looks_full(error, disk), name
    assert not is_write_failure(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))  # a bug surfaces


def test_a_failed_atomic_write_leaves_the_old_file_and_no_partial_one(small_disk):
    disk = small_disk(4)
    write_text_atomic(disk / "kept.json", "{}\n")
    torch_save_atomic({"w": torch.zeros(10)}, disk / "model.pt")
    fill(disk, 256 * 1024)
    with pytest.raises(RuntimeError):
        torch_save_atomic({"w": torch.zeros(1_000_000)}, disk / "model.pt")
    assert torch.load(disk / "model.pt")["w"].numel() == 10
    assert sorted(p.name for p in disk.iterdir()) == ["filler", "kept.json", "model.pt"]


# ---------------------------------------------------------------- optional writes: said once, no traceback


def test_metrics_and_train_log_on_a_full_disk_drop_lines_without_a_traceback(small_disk, capfd):
    from finetune.reporting.logs import Metrics, setup_logging

    disk = small_disk(1)
    logger = setup_logging(disk, name="finetune")
    recorder = Metrics(disk / "metrics.jsonl")
    recorder.write("first", value=1)
    fill(disk, 0)
    for index in range(3):
        recorder.write("train", padding="x" * 20_000, step=index)
        logger.info("a line " + "y" * 20_000)
    lines = (disk / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["kind"] for line in lines] == ["first"]  # no half line left behind
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Logging error" not in err
    assert err.count("train.log lines not written: disk full in") == 1
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
        handler.close()


def test_tensorboard_on_a_full_disk_is_dropped_with_one_line(small_disk, capfd):
    pytest.importorskip("tensorboard")
    from finetune.reporting.tracking import open_tracker

    disk = small_disk(1)
    tracker = open_tracker(["tensorboard"], disk, {})
    tracker.scalars(0, {"x": 1.0})
    fill(disk, 0)
    for step in range(1, 200):
        tracker.audio(step, "a", np.zeros(16000, np.float32), 16000)
        tracker.scalars(step, {"x": float(step)})
    tracker.close()
    assert not tracker.sinks  # dropped once its files could not be written
    assert "Traceback" not in capfd.readouterr().err


# ---------------------------------------------------------------- whole runs


def fill_after_checkpoint(monkeypatch, n: int, leave_share: float) -> dict:
    """Once the n-th checkpoint is written, fill its disk but `leave_share` of that checkpoint's size."""
    real, seen = saving.save_checkpoint, {"n": 0, "size": 0}

    def save_then_fill(folder, *a, **k):
        path = real(folder, *a, **k)
        seen["n"] += 1
        if seen["n"] == n:
            seen["size"] = path.stat().st_size
            fill(folder.parent, int(leave_share * seen["size"]))
        return path

    monkeypatch.setattr(saving, "save_checkpoint", save_then_fill)
    return seen


def test_a_disk_that_fills_mid_run_keeps_the_checkpoints_and_the_final_save_makes_room(
    prepared_demo, small_disk, timed_work, monkeypatch, capfd
):
    fake, _ = timed_work
    disk = small_disk(80)
    seen = fill_after_checkpoint(monkeypatch, 2, leave_share=0.6)
    code = train_vits.main(args(prepared_demo, disk, *COMMON, "--keep_checkpoints", "3"), clock=clock_for(fake))
    assert code == 0 and seen["n"] >= 2
    run = disk / "checkpoints"
    log = (run / "train.log").read_text()
    # Each checkpoint that did not fit said so in one line, with the figures, and kept what was there.
    assert (
        "error: could not write checkpoint" in log
        and f"disk full in {run}" in log
        and "a checkpoint needs about" in log
    )
    assert "kept checkpoint_epoch_" in log
    # The final save deleted an older checkpoint to make room, never the newest.
    assert "deleted the older checkpoint" in log
    steps = sorted(load_checkpoint(p)["state"]["step"] for p in list_checkpoints(run))
    assert steps and steps[0] > 0
    assert steps[-1] == metrics(disk, "end")[0]["steps"]  # the final checkpoint fitted once room was made
    assert not [p for p in run.iterdir() if p.name.startswith(".")]  # no partial file or folder
    from transformers import VitsModel

    assert VitsModel.from_pretrained(str(disk / "final_model")) is not None
    assert metrics(disk, "end")[0]["save_failures"] >= 1
    assert "Traceback" not in capfd.readouterr().err


def test_a_disk_too_small_for_one_checkpoint_is_refused_before_training(prepared_demo, small_disk):
    disk = small_disk(3)  # the test model's checkpoint is about 4 MB (scratch:micro)
    done = launch.run("train_vits", args(prepared_demo, disk, *COMMON))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert f"disk full in {disk / 'checkpoints'}" in done.stderr and "a checkpoint needs about" in done.stderr
    assert "--checkpoint_dir" in done.stderr and not list_checkpoints(disk / "checkpoints")


def test_a_disk_short_of_the_whole_run_is_a_warning_with_the_figures(prepared_demo, small_disk, timed_work):
    fake, _ = timed_work
    # two checkpoints of about 4 MB fit beside the two models (1.2 MB each); keep_checkpoints + 1 = 4 do not
    disk = small_disk(12)
    code = train_vits.main(args(prepared_demo, disk, *COMMON, "--max_epochs", "1"), clock=clock_for(fake))
    assert code == 0
    log = (disk / "checkpoints" / "train.log").read_text()
    assert "this run writes up to" in log and "4 checkpoints of about" in log and "Lower --keep_checkpoints" in log


# ---------------------------------------------------------------- preparation on a full disk


def test_preparation_on_a_full_disk_stops_keeps_its_clips_and_finishes_once_there_is_room(small_disk):
    """The WAVs go to a disk that fills up half way: the run stops with one line saying so (not a "failed"
    for every clip after, remembered and replayed on every re-run); once room is made, the same command
    finishes, reusing the clips written before and preparing the rest."""
    import prepare_data
    from tests.conftest import DEMO_CORPUS

    disk = small_disk(8)
    data_dir = disk / "data"
    command = [
        "--input_dir",
        str(DEMO_CORPUS),
        "--data_dir",
        str(data_dir),
        "--model_name",
        f"scratch:{TEST_SIZE}",
        "--max_samples",
        "24",
        "--num_workers",
        "1",
    ]
    fill(disk, 300 * 1024)  # room for a few clips (about 40-100 kB each), then none
    from finetune.data.prepare import NotWritten

    with pytest.raises(NotWritten, match="disk full in .*run the same command again"):
        prepare_data.main(command)
    written = len(list((data_dir / "wavs").glob("*.wav")))
    assert 0 < written < 24
    (disk / "filler").unlink()
    assert prepare_data.main(command) == 0
    report = json.loads((data_dir / "prepare_report.json").read_text())
    assert report["counts"]["kept"] == 24 and report["dropped_by_reason"] == {}
    assert report["counts"]["reused"] >= written - 1  # the one being written when the disk filled is redone
