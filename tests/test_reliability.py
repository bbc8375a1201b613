"""Faults injected into real runs of train_vits.py on CPU with a tiny model: a stop request in each phase,
a process killed mid-save, an unreadable newest checkpoint, a full disk, a NaN storm, running out of
memory inside the optimizer update. Each says what the user is left with: no run lost, no checkpoint
corrupted, the last good one resumable."""

import errno
import json
import os
import signal
import subprocess

import pytest
import torch
from transformers import VitsModel

import train_vits
from finetune.data import corpus
from finetune.reporting import evaluation
from finetune.training import recovery
from finetune.training import saving
from finetune.training import step
from finetune.training.checkpoint import list_checkpoints, load_checkpoint
from tests import launch
from tests.conftest import clock_for
from tests.test_train import args, losses_by_step, metrics, wait_for_training

COMMON = ["--target_hours", "1", "--max_epochs", "3", "--gradient_accumulation_steps", "2", "--val_every", "3"]


def sigterm_on_call(n: int, real):
    """`real`, except that its n-th call first sends this process a real SIGTERM."""
    calls = {"count": 0}

    def wrapper(*a, **k):
        calls["count"] += 1
        if calls["count"] == n:
            os.kill(os.getpid(), signal.SIGTERM)
        return real(*a, **k)

    return wrapper


def resume(run_dir, fake, *extra) -> int:
    fake.t = 0.0
    return train_vits.main(["--checkpoint_dir", str(run_dir / "checkpoints"), "--resume", "auto", *extra],
                           clock=clock_for(fake))


def final_model_is_finite(run_dir) -> bool:
    model = VitsModel.from_pretrained(str(run_dir / "final_model"))
    return all(torch.isfinite(p).all() for p in model.parameters())


@pytest.fixture(scope="module")
def uninterrupted(prepared_demo, tmp_path_factory):
    """The losses of the run the interrupted ones must reproduce once resumed."""
    from tests.conftest import micro_batches_take

    run_dir = tmp_path_factory.mktemp("whole")
    with pytest.MonkeyPatch.context() as patch:
        fake = micro_batches_take(patch)
        assert train_vits.main(args(prepared_demo, run_dir, *COMMON), clock=clock_for(fake)) == 0
    return losses_by_step(run_dir)


def assert_same_losses(expected: dict, got: dict) -> None:
    assert sorted(expected) == sorted(got) and len(expected) >= 9
    for step_number, values in expected.items():
        for name, value in values.items():
            assert got[step_number][name] == pytest.approx(value, rel=1e-5, abs=1e-7), (step_number, name)


# ---------------------------------------------------------------- a stop request in each phase


def test_sigterm_while_loading_stops_before_training_with_nothing_written(prepared_demo, tmp_path, timed_work,
                                                                          monkeypatch, capsys):
    fake, _ = timed_work
    monkeypatch.setattr(corpus, "load_example", sigterm_on_call(3, corpus.load_example))
    assert train_vits.main(args(prepared_demo, tmp_path, *COMMON), clock=clock_for(fake)) == 143
    assert "before training started: nothing was trained" in capsys.readouterr().err
    assert not list_checkpoints(tmp_path / "checkpoints")
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handlers are given back


def test_sigterm_in_the_baseline_evaluation_saves_the_starting_state(prepared_demo, tmp_path, timed_work, monkeypatch,
                                                                     uninterrupted):
    fake, _ = timed_work
    real = evaluation.Evaluator.score_group
    monkeypatch.setattr(evaluation.Evaluator, "score_group", sigterm_on_call(1, real))
    assert train_vits.main(args(prepared_demo, tmp_path, *COMMON), clock=clock_for(fake)) == 143
    saved = load_checkpoint(tmp_path / "checkpoints" / json.loads(
        (tmp_path / "checkpoints" / "latest_checkpoint.json").read_text())["path"])
    assert saved["state"]["step"] == 0 and saved["plan"] is None
    monkeypatch.setattr(evaluation.Evaluator, "score_group", real)
    assert resume(tmp_path, fake) == 0
    assert_same_losses(uninterrupted, losses_by_step(tmp_path))


def test_sigterm_in_the_benchmark_and_between_evaluation_clips(prepared_demo, tmp_path, timed_work, uninterrupted):
    fake, _ = timed_work

    def at_step_1(loop):
        if loop.state.step == 1:
            os.kill(os.getpid(), signal.SIGTERM)

    assert train_vits.main(args(prepared_demo, tmp_path, *COMMON), clock=clock_for(fake), step_callback=at_step_1) == 143
    assert json.loads((tmp_path / "checkpoints" / "latest_checkpoint.json").read_text())["step"] == 1

    # Resumed: the baseline again (2 clips: no plan was made yet), the benchmark's steps 2-4, the plan; then
    # stopped again inside the evaluation at step 6, between its two clips.
    real = evaluation.Evaluator.score_group
    calls = {"n": 0}

    def count(self, *a, **k):
        calls["n"] += 1
        return real(self, *a, **k)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(evaluation.Evaluator, "score_group", sigterm_on_call(3, count))
        assert resume(tmp_path, fake) == 143
    assert json.loads((tmp_path / "checkpoints" / "latest_checkpoint.json").read_text())["step"] == 6
    assert calls["n"] == 3  # the evaluation's second clip was never scored
    assert resume(tmp_path, fake) == 0
    assert_same_losses(uninterrupted, losses_by_step(tmp_path))


