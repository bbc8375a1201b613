"""One run per folder, with real processes: a live holder refuses a second run (train_vits.py --resume
auto included, in a process of its own forked from tests/launch.py's server) with a message naming it; a
holder killed with SIGKILL leaves a lock the next run takes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from finetune.system.run_lock import LOCK_NAME, FolderBusy, RunLock
from tests import launch
from tests.conftest import TEST_SIZE

HOLD = (
    "import time; from finetune.system.run_lock import RunLock; "
    "RunLock({folder!r}).acquire(); print('held', flush=True); time.sleep(600)"
)


def start_holder(folder) -> subprocess.Popen:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD.format(folder=str(folder))], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_a_second_run_in_a_held_folder_is_refused_naming_the_holder(prepared_demo, tmp_path):
    run = tmp_path / "checkpoints"
    holder = start_holder(run)
    try:
        second = launch.run(
            "train_vits",
            [
                "--data_dir",
                str(prepared_demo),
                "--checkpoint_dir",
                str(run),
                "--resume",
                "auto",
                "--model_name",
                f"scratch:{TEST_SIZE}",
            ],
        )
    finally:
        holder.kill()
        holder.wait()
    assert second.returncode == 1
    assert "Traceback" not in second.stderr
    assert f"another run holds {run}: process {holder.pid} on" in second.stderr
    assert f"kill {holder.pid}" in second.stderr and "another --checkpoint_dir" in second.stderr
    assert not (run / "train.log").exists()  # refused before it wrote anything


def test_a_lock_left_by_a_killed_process_is_taken_over(tmp_path):
    holder = start_holder(tmp_path)
    with pytest.raises(FolderBusy):
        RunLock(tmp_path).acquire()
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    assert (tmp_path / LOCK_NAME).is_file()  # left behind, naming the dead process
    lock = RunLock(tmp_path).acquire()
    assert f"process {holder.pid}" in lock.took_over() and "no longer running" in lock.took_over()
    assert f'"pid": {os.getpid()}' in (tmp_path / LOCK_NAME).read_text()
    lock.release()
    assert not (tmp_path / LOCK_NAME).exists()


def test_only_the_main_process_of_a_data_parallel_run_takes_the_lock(tmp_path):
    from finetune.training.distributed import Distributed, lock_run_folder

    assert lock_run_folder(tmp_path, Distributed(rank=1, world_size=1)) is None  # a rank other than 0
    assert not (tmp_path / LOCK_NAME).exists()
    lock = lock_run_folder(tmp_path, Distributed())
    assert (tmp_path / LOCK_NAME).is_file()
    lock.release()


HOLD_OUTPUT = (
    "import time; from finetune.system.run_lock import output_lock; "
    "output_lock({folder!r}).acquire(); print('held', flush=True); time.sleep(600)"
)


def test_a_second_run_publishing_into_a_held_output_folder_is_refused(prepared_demo, tmp_path):
    """Its own --checkpoint_dir, but the first run's --output_dir: it would tidy (and publish into) the folder
    the first one swaps. Refused before it trains, naming the holder and the flag."""
    output = tmp_path / "final_model"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_OUTPUT.format(folder=str(output))], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout.readline().strip() == "held"
    try:
        second = launch.run(
            "train_vits",
            [
                "--data_dir",
                str(prepared_demo),
                "--checkpoint_dir",
                str(tmp_path / "second"),
                "--output_dir",
                str(output),
                "--model_name",
                f"scratch:{TEST_SIZE}",
            ],
        )
    finally:
        holder.kill()
        holder.wait()
    assert second.returncode == 1 and "Traceback" not in second.stderr
    assert f"another run holds {output}: process {holder.pid}" in second.stderr and "--output_dir" in second.stderr
    assert not list((tmp_path / "second").glob("*.pt")) and not (tmp_path / "second" / "metrics.jsonl").exists()
