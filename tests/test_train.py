"""train_vits.py end to end on CPU with a tiny model and a slice of the demo corpus.

Time is injected: a fake clock that only moves when a training step or an evaluation "takes" time,
so the deadline logic is tested exactly and without sleeps.
"""

import json
import os
import signal
import time

import numpy as np
import pytest
from transformers import VitsModel, pipeline

import train_vits
from finetune.reporting import evaluation
from finetune.reporting.evaluation import ClipScore
from finetune.system.errors import ConfigError
from tests import launch
from tests.conftest import REPO, TEST_SIZE, clock_for


def args(data_dir, run_dir, *extra: str) -> list[str]:
    """A tiny run's flags; no TensorBoard (its mel picture an evaluation is tested in test_tracking.py, which
    asks for it); one test sentence an evaluation, not the three built-in ones (tests that need more give
    their own --test_sentences, which wins: it comes later); exports speak with the model's own settings,
    no tempo fitted at each (the fit is tested in test_tempo_fit.py, and end to end by the feedback tests'
    base voice and the bench smokes, which fit it as a user's run does); 8-frame segments, not VITS's 32 (a
    micro-batch a third faster: what these runs test is the machinery around the step, and the feedback tests'
    base voice, the bench smokes and `make demo` train on the default); a checkpoint at every epoch's end, as the
    resume tests need (--checkpoint_min_minutes 0: a run's checkpoints paced by time are tested on their own)."""
    return [
        "--data_dir",
        str(data_dir),
        "--checkpoint_dir",
        str(run_dir / "checkpoints"),
        "--output_dir",
        str(run_dir / "final_model"),
        "--model_name",
        f"scratch:{TEST_SIZE}",
        "--discriminator_width",
        "0.0625",
        "--discriminator_periods",
        "2",
        "3",
        "--batch_size",
        "4",
        "--gradient_accumulation_steps",
        "1",
        "--learning_rate",
        "2e-3",
        "--benchmark_samples",
        "8",
        "--val_samples",
        "2",
        "--log_every_seconds",
        "0.001",
        "--report_to",
        "none",
        "--test_sentences",
        str(REPO / "tests" / "one_sentence.txt"),
        "--inference_settings",
        "model",
        "--segment_frames",
        "8",
        "--checkpoint_min_minutes",
        "0",
        *extra,
    ]


