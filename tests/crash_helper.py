"""Faults injected into a recipe run in a process of its own, for the reliability tests (a SIGKILL cannot be
caught): tests/launch.py forks the process and calls `inject`; by hand, the same from a shell:

    python tests/crash_helper.py FAULT N train_vits|train_feedback ARGS...

FAULT, at its N-th occasion (several may be given, comma-separated):
    checkpoint-write   the process is killed half way through writing a checkpoint's temporary file
    export-swap        killed between the two renames of a model folder swap (old set aside, new not in)
    export-staging     killed with a model folder fully built under its staging name, before any rename
    export-after-swap  killed after a model folder swap, before the old folder set aside is deleted
    pointer-update     killed after a checkpoint is renamed into place, before latest_checkpoint.json names it
    accept-version     killed after a feedback round copied its new version, before current/ and the history
    improving-scores   not a fault: every evaluation scores better than the last (so each exports best_model)
    accept-rounds      not a fault: every feedback round is accepted, whatever its scores (combine: a,b)
    slow-stop          after a stop request, saving hangs for a minute (says "saving slowly" on stderr first)
    oom-window-rank1   under torchrun, rank 1 only: its N-th training micro-batch runs out of GPU memory in the
                       decoder's forward (CUDA's error type, where a GPU raises it)
    oom-update-rank1   under torchrun, rank 1 only: its N-th optimizer update runs out of GPU memory inside the
                       generator's AdamW step (after the discriminator's step: a torn update)
    weights-at-end     not a fault: each process saves its generator's weights to $WEIGHTS_DIR/rank_R.pt at
                       the end of its training loop (to compare the processes of a data-parallel run)
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def on_nth(n: int, real, fault):
    calls = {"count": 0}

    def wrapper(*args, **kwargs):
        calls["count"] += 1
        if calls["count"] == n:
            return fault(*args, **kwargs)
        return real(*args, **kwargs)

    return wrapper


def accept_every_round(real_decide):
    """decision.decide, made to accept: a test of what follows acceptance need not train until it is earned."""
    import dataclasses

    def accept(*args, **kwargs):
        return dataclasses.replace(real_decide(*args, **kwargs), accepted=True, reason="accepted (forced by the test)")

    return accept


def inject(fault: str, n: int) -> None:
    import torch

    from finetune.feedback import decision, versions
    from finetune.system import atomic
    from finetune.training import checkpoint_file
    from finetune.vits import voice_on_disk

    if fault == "checkpoint-write":

        def half_written(obj, path):
            def write(tmp):
                torch.save(obj, tmp)
                size = os.path.getsize(tmp)
                with open(tmp, "r+b") as handle:
                    handle.truncate(size // 2)
                die()

            atomic.write_atomic(path, write)

        checkpoint_file.torch_save_atomic = on_nth(n, checkpoint_file.torch_save_atomic, half_written)
    elif fault == "export-swap":

        def half_swapped(built, target):
            if target.exists():
                os.replace(target, target.with_name(f".{target.name}.old-{os.getpid()}"))
            die()

        voice_on_disk.replace_dir = on_nth(n, voice_on_disk.replace_dir, half_swapped)
    elif fault == "export-staging":
        voice_on_disk.replace_dir = on_nth(n, voice_on_disk.replace_dir, lambda built, target: die())
    elif fault == "export-after-swap":

        def swapped_not_cleaned(built, target):
            if target.exists():
                os.replace(target, target.with_name(f".{target.name}.old-{os.getpid()}"))
            os.replace(built, target)
            die()

        voice_on_disk.replace_dir = on_nth(n, voice_on_disk.replace_dir, swapped_not_cleaned)
    elif fault == "pointer-update":
        real_text = checkpoint_file.write_text_atomic
        pointer_calls = {"count": 0}

        def pointer_then_die(path, text):
            if os.path.basename(str(path)) == checkpoint_file.LATEST:
                pointer_calls["count"] += 1
                if pointer_calls["count"] == n:
                    die()
            return real_text(path, text)

        checkpoint_file.write_text_atomic = pointer_then_die
    elif fault == "accept-version":
        real_copy = versions.Versions._copy_model

        def copy_then_die(self, source, target):
            real_copy(self, source, target)
            die()

        versions.Versions._copy_model = on_nth(n, real_copy, copy_then_die)
    elif fault == "improving-scores":
        from finetune.reporting import evaluation

        real_score, scores = evaluation.Evaluator.score_clips, iter(range(1000, 0, -1))

        def improving(self, model, stop=None, limit=None):
            per_clip, losses, cut = real_score(self, model, stop, limit)
            value = float(next(scores))
            return {name: evaluation.ClipScore(value, 1.0, 0.0, False) for name in per_clip}, losses, cut

        evaluation.Evaluator.score_clips = improving
    elif fault == "accept-rounds":
        decision.decide = accept_every_round(decision.decide)
    elif fault == "slow-stop":
        import time

        from finetune.training.loop import TrainingLoop

        real_stop = TrainingLoop.stop_cleanly

        def slow(self):
            print("saving slowly", file=sys.stderr, flush=True)
            time.sleep(60)
            return real_stop(self)

        TrainingLoop.stop_cleanly = slow
    elif fault in ("oom-window-rank1", "oom-update-rank1"):
        if os.environ.get("RANK") == "1":
            inject_out_of_memory(fault, n)
    elif fault == "weights-at-end":
        from finetune.training.loop import TrainingLoop

        real_run = TrainingLoop.run

        def run_then_save(self):
            result = real_run(self)
            torch.save(
                self.parts.step.model.state_dict(),
                Path(os.environ["WEIGHTS_DIR"]) / f"rank_{os.environ.get('RANK', '0')}.pt",
            )
            return result

        TrainingLoop.run = run_then_save
    else:
        raise SystemExit(f"unknown fault {fault}")


def inject_out_of_memory(fault: str, n: int) -> None:
    """CUDA's out-of-memory error, on this process only, at its n-th training micro-batch (in the decoder's
    forward) or its n-th optimizer update (inside the generator's AdamW step)."""
    import torch

    from finetune.training.step import TrainStep

    real_init, calls = TrainStep.__init__, {"n": 0}

    def init(self, model, *args, **kwargs):
        real_init(self, model, *args, **kwargs)
        if fault == "oom-window-rank1":

            def no_room(module, inputs):
                if module.training:
                    calls["n"] += 1
                    if calls["n"] == n:
                        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (rank 1)")

            model.decoder.register_forward_pre_hook(no_room)
        else:

            def no_room_in_update(optimizer, args, kwargs):
                calls["n"] += 1
                if calls["n"] == n:
                    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 96.00 MiB (rank 1)")

            self.optimizer_g.register_step_pre_hook(no_room_in_update)

    TrainStep.__init__ = init


def run_recipe(faults: str, n: int, recipe: str, argv: list[str]) -> None:
    """The faults (comma-separated) injected, then `recipe` run as `python RECIPE.py ARGS` runs it: as
    __main__, with its exit status and its messages."""
    import runpy

    for fault in filter(None, faults.split(",")):
        inject(fault, n)
    script = str(Path(__file__).resolve().parent.parent / f"{recipe}.py")
    sys.argv = [script, *argv]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    faults, n, recipe, *argv = sys.argv[1:]
    run_recipe(faults, int(n), recipe, argv)
