"""Faults injected into real runs of train_vits.py on CPU with a tiny model: a stop request in each phase,
a process killed mid-save, an unreadable newest checkpoint, a full disk, a NaN storm, running out of
memory inside the optimizer update. Each says what the user is left with: no run lost, no checkpoint
corrupted, the last good one resumable."""

import json
import os
import re
import signal
import subprocess

import pytest
import torch
from transformers import VitsModel

import train_vits
from finetune.data import corpus
from finetune.reporting import evaluation
from finetune.training import finishing, recovery, step
from finetune.training.checkpoint_file import list_checkpoints, load_checkpoint
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
    return train_vits.main(
        ["--checkpoint_dir", str(run_dir / "checkpoints"), "--resume", "auto", *extra], clock=clock_for(fake)
    )


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


def test_sigterm_while_loading_stops_before_training_with_nothing_written(
    prepared_demo, tmp_path, timed_work, monkeypatch, capsys
):
    fake, _ = timed_work
    monkeypatch.setattr(corpus, "load_example", sigterm_on_call(3, corpus.load_example))
    assert train_vits.main(args(prepared_demo, tmp_path, *COMMON), clock=clock_for(fake)) == 143
    assert "before training started: nothing was trained" in capsys.readouterr().err
    assert not list_checkpoints(tmp_path / "checkpoints")
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handlers are given back


def test_sigterm_in_the_baseline_evaluation_saves_the_starting_state(
    prepared_demo, tmp_path, timed_work, monkeypatch, uninterrupted
):
    fake, _ = timed_work
    real = evaluation.Evaluator.score_group
    monkeypatch.setattr(evaluation.Evaluator, "score_group", sigterm_on_call(1, real))
    assert train_vits.main(args(prepared_demo, tmp_path, *COMMON), clock=clock_for(fake)) == 143
    saved = load_checkpoint(
        tmp_path / "checkpoints" / json.loads((tmp_path / "checkpoints" / "latest_checkpoint.json").read_text())["path"]
    )
    assert saved["state"]["step"] == 0 and saved["plan"] is None
    monkeypatch.setattr(evaluation.Evaluator, "score_group", real)
    assert resume(tmp_path, fake) == 0
    assert_same_losses(uninterrupted, losses_by_step(tmp_path))


def test_sigterm_in_the_benchmark_and_between_evaluation_clips(prepared_demo, tmp_path, timed_work, uninterrupted):
    fake, _ = timed_work

    def at_step_1(loop):
        if loop.state.step == 1:
            os.kill(os.getpid(), signal.SIGTERM)

    assert (
        train_vits.main(args(prepared_demo, tmp_path, *COMMON), clock=clock_for(fake), step_callback=at_step_1) == 143
    )
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


def test_sigterm_mid_window_keeps_the_last_completed_step_and_resumes_identically(
    prepared_demo, tmp_path, timed_work, monkeypatch, uninterrupted
):
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


@pytest.mark.timeout(600)  # the real script in a process of its own
def test_a_second_signal_exits_at_once(prepared_demo, tmp_path):
    """The first SIGTERM asks for a checkpoint, which here hangs (injected); the second ends the process
    there and then, with the same status."""
    process = launch.launch(
        "train_vits", args(prepared_demo, tmp_path, "--target_hours", "1", "--max_epochs", "50"), faults="slow-stop"
    )
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
    killed = crash("checkpoint-write", 2, args(prepared_demo, tmp_path, *COMMON, "--max_epochs", "2"))  # the 2nd write
    assert killed.returncode == -signal.SIGKILL
    run = tmp_path / "checkpoints"
    assert list(run.glob(".checkpoint_epoch_*.tmp"))  # the half-written file, under its temporary name
    for path in list_checkpoints(run):
        assert load_checkpoint(path)["state"]["step"] >= 0  # every checkpoint there is whole
    assert resume(tmp_path, fake) == 0
    assert not list(run.glob(".*.tmp")) and "removed unfinished" in (run / "train.log").read_text()
    assert final_model_is_finite(tmp_path)


