"""The batch fitted to the device's memory, on CPU with a simulated out-of-memory error.

The error is the type torch really raises (torch.OutOfMemoryError, which torch.cuda.OutOfMemoryError is),
raised from inside the real generator forward (a forward pre-hook on its decoder) when a micro-batch
holds at least a given number of clips, so the code's own handling runs: the probe before training, the
refit (micro-batch halved, accumulation doubled), plan.json and the checkpoint, a resume, the one refit
an out-of-memory error during training gets, and the stop when not even one clip fits.
"""

import json

import numpy as np
import pytest
import torch

import train_vits
from finetune.data.sampler import BucketSampler
from finetune.training import step as step_module
from finetune.training.batch_fit import accumulation_for, probe_enabled, smaller_micro_batch, try_micro_batch
from finetune.training.checkpoint_file import latest_checkpoint, load_checkpoint
from tests.conftest import clock_for, demo_batch, tiny_generator
from tests.test_step import make_step
from tests.test_train import args, losses_by_step, metrics

COMMON = ["--target_hours", "1", "--max_epochs", "3", "--val_every", "3", "--max_samples", "8"]  # 2 batches an epoch


def out_of_memory_from(clips: int, after_calls: int = 0):
    """A decoder pre-hook that raises CUDA's out-of-memory error when a training batch (the model in train
    mode: evaluation is left alone) holds >= `clips` clips, after `after_calls` training calls, while
    state["on"]; it counts the errors it raised."""
    state = {"calls": 0, "raised": 0, "on": True}

    def hook(module, inputs):
        if not module.training:
            return
        state["calls"] += 1
        if state["on"] and inputs[0].shape[0] >= clips and state["calls"] > after_calls:
            state["raised"] += 1
            raise torch.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate 2.00 GiB (simulated, {inputs[0].shape[0]} clips)"
            )

    return hook, state


@pytest.fixture
def decoder_out_of_memory(monkeypatch):
    """Install out_of_memory_from(...) on the decoder of every generator a TrainStep is built around."""
    installed = {}

    def install(clips: int, after_calls: int = 0):
        hook, state = out_of_memory_from(clips, after_calls)
        real_init = step_module.TrainStep.__init__

        def init(self, model, *rest, **kwargs):
            real_init(self, model, *rest, **kwargs)
            installed["handle"] = model.decoder.register_forward_pre_hook(hook)

        monkeypatch.setattr(step_module.TrainStep, "__init__", init)
        return state

    yield install
    if "handle" in installed:
        installed["handle"].remove()


# ---------------------------------------------------------------- pure parts


def test_halving_down_to_one_with_the_accumulation_that_keeps_the_clips_a_step():
    sizes = [8]
    while smaller_micro_batch(sizes[-1]) is not None:
        sizes.append(smaller_micro_batch(sizes[-1]))
    assert sizes == [8, 4, 2, 1]
    assert [accumulation_for(8, 4, m) for m in sizes] == [4, 8, 16, 32]
    assert accumulation_for(6, 1, 3) == 2 and accumulation_for(5, 2, 2) == 6  # 5 clips as 2 + 2 + 1
    assert probe_enabled("auto", torch.device("cuda")) and not probe_enabled("auto", torch.device("cpu"))
    assert probe_enabled("on", torch.device("cpu")) and not probe_enabled("off", torch.device("cuda"))


def test_smaller_micro_batches_continue_the_epoch_with_the_same_clips_in_the_same_order():
    lengths = np.random.default_rng(0).integers(30, 600, size=61).tolist()
    whole = BucketSampler(lengths, 4, seed=3)
    order = [i for b in whole.epoch_batches(0) for i in b]
    sampler = BucketSampler(lengths, 4, seed=3)
    taken = []
    for micro in (4, 2, 1):
        assert sampler.set_micro_batch(micro) == 0  # each size divides the one before: nothing repeats
        for _ in range(5):
            batch = sampler.remaining_batches()[0]
            assert len(batch) <= micro
            taken += batch
            sampler.advance()
    taken += [i for b in sampler.remaining_batches() for i in b]
    assert taken == order  # every clip once, in the asked batch size's order
    resumed = BucketSampler(lengths, 4, seed=3)
    resumed.load_state_dict(sampler.state_dict())
    assert resumed.micro_batch == 1 and resumed.remaining_batches() == sampler.remaining_batches()


def test_a_micro_batch_that_does_not_divide_the_last_one_repeats_the_few_clips_since_its_boundary():
    sampler = BucketSampler([100] * 12, 6, seed=0)
    sampler.set_micro_batch(3)
    sampler.advance()  # 3 clips of the first batch of 6 taken
    assert sampler.set_micro_batch(2) == 1  # the new micro-batches of 2 start at clip 2: clip 3 comes again
    assert sampler.state.position == 1


# ---------------------------------------------------------------- the probe itself