def test_sigterm_mid_window_keeps_the_last_completed_step_and_resumes_identically(prepared_demo, tmp_path, timed_work,
                                                                                  monkeypatch, uninterrupted):
    fake, costs = timed_work
    timed = step.TrainStep.accumulate  # the fake-clock version timed_work installed
    # 5 batches an epoch in windows of 2, 2, 1: micro-batches 1-2 are step 1, 3-4 step 2, 5 step 3, 6-7 step 4.
    # The signal comes in the 6th; the 7th never runs, and step 4 is not taken.
    monkeypatch.setattr(step.TrainStep, "accumulate", sigterm_on_call(6, timed))
    assert train_vits.main(args(prepared_demo, tmp_path, *COMMON), clock=clock_for(fake)) == 143
    latest = json.loads((tmp_path / "checkpoints" / "latest_checkpoint.json").read_text())
    assert latest["step"] == 3
    monkeypatch.setattr(step.TrainStep, "accumulate", timed)
    assert resume(tmp_path, fake) == 0
    assert_same_losses(uninterrupted, losses_by_step(tmp_path))


@pytest.mark.timeout(300)  # the real script in a process of its own
def test_a_second_signal_exits_at_once(prepared_demo, tmp_path):
    """The first SIGTERM asks for a checkpoint, which here hangs (injected); the second ends the process
    there and then, with the same status."""
    process = launch.launch("train_vits", args(prepared_demo, tmp_path, "--target_hours", "1", "--max_epochs", "50"),
                            faults="slow-stop")
    try:
        wait_for_training(process, tmp_path)
        process.send_signal(signal.SIGTERM)
        assert process.wait_for_text("saving slowly"), process.stderr
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 143  # at once, not after the minute-long save
        assert "SIGTERM again: exiting now, without saving" in process.stderr
    finally:
        process.kill()


# ---------------------------------------------------------------- killed while saving


def crash(fault: str, n: int, recipe_args: list[str]) -> subprocess.CompletedProcess:
    return launch.run("train_vits", recipe_args, faults=fault, n=n)


@pytest.mark.timeout(400)  # the real script in a process of its own
def test_killed_while_writing_a_checkpoint_the_previous_one_resumes(prepared_demo, tmp_path, timed_work):
    fake, _ = timed_work
    killed = crash("checkpoint-write", 3, args(prepared_demo, tmp_path, *COMMON))
    assert killed.returncode == -signal.SIGKILL
    run = tmp_path / "checkpoints"
    assert list(run.glob(".checkpoint_epoch_*.tmp"))  # the half-written file, under its temporary name
    for path in list_checkpoints(run):
        assert load_checkpoint(path)["state"]["step"] >= 0  # every checkpoint there is whole
    assert resume(tmp_path, fake) == 0
    assert not list(run.glob(".*.tmp")) and "removed unfinished" in (run / "train.log").read_text()
    assert final_model_is_finite(tmp_path)


@pytest.mark.timeout(400)  # the real script in a process of its own
def test_killed_between_the_renames_of_a_best_model_export_the_previous_one_comes_back(prepared_demo, tmp_path,
                                                                                       timed_work):
    fake, _ = timed_work
    # Every evaluation scores better than the last, so each exports best_model: the baseline's is the
    # first export, step 6's the second, killed after the old folder was set aside and before the new one
    # was moved in.
    killed = crash("improving-scores,export-swap", 2, args(prepared_demo, tmp_path, *COMMON))
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    run = tmp_path / "checkpoints"
    assert not (run / "best_model").exists() and list(run.glob(".best_model.old-*"))
    assert resume(tmp_path, fake) == 0
    assert "restored best_model from an unfinished swap" in (run / "train.log").read_text()
    assert VitsModel.from_pretrained(str(run / "best_model")) is not None


def test_an_unreadable_newest_checkpoint_is_skipped_with_a_warning(prepared_demo, tmp_path, timed_work):
    fake, _ = timed_work
    assert train_vits.main(args(prepared_demo, tmp_path, "--target_hours", "1", "--max_epochs", "2",
                                "--keep_checkpoints", "5"), clock=clock_for(fake)) == 0
    run = tmp_path / "checkpoints"
    newest = run / json.loads((run / "latest_checkpoint.json").read_text())["path"]
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])  # truncated, as by a crash
    assert resume(tmp_path, fake, "--max_epochs", "3") == 0
    log = (run / "train.log").read_text()
    assert f"skipping {newest.name}" in log and "resuming" in log


# ---------------------------------------------------------------- a full disk