@pytest.mark.timeout(400)  # the real script in a process of its own
def test_killed_between_the_renames_of_a_best_model_export_the_previous_one_comes_back(
    prepared_demo, tmp_path, timed_work
):
    fake, _ = timed_work
    # Every evaluation scores better than the last, so each exports best_model: the baseline's is the
    # first export, the final evaluation's the second, killed after the old folder was set aside and before
    # the new one was moved in. One epoch: its 3 steps are the benchmark's, and the final evaluation (step 3)
    # follows them, as step 6's followed two epochs; the resume then trains nothing more (the epochs are done)
    # and goes straight to its final evaluation, where the swap's leftovers must already have been put right.
    one_epoch = args(prepared_demo, tmp_path, *COMMON, "--max_epochs", "1")
    killed = crash("improving-scores,export-swap", 2, one_epoch)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    run = tmp_path / "checkpoints"
    assert not (run / "best_model").exists() and list(run.glob(".best_model.old-*"))
    assert resume(tmp_path, fake) == 0
    assert "restored best_model from an unfinished swap" in (run / "train.log").read_text()
    assert VitsModel.from_pretrained(str(run / "best_model")) is not None


def test_an_unreadable_newest_checkpoint_is_skipped_with_a_warning(prepared_demo, tmp_path, timed_work):
    fake, _ = timed_work
    assert (
        train_vits.main(
            args(
                prepared_demo,
                tmp_path,
                *("--target_hours", "1", "--max_epochs", "2", "--keep_checkpoints", "5", "--max_samples", "8"),
            ),
            clock=clock_for(fake),
        )
        == 0
    )
    run = tmp_path / "checkpoints"
    newest = run / json.loads((run / "latest_checkpoint.json").read_text())["path"]
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])  # truncated, as by a crash
    assert resume(tmp_path, fake, "--max_epochs", "3") == 0
    log = (run / "train.log").read_text()
    assert f"skipping {newest.name}" in log and "resuming" in log


# ---------------------------------------------------------------- training that keeps breaking


@pytest.fixture
def quick_divergence(monkeypatch):
    """Go back after 3 non-finite steps in a row, give up after 2 returns."""
    from finetune.recipes import shared

    policy = recovery.DivergencePolicy(max_in_row=3, max_rollbacks=2, lr_factor=0.5)
    monkeypatch.setattr(shared, "Divergence", lambda rollbacks=0: recovery.Divergence(policy, rollbacks))


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


def test_a_nan_storm_goes_back_to_the_last_good_state_at_a_lower_learning_rate(
    prepared_demo, tmp_path, timed_work, monkeypatch, quick_divergence
):
    fake, _ = timed_work
    nan_losses_from(8, 12, monkeypatch)  # micro-batches of steps 5, 6 and 7 (windows of 2, 2, 1)
    assert train_vits.main(args(prepared_demo, tmp_path, *COMMON), clock=clock_for(fake)) == 0
    log = (tmp_path / "checkpoints" / "train.log").read_text()
    assert "non-finite loss in 3 steps in a row (step 7): went back to checkpoint checkpoint_epoch_2.pt (step 6)" in log
    end = metrics(tmp_path, "end")[0]
    assert end["rollbacks"] == 1 and end["nonfinite_skips"] == 3 and end["stop_reason"] == "max_epochs"
    assert metrics(tmp_path, "rollback")[0]["lr_scale"] == 0.5
    assert final_model_is_finite(tmp_path)


def test_a_nan_storm_that_persists_stops_with_the_last_good_weights(
    prepared_demo, tmp_path, timed_work, monkeypatch, quick_divergence
):
    fake, _ = timed_work
    nan_losses_from(8, 10**6, monkeypatch)
    assert (
        train_vits.main(
            args(
                prepared_demo,
                tmp_path,
                "--target_hours",
                "1",
                "--max_epochs",
                "6",
                "--gradient_accumulation_steps",
                "2",
                "--val_every",
                "3",
            ),
            clock=clock_for(fake),
        )
        == 1
    )
    assert (
        "training keeps failing (non-finite loss) after going back 2 times"
        in (tmp_path / "checkpoints" / "train.log").read_text()
    )
    assert metrics(tmp_path, "end")[0]["stop_reason"] == "diverged"
    assert final_model_is_finite(tmp_path)


def improving_scores(monkeypatch) -> None:
    """Every evaluation scores better than the one before, beyond the noise (each clip by a little more than
    the one before it: clip by clip, the improvements vary), so each becomes best_model, whatever the run; its
    focus ratio too, on the clips that have one (a feedback round's corrections)."""
    real_score, scores = evaluation.Evaluator.score_clips, iter(range(1000, 0, -1))

    def improving(self, model, stop=None, limit=None):
        per_clip, losses, cut = real_score(self, model, stop, limit)
        value = float(next(scores))
        forced = lambda i, real: evaluation.ClipScore(  # noqa: E731
            value * (1 + 0.01 * i),
            1.0,
            0.0,
            False,
            focus_relative=value * (1 + 0.01 * i) / 500 if real.focus_relative is not None else None,
        )
        return ({name: forced(i, real) for i, (name, real) in enumerate(per_clip.items())}, losses, cut)

    monkeypatch.setattr(evaluation.Evaluator, "score_clips", improving)