def test_the_probe_does_not_train(prepared_demo):
    loaded = tiny_generator(prepared_demo)
    model, batch = loaded.model.train(), demo_batch(prepared_demo, loaded.tokenizer)
    step = make_step(model)
    step.run([batch], generator=False)  # the discriminator's optimizer has a state; the generator's none
    weights = {name: p.detach().clone() for m in (model, step.discriminator) for name, p in m.named_parameters()}
    d_state = {k: v.clone() for k, v in step.optimizer_d.state_dict()["state"][0].items()}
    rng = torch.get_rng_state()
    assert try_micro_batch(step, batch) == ""
    after = {name: p for m in (model, step.discriminator) for name, p in m.named_parameters()}
    assert all(torch.equal(weights[name], after[name]) for name in weights)  # bit for bit
    assert not step.optimizer_g.state  # the state it made for the probe is gone again
    assert all(torch.equal(v, step.optimizer_d.state_dict()["state"][0][k]) for k, v in d_state.items())
    assert all(p.grad is None for m in (model, step.discriminator) for p in m.parameters())
    assert torch.equal(rng, torch.get_rng_state())
    assert [g["lr"] for g in step.optimizer_g.param_groups] == [2e-3]


def test_the_probe_reports_out_of_memory_and_leaves_everything_as_it_was(prepared_demo):
    loaded = tiny_generator(prepared_demo)
    model, batch = loaded.model.train(), demo_batch(prepared_demo, loaded.tokenizer, count=4)
    step = make_step(model)
    hook, state = out_of_memory_from(clips=3)
    handle = model.decoder.register_forward_pre_hook(hook)
    try:
        weights = [p.detach().clone() for p in model.parameters()]
        error = try_micro_batch(step, batch)
        assert error.startswith("CUDA out of memory") and state["raised"] == 1
        assert all(torch.equal(a, b) for a, b in zip(weights, model.parameters()))
        assert not step.optimizer_g.state and not step.optimizer_d.state
        assert all(p.grad is None for p in model.parameters())
    finally:
        handle.remove()


# ---------------------------------------------------------------- whole runs


@pytest.mark.timeout(900)  # three real runs of train_vits.py
def test_out_of_memory_before_training_refits_4_to_2_to_1_and_a_resume_keeps_it(
    prepared_demo, tmp_path, timed_work, decoder_out_of_memory
):
    fake, _ = timed_work
    state = decoder_out_of_memory(clips=2)
    whole = tmp_path / "whole"
    assert train_vits.main(args(prepared_demo, whole, *COMMON, "--fit_batch", "on"), clock=clock_for(fake)) == 0
    assert state["raised"] == 2  # the probe at 4, then at 2; training at 1 never runs out
    log = (whole / "checkpoints" / "train.log").read_text()
    assert "micro-batch 4 -> 2 clips, gradient accumulation 1 -> 2 (the same 4 clips a step)" in log
    assert "micro-batch 2 -> 1 clips, gradient accumulation 2 -> 4 (the same 4 clips a step)" in log
    plan = json.loads((whole / "checkpoints" / "plan.json").read_text())
    assert (plan["batch_size"], plan["micro_batch"], plan["gradient_accumulation_steps"]) == (4, 1, 4)
    assert [(r["from"], r["to"], r["accumulation"]) for r in plan["batch_refits"]] == [(4, 2, 2), (2, 1, 4)]
    payload = load_checkpoint(latest_checkpoint(whole / "checkpoints"))
    assert payload["state"]["batch"]["micro_batch"] == 1 and payload["sampler"]["micro_batch"] == 1
    assert payload["config"]["batch_size"] == 4  # the asked batch: a resume is not refused for it
    assert metrics(whole, "end")[0]["micro_batch"] == 1

    # The same run, stopped at step 4 and resumed with no probe and no simulated shortage: it continues at
    # micro-batch 1 (accumulation 4) from its checkpoint, with the same losses as the uninterrupted run.
    parts = tmp_path / "parts"

    def stop_at_4(loop):
        if loop.state.step == 4:
            loop.context.stop.request("SIGINT")

    fake.t = 0.0
    assert (
        train_vits.main(
            args(prepared_demo, parts, *COMMON, "--fit_batch", "on"), clock=clock_for(fake), step_callback=stop_at_4
        )
        == 130
    )
    state["on"] = False  # memory to spare now
    fake.t = 0.0
    seen = []
    resume = ["--checkpoint_dir", str(parts / "checkpoints"), "--resume", "auto", "--fit_batch", "off"]
    assert (
        train_vits.main(
            resume,
            clock=clock_for(fake),
            step_callback=lambda loop: seen.append((loop.fitter.micro_batch, loop.fitter.accumulation)),
        )
        == 0
    )
    assert set(seen) == {(1, 4)}
    expected, got = losses_by_step(whole), losses_by_step(parts)
    assert sorted(expected) == sorted(got) and len(expected) == 6
    for step_number, values in expected.items():
        for name, value in values.items():
            assert got[step_number][name] == pytest.approx(value, rel=1e-5, abs=1e-7), (step_number, name)


