"""Power loss and kills during a save, each at its own point, with a real SIGKILL in a process of its own
(tests/launch.py, tests/crash_helper.py): what the next start finds must be a complete model and the newest whole
checkpoint. Between the renames of a folder swap is covered in tests/test_reliability.py."""

from __future__ import annotations

import json
import signal
import subprocess

from transformers import VitsModel

from finetune.system.atomic import recover
from finetune.training.checkpoint_file import LATEST, list_checkpoints, load_checkpoint, resolve_resume
from tests import launch
from tests.test_train import args

QUICK = ["--target_hours", "1", "--max_samples", "8", "--max_epochs", "3", "--val_every", "2"]


def crash(fault: str, n: int, recipe_args: list[str]) -> subprocess.CompletedProcess:
    killed = launch.run("train_vits", recipe_args, faults=fault, n=n, timeout=600)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    return killed


def test_killed_before_the_pointer_names_the_new_checkpoint_the_new_one_resumes(prepared_demo, tmp_path):
    crash("pointer-update", 2, args(prepared_demo, tmp_path, *QUICK))
    run = tmp_path / "checkpoints"
    named = json.loads((run / LATEST).read_text())["path"]
    steps = {p.name: load_checkpoint(p)["state"]["step"] for p in list_checkpoints(run)}
    newest = max(steps, key=steps.get)
    assert newest != named  # the pointer is stale: it names the one before
    path, payload = resolve_resume("auto", run)
    assert path.name == newest and payload["state"]["step"] == steps[newest]


def test_killed_with_the_new_model_built_but_not_swapped_in_the_old_one_stays(prepared_demo, tmp_path):
    crash("improving-scores,export-staging", 2, args(prepared_demo, tmp_path, *QUICK))
    run = tmp_path / "checkpoints"
    assert (run / "best_model").is_dir() and list(run.glob(".best_model.tmp-*"))
    notes = recover(run)
    assert any("removed unfinished .best_model.tmp-" in n for n in notes)
    assert VitsModel.from_pretrained(str(run / "best_model")) is not None
    assert not list(run.glob(".best_model*"))


def test_killed_after_the_swap_before_the_old_copy_is_deleted_the_new_model_stays(prepared_demo, tmp_path):
    crash("improving-scores,export-after-swap", 2, args(prepared_demo, tmp_path, *QUICK))
    run = tmp_path / "checkpoints"
    new_eval = json.loads((run / "best_model" / "eval.json").read_text())["step"]
    assert list(run.glob(".best_model.old-*"))
    notes = recover(run)
    assert any("a finished swap had replaced" in n for n in notes)
    assert json.loads((run / "best_model" / "eval.json").read_text())["step"] == new_eval > 0
    assert VitsModel.from_pretrained(str(run / "best_model")) is not None
    assert not list(run.glob(".best_model*"))