@pytest.fixture
def update_runs_out_of_memory(monkeypatch):
    """install(from_update, times): from the `from_update`-th optimizer update on (counting windows that
    reach the update), the generator's AdamW step raises CUDA's out-of-memory error `times` times, from
    inside the update: both gradient scalers have unscaled, the discriminator has stepped (a torn update)."""
    from tests.test_precision import out_of_memory_in

    def install(from_update: int, times: int = 1) -> dict:
        real, real_init = step.TrainStep.update, step.TrainStep.__init__

        def init(self, *a, **k):  # fp16: scales below where this tiny voice overflows, so updates are applied
            real_init(self, *a, **k)
            if self.precision.uses_scaler:
                self.scaler_g = torch.amp.GradScaler("cpu", init_scale=2.0**5)
                self.scaler_d = torch.amp.GradScaler("cpu", init_scale=2.0**10)

        calls = {"n": 0, "hooked": None}

        def counted(self, result, totals, whole, generator=True, discriminator=True):
            calls["n"] += 1
            if calls["n"] == from_update and generator:
                calls["hooked"] = out_of_memory_in(self.optimizer_g, times)
            return real(self, result, totals, whole, generator, discriminator)

        monkeypatch.setattr(step.TrainStep, "update", counted)
        monkeypatch.setattr(step.TrainStep, "__init__", init)
        return calls

    return install


def test_fp16_out_of_memory_inside_the_optimizer_update_goes_back_to_the_last_good_state(
    prepared_demo, tmp_path, timed_work, update_runs_out_of_memory
):
    """fp16, as the user's card runs: the gradient scalers' stages survive the failed update, the run goes
    back to its last checkpoint, refits the batch once and trains on to the end."""
    fake, _ = timed_work
    calls = update_runs_out_of_memory(3)
    # Two epochs of 8 clips in micro-batches of 2 (two steps each), not three of all: fp16 has no fast kernels
    # on a CPU, and the step after the refit is what shows that training goes on.
    fp16 = args(
        prepared_demo, tmp_path, *COMMON, "--fp16", "--max_epochs", "2", "--max_samples", "8", "--batch_size", "2"
    )
    assert train_vits.main(fp16, clock=clock_for(fake)) == 0
    assert calls["hooked"]["left"] == 0  # the error was raised, from inside AdamW's step
    log = (tmp_path / "checkpoints" / "train.log").read_text()
    assert re.search(
        r"out of memory inside the optimizer update \(the weights may be partly updated\) at step \d+: "
        r"went back to checkpoint checkpoint_epoch_\d+\.pt \(step \d+\)",
        log,
    ), log[-2000:]
    end = metrics(tmp_path, "end")[0]
    assert end["rollbacks"] == 1 and end["stop_reason"] == "max_epochs" and end["precision"] == "fp16"
    assert final_model_is_finite(tmp_path)


def test_out_of_memory_while_going_back_stops_and_publishes_the_best_model(
    prepared_demo, tmp_path, timed_work, update_runs_out_of_memory, monkeypatch
):
    """The card that ran out of memory in the update runs out again while the saved optimizer state is put
    back: the run stops (no traceback, no hang), says so, and the app's folder still gets best_model."""
    fake, _ = timed_work
    update_runs_out_of_memory(8)
    improving_scores(monkeypatch)  # step 6's evaluation keeps a trained best_model
    real_load = torch.optim.AdamW.load_state_dict

    def no_room(self, state_dict):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB")

    monkeypatch.setattr(torch.optim.AdamW, "load_state_dict", no_room)
    code = train_vits.main(args(prepared_demo, tmp_path, *COMMON), clock=clock_for(fake))
    monkeypatch.setattr(torch.optim.AdamW, "load_state_dict", real_load)
    assert code == 1
    log = (tmp_path / "checkpoints" / "train.log").read_text()
    assert "ran out of GPU memory" in log and "stopped; best_model is what the run keeps" in log
    assert metrics(tmp_path, "end")[0]["stop_reason"] == "out_of_memory"
    best = json.loads((tmp_path / "checkpoints" / "best_model" / "eval.json").read_text())
    summary = json.loads((tmp_path / "final_model" / "training_summary.json").read_text())
    assert best["step"] > 0 and summary["final_model_holds"] == f"best_model (step {best['step']})"


