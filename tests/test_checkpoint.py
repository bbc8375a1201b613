"""Checkpoint helpers: random state, rotation, the latest pointer, resume resolution, compatibility."""

import random
import time

import numpy as np
import pytest
import torch

from finetune.data.corpus import MemoryEstimate, decide_precompute
from finetune.data.metadata import CorpusError
from finetune.training.checkpoint_file import (
    CheckpointError,
    capture_rng,
    check_same_data,
    cuda_state_for,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    resolve_resume,
    restore_rng,
    resumed_settings,
    save_checkpoint,
)


def test_random_state_round_trips_and_loads_with_weights_only(tmp_path):
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    torch.save(capture_rng(), tmp_path / "rng.pt")
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    restore_rng(torch.load(tmp_path / "rng.pt", weights_only=True))
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected


def test_a_checkpoint_with_two_devices_random_state_resumes_on_one():
    """Checkpoints written before kept every visible GPU's generator; a machine with one GPU takes the entry
    of its device (index 0) instead of failing on the second; this tool's own checkpoints keep one state."""
    two_devices = [torch.tensor([1], dtype=torch.uint8), torch.tensor([2], dtype=torch.uint8)]
    assert torch.equal(cuda_state_for(two_devices, 0), two_devices[0])
    assert torch.equal(cuda_state_for(two_devices, 1), two_devices[1])
    assert torch.equal(cuda_state_for(two_devices[:1], 3), two_devices[0])  # cuda:3 now, one saved: the first
    assert torch.equal(cuda_state_for(two_devices[1], 0), two_devices[1])  # one state: onto this device
    assert cuda_state_for(None, 0) is None and cuda_state_for([], 0) is None
    saved = capture_rng()
    saved["cuda"] = two_devices  # as an older checkpoint holds it, read on this (CPU) machine: no error
    restore_rng(saved)


def payload(step):
    return {"state": {"step": step, "epoch": 0}, "weights": torch.zeros(2), "config": {"batch_size": 8}}


def test_keeps_the_newest_and_points_at_the_latest(tmp_path):
    for step in range(1, 6):
        save_checkpoint(tmp_path, f"checkpoint_epoch_1_step_{step}.pt", payload(step), keep=2)
        time.sleep(0.01)
    assert sorted(p.name for p in list_checkpoints(tmp_path)) == [
        "checkpoint_epoch_1_step_4.pt",
        "checkpoint_epoch_1_step_5.pt",
    ]
    assert latest_checkpoint(tmp_path).name == "checkpoint_epoch_1_step_5.pt"
    assert load_checkpoint(latest_checkpoint(tmp_path))["state"]["step"] == 5
    assert not list(tmp_path.glob("*.tmp"))


def test_resume_resolution(tmp_path):
    assert resolve_resume("none", tmp_path) == (None, None)
    assert resolve_resume("auto", tmp_path / "empty") == (None, None)  # auto tolerates nothing to resume
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        resolve_resume(str(tmp_path / "missing.pt"), tmp_path)  # a named checkpoint must exist


def test_a_damaged_checkpoint_is_an_error_naming_the_way_out(tmp_path):
    (tmp_path / "checkpoint_epoch_1.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="--resume PATH"):
        load_checkpoint(tmp_path / "checkpoint_epoch_1.pt")


def test_a_resumed_run_keeps_its_settings_and_refuses_changes_to_them():
    saved = {"batch_size": 8, "learning_rate": 2e-3, "target_hours": 1.0, "resume": "none", "device": "auto"}
    current = {"batch_size": 8, "learning_rate": 2e-5, "target_hours": 2.0, "resume": "auto", "device": "auto"}
    merged, changed = resumed_settings(
        saved, current, {"resume", "target_hours"}, ("target_hours", "device"), ("resume",)
    )
    assert merged == {"batch_size": 8, "learning_rate": 2e-3, "target_hours": 2.0, "resume": "auto", "device": "auto"}
    assert changed == ["target_hours"]
    merged, _ = resumed_settings(saved, current, {"resume"}, ("target_hours",), ("resume",))
    assert merged["target_hours"] == 1.0  # not given: the same budget
    with pytest.raises(
        CheckpointError, match="--learning_rate was 0.002 in the checkpoint, now 2e-05.*Leave those flags out"
    ):
        resumed_settings(saved, current, {"resume", "learning_rate"}, ("target_hours",), ("resume",))


def test_resuming_on_other_data_is_refused():
    saved = {"config": {}, "data_fingerprint": "abc"}
    check_same_data(saved, "abc")
    with pytest.raises(CheckpointError, match="training clips"):
        check_same_data(saved, "xyz")


def test_memory_check_falls_back_then_refuses_with_a_way_out():
    gib = 2**30
    fits = MemoryEstimate(clips=1000, audio_bytes=gib, feature_bytes=2 * gib, available_bytes=10 * gib)
    assert decide_precompute(fits, True)[0] is True
    tight = MemoryEstimate(clips=1000, audio_bytes=gib, feature_bytes=8 * gib, available_bytes=4 * gib)
    precompute, note = decide_precompute(tight, True)
    assert precompute is False and "on the device per batch instead" in note
    short = MemoryEstimate(clips=1000, audio_bytes=8 * gib, feature_bytes=0, available_bytes=4 * gib)
    with pytest.raises(CorpusError, match="--max_samples 39"):
        decide_precompute(short, True)