def metrics(run_dir, kind: str) -> list[dict]:
    lines = (run_dir / "checkpoints" / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [record for record in map(json.loads, lines) if record["kind"] == kind]


def latest_checkpoint(run_dir) -> dict:
    """The checkpoint that run_dir/checkpoints/latest_checkpoint.json names, loaded."""
    from finetune.training.checkpoint_file import load_checkpoint

    run = run_dir / "checkpoints"
    return load_checkpoint(run / json.loads((run / "latest_checkpoint.json").read_text())["path"])


def wait_for_training(process, run_dir, timeout_s: float = 240) -> None:
    """Until the run launched as `process` has planned its training (or ended, or `timeout_s` passed: room for
    a machine several times slower than this one, beside busy processes; it returns as soon as the plan is
    there)."""
    metrics_file = run_dir / "checkpoints" / "metrics.jsonl"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and process.poll() is None:
        if metrics_file.is_file() and '"kind": "plan"' in metrics_file.read_text(encoding="utf-8"):
            return
        time.sleep(0.2)


def test_deadline_is_kept_with_an_injected_clock_and_the_model_is_usable(prepared_demo, tmp_path, timed_work):
    fake, costs = timed_work
    target_s = 75.0
    code = train_vits.main(
        args(prepared_demo, tmp_path, "--target_hours", str(target_s / 3600), "--max_samples", "12"),
        clock=clock_for(fake),
    )
    assert code == 0
    end = metrics(tmp_path, "end")[0]
    assert end["stop_reason"] == "deadline"
    assert end["time_used_s"] <= target_s
    # The last step ended when one more micro-batch no longer fit before what the final save was planned to
    # cost (an evaluation, three exports, a checkpoint) and the 2 s margin, counting an evaluation (and its
    # export) that would have fallen due after it. Which evaluations exported a best model depends on the
    # scores, which differ from one CPU to the next: the bound holds whatever they did.
    steps = metrics(tmp_path, "train")
    final_save_s = costs["eval_s"] + 3 * costs["export_s"] + costs["checkpoint_s"]
    due_s = costs["eval_s"] + costs["export_s"]
    assert steps[-1]["time_used_s"] + costs["micro_batch_s"] + due_s + final_save_s + 2.0 > target_s
    assert end["time_used_s"] >= steps[-1]["time_used_s"] + costs["eval_s"] + costs["checkpoint_s"]
    assert end["last_lr"] == pytest.approx(2e-3 * 0.1)  # the last step ran at the floor
    plan = json.loads((tmp_path / "checkpoints" / "plan.json").read_text())
    assert abs(plan["total_steps"] - end["steps"]) <= 2
    args_saved = json.loads((tmp_path / "checkpoints" / "training_args.json").read_text())
    assert args_saved["max_samples"] == 12
    log = (tmp_path / "checkpoints" / "train.log").read_text()
    assert "data: 12 clips" in log and "dropout on (--dropout auto)" in log  # from scratch, as VITS trains
    model, info = VitsModel.from_pretrained(str(tmp_path / "final_model"), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    speech = pipeline("text-to-speech", model=str(tmp_path / "final_model"))("ez baş im")
    assert speech["audio"].size > 0 and np.isfinite(speech["audio"]).all()
    assert (tmp_path / "final_model" / "discriminator.pt").is_file()
    assert list((tmp_path / "checkpoints" / "samples").glob("step_*/sentence_01.wav"))


def losses_by_step(run_dir) -> dict[int, dict]:
    return {
        r["step"]: {k: v for k, v in r.items() if k in ("mel", "kl", "duration", "generator", "discriminator", "lr")}
        for r in metrics(run_dir, "train")
    }


def test_best_model_follows_the_evaluation_measure(prepared_demo, tmp_path, timed_work, monkeypatch):
    scores = iter([7.0, 5.0, 6.0, 4.0, 4.5, 8.0, 9.0, 9.5, 9.7, 9.9])
    real_score = evaluation.Evaluator.score_clips

    def scripted(self, model, stop=None, limit=None):
        per_clip, losses, cut = real_score(self, model, stop, limit)
        value = next(scores)
        return {name: ClipScore(value, 1.0, 0.0, False) for name in per_clip}, losses, cut

    monkeypatch.setattr(evaluation.Evaluator, "score_clips", scripted)
    fake, _ = timed_work
    code = train_vits.main(
        args(
            prepared_demo,
            tmp_path,
            "--target_hours",
            "1",
            "--max_epochs",
            "6",
            "--val_every",
            "2",
            "--early_stopping_patience",
            "3",
        ),
        clock=clock_for(fake),
    )
    assert code == 0
    evals = metrics(tmp_path, "eval")
    best = min(evals, key=lambda r: r["mcd_db"])
    saved = json.loads((tmp_path / "checkpoints" / "best_model" / "eval.json").read_text())
    assert saved["mcd_db"] == best["mcd_db"] == 4.0 and saved["step"] == best["step"]
    assert metrics(tmp_path, "end")[0]["stop_reason"] == "early_stopping"  # 4.5, 8.0, 9.0: three without a better one
    assert len(evals) == 7


def test_an_earlier_run_is_never_silently_mixed_with_a_new_one(prepared_demo, tmp_path, timed_work, capsys):
    """An earlier run, then a new one in its folder, refused, and a resume with another batch size, refused. The
    earlier run is one epoch of 8 clips (2 steps, its final checkpoint): what is refused is its checkpoint, not
    what it learnt."""
    fake, _ = timed_work
    base = args(prepared_demo, tmp_path, "--target_hours", "1", "--max_epochs", "1", "--max_samples", "8")
    assert train_vits.main(base, clock=clock_for(fake)) == 0
    with pytest.raises(ConfigError, match="--resume auto"):
        train_vits.main(base, clock=clock_for(fake))
    from finetune.training.checkpoint_file import CheckpointError

    with pytest.raises(CheckpointError, match="--batch_size was 4 in the checkpoint, now 2"):
        train_vits.main(base + ["--resume", "auto", "--batch_size", "2"], clock=clock_for(fake))


@pytest.mark.timeout(600)  # the real script in a process of its own
def test_ctrl_c_saves_a_checkpoint_that_resumes(prepared_demo, tmp_path):
    """The real script in a process of its own (tests/launch.py), a real signal: SIGINT after training has
    started, then --resume auto."""
    argv = args(prepared_demo, tmp_path, "--target_hours", "0.25", "--max_epochs", "3")  # it ends by its epochs
    process = launch.launch("train_vits", argv)
    try:
        wait_for_training(process, tmp_path)
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=120) == 130, process.stdout + process.stderr
    finally:
        process.kill()
    output = process.stdout + process.stderr
    assert "interrupted (SIGINT)" in output and "--resume auto" in output
    latest = json.loads((tmp_path / "checkpoints" / "latest_checkpoint.json").read_text())
    assert (tmp_path / "checkpoints" / latest["path"]).is_file()

    # Resumed to the end of the first epoch (it was stopped once planned, inside it): what is tested is the resume.
    resumed = launch.run("train_vits", argv + ["--resume", "auto", "--max_epochs", "1"], timeout=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"resuming {tmp_path / 'checkpoints' / latest['path']}" in resumed.stdout
    assert (tmp_path / "final_model" / "model.safetensors").is_file()
    assert os.path.getsize(tmp_path / "checkpoints" / "train.log") > 0


@pytest.fixture(scope="module")
def flags_run(prepared_demo, tmp_path_factory):
    """One run for the three flags tested below, each read from it by its own test: 6 steps (8 clips, three
    epochs of 2) with --length_pool_batches 1, --discriminator_every 2 and --duration_every 3. The two cadences
    give different counts (3 and 2 updates of 6), so that neither flag's steps can pass for the other's, nor for
    a predictor that learnt in step 1 alone. One run a module's process, not one a test (each was 4-5 s). Its
    clock (micro_batches_take) moves as timed_work's does for micro-batches; in an hour's budget the steps are
    the epochs' either way. Returns the run folder and its flags (the pool test's resume reuses them)."""
    from tests.conftest import micro_batches_take

    run = tmp_path_factory.mktemp("flags")
    argv = args(prepared_demo, run, "--target_hours", "1", "--max_epochs", "3", "--max_samples", "8")
    argv += ["--length_pool_batches", "1", "--discriminator_every", "2", "--duration_every", "3"]
    with pytest.MonkeyPatch.context() as patch:
        fake = micro_batches_take(patch)
        assert train_vits.main(argv, clock=clock_for(fake)) == 0
    return run, argv


def updates(optimizer: dict) -> set[int]:
    """How many times AdamW stepped each parameter of a checkpoint's optimizer state, as a set."""
    return {int(state["step"]) for state in optimizer["state"].values()}


def test_length_pool_batches_from_the_command_line_set_how_a_run_draws_its_batches(flags_run):
    """--length_pool_batches 1: the run's sampler draws batches of clips at random (what that means is
    tests/test_sampler.py's), saved in its checkpoint so that a resume continues the same batches."""
    from finetune.training.checkpoint_file import CheckpointError

    run, argv = flags_run
    assert latest_checkpoint(run)["sampler"]["pool_batches"] == 1
    with pytest.raises(CheckpointError, match="--length_pool_batches was 1 in the checkpoint, now 32"):
        train_vits.main([*argv, "--resume", "auto", "--length_pool_batches", "32"])


def test_discriminator_every_from_the_command_line_sets_which_steps_the_discriminator_learns_in(flags_run):
    """--discriminator_every 2 over a run of 6 steps: the generator's optimizer stepped 6 times (but for the
    duration predictor's parameters: --duration_every 3, the test below), the discriminator's 3 times (steps 1, 3
    and 5), as the checkpoint's AdamW states count them."""
    run, _ = flags_run
    latest = latest_checkpoint(run)
    assert latest["state"]["step"] == 6
    assert updates(latest["train_step"]["optimizer_g"]) == {2, 6}
    assert updates(latest["train_step"]["optimizer_d"]) == {3}


def test_duration_every_from_the_command_line_sets_which_steps_the_duration_predictor_learns_in(flags_run):
    """--duration_every 3 over a run of 6 steps: AdamW stepped the duration predictor's parameters twice
    (steps 1 and 4) and the other generator parameters 6 times, as the checkpoint's states count them."""
    run, _ = flags_run
    latest = latest_checkpoint(run)
    assert latest["state"]["step"] == 6
    counts = [int(state["step"]) for state in latest["train_step"]["optimizer_g"]["state"].values()]
    assert sorted(set(counts)) == [2, 6]  # which parameters sat out is tests/test_step.py's


def test_checkpoints_slower_than_steps_still_fit_the_deadline(prepared_demo, tmp_path, timed_work):
    """An epoch-end checkpoint after a step is counted before the step runs: with 3 steps an epoch and a
    checkpoint 3x as slow as a step, the run still ends inside the budget, on a step at the floor. At 70 s
    the third epoch's checkpoint falls due with no room for it before the final save: with that checkpoint's cost
    left out of what falls due after a step (TrainingLoop.due_after_s), or a due checkpoint always written
    (Pacer.room_for_due), the run ends at 72 s (tried by hand; 75, 80 and 85 s, which this test ran
    before, caught neither)."""
    fake, costs = timed_work
    costs["checkpoint_s"] = 10.0
    target_s = 70.0
    code = train_vits.main(
        args(prepared_demo, tmp_path, "--target_hours", str(target_s / 3600), "--max_samples", "12"),
        clock=clock_for(fake),
    )
    assert code == 0
    end = metrics(tmp_path, "end")[0]
    assert end["stop_reason"] == "deadline" and end["time_used_s"] <= target_s, end
    assert end["last_lr"] == pytest.approx(2e-3 * 0.1)


def test_a_new_discriminator_warms_up_alone_before_a_pretrained_generator_trains(
    prepared_demo, tmp_path, timed_work, monkeypatch
):
    """From a pretrained (here: saved) generator with no discriminator: the warm-up trains the new one
    alone, logs its loss and margin at the start and the end, and leaves the generator as it was."""
    import torch

    from finetune.training.loop import TrainingLoop
    from finetune.vits.voice_on_disk import export_model
    from tests.conftest import tiny_generator

    loaded = tiny_generator(prepared_demo)
    export_model(loaded.model, loaded.tokenizer, tmp_path / "pretrained")
    seen = {}
    real_warm_up = TrainingLoop.discriminator_warmup

    def watched(loop):
        seen["before"] = {k: v.clone() for k, v in loop.parts.step.model.state_dict().items()}
        seen["discriminator"] = {k: v.clone() for k, v in loop.parts.step.discriminator.state_dict().items()}
        seen["dropout"] = {m.p for m in loop.parts.step.model.modules() if isinstance(m, torch.nn.Dropout)}
        reason = real_warm_up(loop)
        seen["after"] = {
            k: v.clone() for k, v in loop.parts.step.model.state_dict().items()
        }  # training goes on in place
        seen["discriminator_after"] = {k: v.clone() for k, v in loop.parts.step.discriminator.state_dict().items()}
        return reason

    monkeypatch.setattr(TrainingLoop, "discriminator_warmup", watched)
    fake, _ = timed_work
    base = args(prepared_demo, tmp_path, "--target_hours", "1", "--max_epochs", "2")
    base[base.index("--model_name") + 1] = str(tmp_path / "pretrained")
    code = train_vits.main(
        base + ["--discriminator_warmup_steps", "4", "--discriminator_warmup_margin", "0.99"], clock=clock_for(fake)
    )
    assert code == 0
    assert all(torch.equal(value, seen["after"][key]) for key, value in seen["before"].items())
    assert any(not torch.equal(value, seen["discriminator_after"][key]) for key, value in seen["discriminator"].items())
    record = metrics(tmp_path, "discriminator_warmup")[0]
    assert record["steps"] == 4 and record["ended_by"].startswith("the step limit")
    assert {"first_loss", "last_loss", "first_margin", "last_margin"} <= set(record)
    log = (tmp_path / "checkpoints" / "train.log").read_text()
    assert "it trains alone (at most 4 steps) before its gradients reach the pretrained generator" in log
    assert "discriminator warm-up ended by the step limit (--discriminator_warmup_steps 4): 4 steps" in log
    assert "real-minus-generated score margin" in log
    assert seen["dropout"] == {0.0} and "dropout off (--dropout auto)" in log  # fine-tuning a pretrained voice


def checkpoint_times(run_dir) -> list[tuple[int, float]]:
    """(step, the budget's seconds used when it was written) of every checkpoint the run kept, by step."""
    from finetune.training.checkpoint_file import list_checkpoints, load_checkpoint

    found = [load_checkpoint(path)["state"] for path in list_checkpoints(run_dir / "checkpoints")]
    return sorted((state["step"], state["time_used_s"]) for state in found)


def test_checkpoints_are_paced_by_time_with_the_first_and_the_last_always_written(prepared_demo, tmp_path, timed_work):
    """An epoch of 2 steps (6 s of injected time): with --checkpoint_min_minutes 0.25 (15 s) an epoch's end
    writes one only when the last is 15 s old or more; the benchmark's (the run's first) and the final one
    always. With 0, every epoch's end writes one, as before. Six epochs paced: the epoch ends at steps 4 and 6
    come 3 and 9 s after the benchmark's checkpoint (none written), step 8's 15 s after it (written), step 10's
    6 s after step 8's though 23 s after the benchmark's (none: the 15 s count from the newest), step 12's is the
    final. Three epochs with 0 show every epoch end written."""
    fake, _ = timed_work
    common = ["--target_hours", "1", "--max_samples", "8", "--keep_checkpoints", "100"]
    every, paced = tmp_path / "every", tmp_path / "paced"
    for run, minutes, epochs in ((every, "0", "3"), (paced, "0.25", "6")):
        fake.t = 0.0
        argv = args(prepared_demo, run, *common, "--checkpoint_min_minutes", minutes, "--max_epochs", epochs)
        assert train_vits.main(argv, clock=clock_for(fake)) == 0
    all_epochs, by_time = checkpoint_times(every), checkpoint_times(paced)
    last_step = metrics(paced, "end")[0]["steps"]
    assert [step for step, _ in all_epochs] == [2, 3, 4, 6]  # each epoch end, the benchmark's
    steps = [step for step, _ in by_time]
    assert steps == [3, 8, 12] and last_step == 12  # the benchmark's, an epoch end 15 s after it or more, the final
    gaps = [later - earlier for (_, earlier), (_, later) in zip(by_time[:-2], by_time[1:-1])]
    assert gaps and all(gap >= 15.0 for gap in gaps)  # the final one may come sooner