def test_out_of_memory_in_the_first_update_stops_with_what_to_do(
    prepared_demo, tmp_path, timed_work, update_runs_out_of_memory
):
    fake, _ = timed_work
    update_runs_out_of_memory(1)
    assert train_vits.main(args(prepared_demo, tmp_path, *COMMON), clock=clock_for(fake)) == 1
    assert "the optimizers' state does not fit in GPU memory" in (tmp_path / "checkpoints" / "train.log").read_text()
    assert not (tmp_path / "final_model").exists()  # nothing trained: nothing published


def test_a_resume_after_an_evaluation_ran_out_of_memory_starts_at_the_size_that_fit(
    prepared_demo, tmp_path, timed_work, monkeypatch
):
    """Evaluations synthesise 4 held-out clips at once (as on a GPU; forced here), and 3 do not fit where a GPU
    would fail, in the decoder. The first evaluation halves to 2 and the checkpoint keeps it: the resumed
    process primes and evaluates at 2, with no error, rather than failing the same way at every resume."""
    from finetune.training import assembly

    fake, _ = timed_work
    monkeypatch.setattr(assembly, "eval_batch_size", lambda device: 4)
    raised = {"n": 0}
    real_init = step.TrainStep.__init__

    def init(self, model, *a, **k):
        real_init(self, model, *a, **k)

        def no_room(module, inputs):
            if not module.training and inputs[0].shape[0] >= 3:
                raised["n"] += 1
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.50 GiB")

        model.decoder.register_forward_pre_hook(no_room)

    monkeypatch.setattr(step.TrainStep, "__init__", init)

    def stop_at_4(loop):
        if loop.state.step == 4:
            loop.context.stop.request("SIGTERM")

    assert (
        train_vits.main(
            args(prepared_demo, tmp_path, *COMMON, "--val_samples", "4"), clock=clock_for(fake), step_callback=stop_at_4
        )
        == 143
    )
    assert raised["n"] == 1
    run = tmp_path / "checkpoints"
    latest = load_checkpoint(run / json.loads((run / "latest_checkpoint.json").read_text())["path"])
    assert latest["state"]["estimates"]["eval_batch_size"] == 2
    fake.t = 0.0
    assert resume(tmp_path, fake, "--max_epochs", "2") == 0  # its final evaluation at step 6
    assert raised["n"] == 1  # the resumed process never tried 4 again
    assert (run / "train.log").read_text().count("evaluation ran out of GPU memory") == 1
    assert all(e["clips_scored"] == 4 for e in metrics(tmp_path, "eval"))


def test_sigterm_in_the_final_evaluation_still_publishes_the_best_model(
    prepared_demo, tmp_path, timed_work, monkeypatch
):
    """A real SIGTERM while the final evaluation scores its first clip: the budget is spent (a resume would be
    refused), so the stop still copies best_model into the output folder before its checkpoint."""

    fake, _ = timed_work
    improving_scores(monkeypatch)
    real_finish, real_score = finishing.finish, evaluation.Evaluator.score_group
    in_finish = {"on": False}

    def finish(self, reason):
        in_finish["on"] = True
        return real_finish(self, reason)

    def score_group(self, *a, **k):
        if in_finish["on"]:
            in_finish["on"] = False
            os.kill(os.getpid(), signal.SIGTERM)
        return real_score(self, *a, **k)

    monkeypatch.setattr(finishing, "finish", finish)
    monkeypatch.setattr(evaluation.Evaluator, "score_group", score_group)
    flags = (*COMMON, "--val_every", "2", "--max_epochs", "2")  # evaluations at steps 0, 4 and 6 (the final one)
    assert train_vits.main(args(prepared_demo, tmp_path, *flags), clock=clock_for(fake)) == 143
    log = (tmp_path / "checkpoints" / "train.log").read_text()
    assert "interrupted (SIGTERM)" in log and "the final model was written to" in log
    best = json.loads((tmp_path / "checkpoints" / "best_model" / "eval.json").read_text())
    summary = json.loads((tmp_path / "final_model" / "training_summary.json").read_text())
    assert best["step"] > 0 and summary["final_model_holds"] == f"best_model (step {best['step']})"
    assert final_model_is_finite(tmp_path)