@pytest.mark.timeout(600)  # a real run of train_vits.py
def test_out_of_memory_during_training_refits_once_and_the_run_finishes(
    prepared_demo, tmp_path, timed_work, decoder_out_of_memory
):
    fake, _ = timed_work
    state = decoder_out_of_memory(clips=3, after_calls=3)  # batches of 4 fit in steps 1-3, not in step 4
    assert train_vits.main(args(prepared_demo, tmp_path, *COMMON), clock=clock_for(fake)) == 0
    assert state["raised"] == 1
    log = (tmp_path / "checkpoints" / "train.log").read_text()
    assert "out of memory during training at step 4" in log
    assert "micro-batch 4 -> 2 clips, gradient accumulation 1 -> 2" in log
    end = metrics(tmp_path, "end")[0]
    assert end["stop_reason"] == "max_epochs" and end["oom_skips"] == 0  # the window ran again, smaller
    assert (end["micro_batch"], end["gradient_accumulation_steps"]) == (2, 2)
    refit = metrics(tmp_path, "batch_refit")
    assert len(refit) == 1 and refit[0]["micro_batch"] == 2
    plan = json.loads((tmp_path / "checkpoints" / "plan.json").read_text())
    assert plan["micro_batch"] == 2 and plan["batch_refits"][0]["to"] == 2


@pytest.mark.timeout(300)  # a real run's start of train_vits.py
def test_out_of_memory_even_at_one_clip_stops_before_training_with_what_to_do(
    prepared_demo, tmp_path, timed_work, decoder_out_of_memory
):
    fake, _ = timed_work
    state = decoder_out_of_memory(clips=1)
    assert train_vits.main(args(prepared_demo, tmp_path, *COMMON, "--fit_batch", "on"), clock=clock_for(fake)) == 1
    assert state["raised"] == 3  # 4, 2, 1
    log = (tmp_path / "checkpoints" / "train.log").read_text()
    assert "one clip at a time does not fit in GPU memory" in log
    assert (
        "a smaller --batch_size cannot help: freeze parts (--freeze posterior_encoder), use a narrower "
        "--discriminator_width"
        in log
        and "nothing was trained" in log
    )
    assert metrics(tmp_path, "end")[0]["stop_reason"] == "out_of_memory"
    assert not list((tmp_path / "checkpoints").glob("checkpoint_*.pt"))


def test_out_of_memory_again_and_again_refits_every_few_windows_and_at_one_clip_stops():
    """After the first refit one error is a rare long batch (its window skipped), but they are bounded: every
    OOM_WINDOWS_PER_REFIT-th refits again, and at one clip a micro-batch the next such run stops the run."""
    from types import SimpleNamespace

    from finetune.training.batch_fit import OOM_WINDOWS_PER_REFIT, BatchFitter
    from finetune.training.state import BatchFit

    fitted = BatchFit()
    fitter = BatchFitter(SimpleNamespace(batch_size=4, accumulation=1), fitted, None, None, None, None, None)
    fitter.refit = lambda micro_batch, why, steps_done: setattr(fitted, "micro_batch", micro_batch)
    actions = []
    while not fitter.exhausted and len(actions) < 50:
        action = fitter.after_out_of_memory()
        actions.append(f"{action}@{fitter.micro_batch}")
        if action == "refit":
            fitter.refit_in_training("out of GPU memory", len(actions))
    assert OOM_WINDOWS_PER_REFIT == 3
    assert actions == ["refit@4", "skip@2", "skip@2", "refit@2", "skip@1", "skip@1", "give_up@1"]


@pytest.mark.timeout(600)  # a real run of train_vits.py
def test_a_card_that_runs_out_of_memory_at_any_size_stops_the_run_with_what_to_do_and_keeps_the_best(
    prepared_demo, tmp_path, timed_work, decoder_out_of_memory
):
    """Every window from step 4 on runs out of memory, whatever its size: before, every one after the first
    refit was skipped until the deadline (a drain seen only in warnings)."""
    fake, _ = timed_work
    state = decoder_out_of_memory(clips=1, after_calls=3)
    # room for more steps than it gets; the timing rule out of the way (its own tests), so that a later model
    # is the best kept
    argv = args(prepared_demo, tmp_path, *COMMON, "--max_epochs", "8", "--max_length_ratio", "100")
    assert train_vits.main(argv, clock=clock_for(fake)) == 1
    log = (tmp_path / "checkpoints" / "train.log").read_text()
    assert "micro-batch 4 -> 2 clips" in log and "micro-batch 2 -> 1 clips" in log
    assert "out of GPU memory again at one clip a micro-batch" in log and "--discriminator_width" in log
    end = metrics(tmp_path, "end")[0]
    # Step 4 at 4 clips (refit), at 2 (counted), step 5 skipped, step 6 refits to 1 and fails again, step 7
    # skipped, step 8 the third at one clip: the stop. Five windows skipped, not the rest of the budget.
    assert end["stop_reason"] == "out_of_memory" and end["steps"] == 8 and end["oom_skips"] == 5
    assert state["raised"] == 7
    best = json.loads((tmp_path / "checkpoints" / "best_model" / "eval.json").read_text())
    assert best["step"] >= 3 and (tmp_path / "final_model" / "config.json").is_file()
