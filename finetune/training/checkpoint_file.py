"""Checkpoints: the full training state in one file, written atomically, the last K kept.

A checkpoint holds both models, both optimizers and gradient scalers, the step and epoch, the sampler
position, every random generator's state, the time used so far, the plan, the best evaluation so far,
the resolved config, the model's config and vocabulary (so a scratch model can be rebuilt), and a
fingerprint of the training data. Everything in it is tensors and plain values, so it loads with
`torch.load(weights_only=True)`: opening a checkpoint never runs code from it.

Names: `checkpoint_epoch_N.pt` at the end of epoch N, `checkpoint_epoch_N_step_S.pt` for one taken
inside an epoch (periodic or on interrupt). `latest_checkpoint.json` points at the newest.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import random
import re
from pathlib import Path

import numpy as np
import torch

from finetune.system.atomic import torch_save_atomic, write_text_atomic
from finetune.system.errors import ToolError

CHECKPOINT_VERSION = 2
LATEST = "latest_checkpoint.json"
NAME_PATTERN = re.compile(r"checkpoint_epoch_(\d+)(?:_step_(\d+))?\.pt$")


class CheckpointError(ToolError):
    """A checkpoint cannot be used to resume; the message says why and what to do."""


# ---------------------------------------------------------------- random state


def capture_rng() -> dict:
    """Every generator training draws from, as tensors and plain values (weights_only-loadable). On CUDA,
    the generator of the device this process trains on (the current one: finetune/training/assembly.py
    pick_device sets it), not every visible device's: a resume on a machine with fewer GPUs, or under
    another CUDA_VISIBLE_DEVICES, must still find it."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    state = {
        "python": [version, list(internal), gauss_next],
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def cuda_state_for(saved, device_index: int):
    """The CUDA generator state to put back on the device this process trains on. `saved` is one state
    (this tool's checkpoints) or, in checkpoints written before, a list of every visible device's: then the
    entry of this device's index if there is one, else the first (the device the run most likely trained
    on). None when nothing was saved."""
    if saved is None or isinstance(saved, torch.Tensor):
        return saved
    states = list(saved)
    if not states:
        return None
    return states[device_index] if device_index < len(states) else states[0]


def restore_rng(state: dict) -> None:
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"])
    if torch.cuda.is_available():
        cuda = cuda_state_for(state.get("cuda"), torch.cuda.current_device())
        if cuda is not None:
            torch.cuda.set_rng_state(cuda)  # the current device's


# ---------------------------------------------------------------- files


def data_fingerprint(item_ids: list[str]) -> str:
    """Identifies the training set (ids in order): resuming on other data would break the sampler."""
    return hashlib.blake2b("\n".join(item_ids).encode(), digest_size=12).hexdigest()


def checkpoint_name(epoch: int, step: int, end_of_epoch: bool) -> str:
    return f"checkpoint_epoch_{epoch}.pt" if end_of_epoch else f"checkpoint_epoch_{epoch}_step_{step}.pt"


def list_checkpoints(folder: Path) -> list[Path]:
    return [p for p in folder.glob("checkpoint_epoch_*.pt") if NAME_PATTERN.search(p.name)]


def save_checkpoint(folder: Path, name: str, payload: dict, keep: int) -> Path:
    """Write atomically and durably, point latest_checkpoint.json at it, then delete all but the newest
    `keep`. A pointer the disk has no room for is removed rather than left naming an older checkpoint
    (the newest file wins on resume anyway, see newest_first)."""
    path = folder / name
    torch_save_atomic({"version": CHECKPOINT_VERSION, **payload}, path)
    step = payload["state"]["step"]
    try:
        write_text_atomic(
            folder / LATEST, json.dumps({"path": name, "step": step, "epoch": payload["state"]["epoch"]}) + "\n"
        )
    except OSError:  # a full disk (a plain write raises OSError)
        (folder / LATEST).unlink(missing_ok=True)
    rotate(folder, keep, protect=path)
    return path


def rotate(folder: Path, keep: int, protect: Path) -> None:
    """Delete the oldest checkpoints (by modification time) beyond `keep`; never the one just written."""
    if keep <= 0:
        return
    existing = sorted(list_checkpoints(folder), key=lambda p: p.stat().st_mtime)
    for old in existing[: max(0, len(existing) - keep)]:
        if old != protect:
            old.unlink(missing_ok=True)


