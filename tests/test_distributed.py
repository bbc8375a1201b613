"""Data-parallel training on CPU with gloo: two processes stay identical and equal one process trained on
both their batches; the real script under the torchrun command runs end to end, and resumes under torch's
elastic agent (torchrun's own code, its ranks forked); under that agent, an out-of-memory error on one rank is
both ranks' decision."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import train_vits
from finetune.data.sampler import ResumeMismatch
from finetune.training.checkpoint_file import load_checkpoint
from tests import launch
from tests.conftest import REPO
from tests.test_train import args, metrics


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def one_step(data_dir: str, rank: int, world_size: int, out: str, port: int) -> None:
    """Build the same tiny model and step as every other process, take one optimizer step on this rank's
    batch (two clips), save the weights. world_size 1: both batches as two micro-batches of one window."""
    from finetune.data.corpus import load_examples
    from finetune.data.examples import collate
    from finetune.data.features import FeatureConfig, Features
    from finetune.training.distributed import Distributed
    from finetune.training.pacing import WindowShape
    from finetune.training.precision import Precision
    from finetune.training.step import ListSource, StepSettings, TrainStep
    from finetune.vits import objective
    from finetune.vits.discriminator import Discriminator, DiscriminatorConfig
    from finetune.vits.losses import LossWeights
    from tests.conftest import tiny_generator

    torch.set_num_threads(1)
    dist = Distributed()
    if world_size > 1:
        torch.distributed.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size
        )
        dist = Distributed(rank=rank, world_size=world_size, backend="gloo")
    # Randomness that would differ between one process and two is pinned: segments start at frame 0,
    # durations are predicted deterministically, dropout is off.
    objective.pick_segment_starts = lambda lengths, size: torch.zeros_like(lengths)
    loaded = tiny_generator(
        Path(data_dir),
        seed=0,
        use_stochastic_duration_prediction=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        duration_predictor_dropout=0.0,
        wavenet_dropout=0.0,
    )
    model = loaded.model.train()
    torch.manual_seed(1)
    discriminator = Discriminator(DiscriminatorConfig(width=0.0625, periods=(2, 3)))
    step = TrainStep(
        model,
        discriminator,
        Features(FeatureConfig()),
        LossWeights(),
        StepSettings(learning_rate=1e-3, discriminator_learning_rate=1e-3),
        Precision("fp32", None),
        torch.device("cpu"),
        dist,
    )
    examples, _ = load_examples(
        Path(data_dir), "metadata.csv", loaded.tokenizer, hop=256, sample_rate=16000, max_samples=4
    )
    halves = [collate(examples[:2], 256).to("cpu"), collate(examples[2:4], 256).to("cpu")]
    if world_size > 1:
        torch.manual_seed(100 + rank)  # the noise of the posterior sample, per process
        assert step.optimizer_step(ListSource([halves[rank]]), WindowShape(1, 1, 1, 1)).applied
    else:

        class Seeded(ListSource):  # each half with the noise its process draws
            def draw(self, index):
                torch.manual_seed(100 + index - 1)
                return super().draw(index)

        assert step.optimizer_step(Seeded(halves), WindowShape(2, 2, 1, 1)).applied
    torch.save({"generator": model.state_dict(), "discriminator": discriminator.state_dict()}, out)
    if world_size > 1:
        torch.distributed.destroy_process_group()


@pytest.mark.timeout(600)  # the real script in subprocesses
def test_two_processes_hold_identical_weights_equal_to_one_process_on_both_batches(prepared_demo, tmp_path):
    port = free_port()
    context = launch.server()  # processes of their own, forked from a server that imported torch already
    workers = [
        context.Process(target=one_step, args=(str(prepared_demo), rank, 2, str(tmp_path / f"rank_{rank}.pt"), port))
        for rank in range(2)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=300)
        assert worker.exitcode == 0
    # In this process: what one_step pins (one thread, segments from frame 0) is put back after it, or every
    # later test of the suite would train with it (test_step's overfitting run then fell short of its 30%).
    from finetune.vits import objective

    threads, starts = torch.get_num_threads(), objective.pick_segment_starts
    try:
        one_step(str(prepared_demo), 0, 1, str(tmp_path / "single.pt"), port)
    finally:
        torch.set_num_threads(threads)
        objective.pick_segment_starts = starts
    rank0, rank1, single = (
        torch.load(tmp_path / name, weights_only=True) for name in ("rank_0.pt", "rank_1.pt", "single.pt")
    )
    for part in ("generator", "discriminator"):
        for key, value in rank0[part].items():
            assert torch.equal(value, rank1[part][key]), (part, key)  # the two processes stay identical
            assert torch.allclose(value, single[part][key], rtol=1e-4, atol=1e-6), (part, key)


def torchrun(argv: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    # TMPDIR: the agent's log folder (torchelastic_*) in the test's folder; torch leaves it behind
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            str(REPO / "train_vits.py"),
            *argv,
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )


@pytest.mark.timeout(600)  # the real script in subprocesses
def test_the_script_under_torchrun_runs_end_to_end_and_resumes(prepared_demo, tmp_path):
    common = ["--target_hours", "1", "--val_every", "2", "--log_every_seconds", "0.001"]
    first = torchrun(args(prepared_demo, tmp_path, "--max_epochs", "1", *common), tmp_path)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "data parallel: 2 processes (gloo)" in first.stdout
    run = tmp_path / "checkpoints"
    plan = metrics(tmp_path, "plan")
    assert plan and metrics(tmp_path, "eval") and metrics(tmp_path, "end")[0]["stop_reason"] == "max_epochs"
    latest = load_checkpoint(run / json.loads((run / "latest_checkpoint.json").read_text())["path"])
    assert len(latest["rng_by_rank"]) == 2 and latest["sampler"]["world_size"] == 2
    # 19 clips in batches of 4: 5 batches an epoch, 3 for each process (one repeated), so 3 steps an epoch.
    assert latest["state"]["step"] == 3
    assert (tmp_path / "final_model" / "model.safetensors").is_file()

    # The resume under torchrun's own agent, its ranks forked (below): the command was run just above.
    code, out = under_agent(
        ["--checkpoint_dir", str(run), "--resume", "auto", "--max_epochs", "2"], tmp_path / "agent.out"
    )
    assert code == 0, out[-6000:]
    assert metrics(tmp_path, "end")[-1]["steps"] == 6

    # A single process cannot continue it: the data positions mean something else with another count.
    with pytest.raises(ResumeMismatch, match="written by a run of 2 process"):
        train_vits.main(["--checkpoint_dir", str(run), "--resume", "auto", "--max_epochs", "3"])


def rank(argv: list[str], faults: str, n: int) -> None:
    """One rank of a data-parallel train_vits run: `faults` (tests/crash_helper.py's) injected, then the recipe's
    main, as `python tests/crash_helper.py FAULTS N train_vits ARGS` runs it."""
    from tests import crash_helper

    for fault in filter(None, faults.split(",")):
        crash_helper.inject(fault, n)
    code = train_vits.main(argv)
    if code:
        raise RuntimeError(f"train_vits.main returned {code}")


def agent(argv: list[str], faults: str, n: int, weights: str, out: str) -> None:
    """In a process forked from the launch server: torch's elastic agent, the code torchrun runs, configured as
    `torchrun --standalone --nproc_per_node=2` configures it, with its ranks forked from this process (which holds
    torch and the recipe already: the command's three new interpreters cost 20 s of CPU importing them)."""
    import tempfile
    import uuid

    from torch.distributed import run as torchrun_command
    from torch.distributed.launcher.api import elastic_launch

    handle = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    for fd in (1, 2):
        os.dup2(handle, fd)
    os.environ.update(OMP_NUM_THREADS="1")
    tempfile.tempdir = str(Path(out).parent)  # the agent's log folder (torchelastic_*), which torch leaves behind
    if weights:
        os.environ["WEIGHTS_DIR"] = weights
    options = torchrun_command.parse_args(["--standalone", "--nproc_per_node=2", "--start-method=fork", "rank"])
    # What --standalone stands for (torch.distributed.run.run): a rendezvous on this machine, a port of its own.
    options.rdzv_backend, options.rdzv_endpoint, options.rdzv_id = "c10d", "localhost:0", str(uuid.uuid4())
    config, _, _ = torchrun_command.config_from_args(options)
    elastic_launch(config, rank)(argv, faults, n)


def under_agent(argv: list[str], out: Path, faults: str = "", n: int = 1, weights: Path | None = None):
    """train_vits.main(argv) on two ranks under agent() (a process forked from the launch server): its exit
    code and what it printed."""
    process = launch.server().Process(target=agent, args=(argv, faults, n, str(weights or ""), str(out)))
    process.start()
    process.join(timeout=500)
    if process.exitcode is None:  # a hang: the agent ends its ranks on SIGTERM, as torchrun does
        process.terminate()
        process.join(timeout=30)
        process.kill()
    return process.exitcode, out.read_text()


@pytest.mark.timeout(600)  # the real agent and ranks in processes of their own
def test_out_of_memory_on_one_process_is_every_process_s_decision(prepared_demo, tmp_path):
    """Under torch's elastic agent (gloo), only rank 1 runs out of GPU memory: first in a window's forward, later
    inside an optimizer update. Both processes drop that window and refit the batch together, both go back to
    the last checkpoint after the torn update, and the run ends normally with identical weights on both (not a
    hang in a collective, not a crash, not two models that differ). The command itself is run by the test
    above."""
    weights = tmp_path / "weights"
    weights.mkdir()
    argv = args(
        prepared_demo,
        tmp_path,
        "--target_hours",
        "1",
        "--max_epochs",
        "3",
        "--val_every",
        "4",
        "--gradient_accumulation_steps",
        "2",
        "--log_every_seconds",
        "0.001",
    )
    code, out = under_agent(
        argv, tmp_path / "agent.out", "oom-window-rank1,oom-update-rank1,weights-at-end", 3, weights
    )
    assert code == 0, out[-6000:]
    log = (tmp_path / "checkpoints" / "train.log").read_text()
    assert "out of memory during training at step" in log and "micro-batch 4 -> 2 clips" in log
    assert "another process" in log and "went back to checkpoint" in log
    end = metrics(tmp_path, "end")[0]
    assert end["stop_reason"] == "max_epochs" and end["rollbacks"] == 1
    rank0, rank1 = (torch.load(weights / f"rank_{r}.pt", weights_only=True) for r in (0, 1))
    for key, value in rank0.items():
        assert torch.equal(value, rank1[key]), key