def test_a_full_disk_is_reported_and_the_run_goes_on_keeping_the_last_good_checkpoint(prepared_demo, tmp_path,
                                                                                       timed_work, monkeypatch):
    fake, _ = timed_work
    real = saving.save_checkpoint
    calls = {"n": 0}

    def full_disk_on_the_second(*a, **k):
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(*a, **k)

    monkeypatch.setattr(saving, "save_checkpoint", full_disk_on_the_second)
    assert train_vits.main(args(prepared_demo, tmp_path, *COMMON), clock=clock_for(fake)) == 0
    run = tmp_path / "checkpoints"
    assert "disk full in" in (run / "train.log").read_text()
    assert metrics(tmp_path, "end")[0]["save_failures"] == 1
    assert len(list_checkpoints(run)) >= 2 and all(load_checkpoint(p) for p in list_checkpoints(run))


# ---------------------------------------------------------------- training that keeps breaking


@pytest.fixture
def quick_divergence(monkeypatch):
    """Go back after 3 non-finite steps in a row, give up after 2 returns."""
    from finetune.training import loop

    policy = recovery.DivergencePolicy(max_in_row=3, max_rollbacks=2, lr_factor=0.5)
    monkeypatch.setattr(loop, "Divergence", lambda rollbacks=0: recovery.Divergence(policy, rollbacks))


def nan_losses_from(first_call: int, last_call: int, monkeypatch):
    """Micro-batches first_call..last_call report non-finite losses (as if every batch overflowed)."""
    real = step.TrainStep.accumulate
    calls = {"n": 0}

    def accumulate(self, *a, **k):
        calls["n"] += 1
        terms = real(self, *a, **k)
        if first_call <= calls["n"] <= last_call:
            terms = {name: value * float("nan") for name, value in terms.items()}
        return terms

    monkeypatch.setattr(step.TrainStep, "accumulate", accumulate)


def test_a_nan_storm_goes_back_to_the_last_good_state_at_a_lower_learning_rate(prepared_demo, tmp_path, timed_work,
                                                                                monkeypatch, quick_divergence):
    fake, _ = timed_work
    nan_losses_from(8, 12, monkeypatch)  # micro-batches of steps 5, 6 and 7 (windows of 2, 2, 1)
    assert train_vits.main(args(prepared_demo, tmp_path, *COMMON), clock=clock_for(fake)) == 0
    log = (tmp_path / "checkpoints" / "train.log").read_text()
    assert "non-finite loss in 3 steps in a row (step 7): went back to checkpoint checkpoint_epoch_2.pt (step 6)" in log
    end = metrics(tmp_path, "end")[0]
    assert end["rollbacks"] == 1 and end["nonfinite_skips"] == 3 and end["stop_reason"] == "max_epochs"
    assert metrics(tmp_path, "rollback")[0]["lr_scale"] == 0.5
    assert final_model_is_finite(tmp_path)


def test_a_nan_storm_that_persists_stops_with_the_last_good_weights(prepared_demo, tmp_path, timed_work, monkeypatch,
                                                                    quick_divergence):
    fake, _ = timed_work
    nan_losses_from(8, 10**6, monkeypatch)
    assert train_vits.main(args(prepared_demo, tmp_path, "--target_hours", "1", "--max_epochs", "6",
                                "--gradient_accumulation_steps", "2", "--val_every", "3"), clock=clock_for(fake)) == 1
    assert "training keeps failing (non-finite loss) after going back 2 times" in (
        tmp_path / "checkpoints" / "train.log").read_text()
    assert metrics(tmp_path, "end")[0]["stop_reason"] == "diverged"
    assert final_model_is_finite(tmp_path)


def test_out_of_memory_inside_the_optimizer_update_goes_back_to_the_last_good_state(prepared_demo, tmp_path, timed_work,
                                                                                     monkeypatch):
    fake, _ = timed_work
    real = step.TrainStep._step_optimizers
    calls = {"n": 0}

    def out_of_memory_half_way(self, losses, generator=True):
        calls["n"] += 1
        if calls["n"] == 5:
            self.scaler_d.unscale_(self.optimizer_d)
            self.optimizer_d.step()  # the discriminator updated, the generator not: a torn update
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(self, losses, generator)

    monkeypatch.setattr(step.TrainStep, "_step_optimizers", out_of_memory_half_way)
    assert train_vits.main(args(prepared_demo, tmp_path, *COMMON), clock=clock_for(fake)) == 0
    log = (tmp_path / "checkpoints" / "train.log").read_text()
    assert "out of memory inside the optimizer update (the weights may be partly updated) at step 5: went back to " \
           "checkpoint checkpoint_epoch_1.pt (step 3)" in log
    assert metrics(tmp_path, "end")[0]["rollbacks"] == 1


def test_out_of_memory_in_the_first_update_stops_with_what_to_do(prepared_demo, tmp_path, timed_work, monkeypatch):
    fake, _ = timed_work

    def no_room(self, losses, generator=True):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")

    monkeypatch.setattr(step.TrainStep, "_step_optimizers", no_room)
    assert train_vits.main(args(prepared_demo, tmp_path, *COMMON), clock=clock_for(fake)) == 1
    assert "the optimizers' state does not fit in GPU memory" in (tmp_path / "checkpoints" / "train.log").read_text()