def newest_first(folder: Path) -> list[Path]:
    """Checkpoints in `folder`, newest first by write time; latest_checkpoint.json only breaks ties. A
    process killed between writing a checkpoint and updating the pointer leaves the pointer naming the
    one before: the newer file still comes first."""
    pointer, named = folder / LATEST, None
    if pointer.is_file():
        try:
            named = folder / json.loads(pointer.read_text(encoding="utf-8"))["path"]
        except (OSError, ValueError, KeyError, TypeError):
            named = None  # an unreadable pointer: the files themselves decide
    return sorted(list_checkpoints(folder), key=lambda p: (p.stat().st_mtime_ns, p == named), reverse=True)


def latest_checkpoint(folder: Path) -> Path | None:
    existing = newest_first(folder)
    return existing[0] if existing else None


def resolve_resume(resume: str, folder: Path, warn=print) -> tuple[Path | None, dict | None]:
    """--resume none: (None, None). auto: the newest checkpoint in `folder` that can be read, and its
    contents; one that cannot (truncated by a crash, corrupt) is skipped with a warning naming it; an
    empty folder gives (None, None). A path: that file, which must exist and be readable."""
    if resume == "none":
        return None, None
    if resume != "auto":
        path = Path(resume)
        if not path.is_file():
            raise CheckpointError(f"--resume {resume}: no such checkpoint file")
        return path, load_checkpoint(path)
    candidates = newest_first(folder) if folder.is_dir() else []
    for path in candidates:
        try:
            return path, load_checkpoint(path)
        except CheckpointError as error:
            warn(f"warning: skipping {path.name}: {error}")
    if candidates:
        raise CheckpointError(
            f"none of the {len(candidates)} checkpoints in {folder} can be read; start a new run "
            "in another --checkpoint_dir"
        )
    return None, None


def load_checkpoint(path: Path) -> dict:
    try:
        payload = torch.load(str(path), map_location="cpu", weights_only=True)
    except (RuntimeError, OSError, EOFError, ValueError, pickle.UnpicklingError) as error:
        raise CheckpointError(f"{path} cannot be read ({error}); resume from another with --resume PATH") from error
    if not isinstance(payload, dict) or payload.get("version") != CHECKPOINT_VERSION:
        raise CheckpointError(f"{path} is not a checkpoint of this tool (version {CHECKPOINT_VERSION})")
    return payload


def resumed_settings(
    saved: dict, current: dict, given: set[str], may_change: tuple[str, ...], from_command_line: tuple[str, ...]
) -> tuple[dict, list[str]]:
    """The settings a resumed run continues with, and the names of those this command line changed.

    The checkpoint's settings hold (the learning rates, loss weights, held-out clips: the run being
    continued), so `--resume auto` alone continues it. Flags in `may_change` (budget, device, output,
    logging) given on this command line win; `from_command_line` ones always come from it. Any other
    flag given with a value other than the checkpoint's is refused."""
    problems = [
        f"--{k} was {saved[k]!r} in the checkpoint, now {current[k]!r}"
        for k in sorted(given)
        if k in saved and k not in may_change + from_command_line and saved[k] != current[k]
    ]
    if problems:
        raise CheckpointError(
            "cannot resume this checkpoint with these settings: "
            + "; ".join(problems)
            + ". Leave those flags out (the checkpoint's values are used), or start a new run "
            "in another --checkpoint_dir"
        )
    keep_current = set(from_command_line) | (given & set(may_change)) | (current.keys() - saved.keys())
    merged = {key: (value if key in keep_current else saved[key]) for key, value in current.items()}
    changed = sorted(k for k in given & set(may_change) if k in saved and saved[k] != current[k])
    return merged, changed


def check_same_data(payload: dict, fingerprint: str) -> None:
    """Resuming must continue on the same training clips."""
    if payload.get("data_fingerprint") != fingerprint:
        raise CheckpointError(
            "cannot resume this checkpoint: the training clips (metadata.csv) differ from the "
            "checkpoint's. Use the original data, or start a new run in another --checkpoint_dir"
        )
