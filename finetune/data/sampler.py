"""Length-bucketed batches: little padding, random order, every item exactly once per epoch.

Per epoch (seeded by seed and epoch): shuffle all items, cut the order into pools of
`batch_size * pool_batches`, sort each pool by length and cut it into batches, then shuffle the batches.
Items of similar length share a batch (little padding) while batches still vary from epoch to epoch.
The last batch of a pool may be smaller: nothing is dropped. One batch a pool (`--length_pool_batches 1`)
makes batches of items drawn at random, whatever their lengths (more padding; every batch a mix).

When the batch does not fit in the device's memory (finetune/training/batch_fit.py), each batch is
served as consecutive micro-batches of `micro_batch` items (a batch of 8 as 4 + 4, or 2 + 2 + 2 + 2):
the order and the bucketing stay those of the asked batch size, so with the accumulation raised to
match, every optimizer step sees the same clips as it would have. The position counts micro-batches.

For data-parallel training each rank takes every `world_size`-th batch; when the batch count does not
divide evenly, the first few batches are repeated so that every rank runs the same number of steps
(counted in `repeated`): the ranks' shares are disjoint but for those repeats. Resuming needs only
(epoch, position): the batch list is a function of the seed and the epoch; a checkpoint resumes only
with the number of processes that wrote it (refused otherwise, with the number to use).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from finetune.system.errors import ToolError


class ResumeMismatch(ToolError):
    """A saved position that means something else in this run (another process count)."""


def bucketed_batches(
    lengths: list[int] | np.ndarray, batch_size: int, seed: int, epoch: int, pool_batches: int = 32
) -> list[list[int]]:
    rng = np.random.default_rng([seed, epoch])
    lengths = np.asarray(lengths)
    order = rng.permutation(len(lengths))
    pool = batch_size * pool_batches
    batches = []
    for start in range(0, len(order), pool):
        chunk = order[start : start + pool]
        chunk = chunk[np.argsort(-lengths[chunk], kind="stable")]
        batches.extend(chunk[i : i + batch_size].tolist() for i in range(0, len(chunk), batch_size))
    return [batches[i] for i in rng.permutation(len(batches))]


def shard(batches: list[list[int]], rank: int, world_size: int) -> tuple[list[list[int]], int]:
    """This rank's batches, and how many batches were repeated to even out the ranks."""
    if world_size == 1:
        return batches, 0
    repeated = (-len(batches)) % world_size
    padded = batches + batches[:repeated]
    return padded[rank::world_size], repeated


def padding_fraction(batches: list[list[int]], lengths: list[int] | np.ndarray) -> float:
    """Share of padded positions: sum over batches of (longest * size - total) / (longest * size)."""
    lengths = np.asarray(lengths)
    padded = sum(int(lengths[b].max()) * len(b) for b in batches)
    return 1.0 - float(sum(int(lengths[b].sum()) for b in batches)) / padded if padded else 0.0


def split(batch: list[int], micro_batch: int) -> list[list[int]]:
    """A batch as consecutive micro-batches of `micro_batch` items (the last may be smaller)."""
    return [batch[i : i + micro_batch] for i in range(0, len(batch), micro_batch)]


@dataclass
class SamplerState:
    epoch: int = 0  # epochs completed
    position: int = 0  # batches of the current epoch already taken


class BucketSampler:
    """Hands out this rank's batches epoch after epoch, from a resumable (epoch, position)."""

    def __init__(
        self,
        lengths: list[int],
        batch_size: int,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        pool_batches: int = 32,
    ):
        self.lengths, self.batch_size, self.seed, self.pool_batches = list(lengths), batch_size, seed, pool_batches
        self.rank, self.world_size = rank, world_size
        self.micro_batch = batch_size  # items per batch handed out (smaller after a refit)
        self.state = SamplerState()
        self._epoch_cache: tuple[int, int, list[list[int]]] | None = None

    def bucket_batches(self, epoch: int) -> list[list[int]]:
        """This rank's batches of the asked size (before any split into micro-batches)."""
        batches = bucketed_batches(self.lengths, self.batch_size, self.seed, epoch, self.pool_batches)
        return shard(batches, self.rank, self.world_size)[0]

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        if self._epoch_cache is None or self._epoch_cache[:2] != (epoch, self.micro_batch):
            batches = self.bucket_batches(epoch)
            if self.micro_batch < self.batch_size:
                batches = [part for batch in batches for part in split(batch, self.micro_batch)]
            self._epoch_cache = (epoch, self.micro_batch, batches)
        return self._epoch_cache[2]

    def set_micro_batch(self, micro_batch: int) -> int:
        """Hand out micro-batches of `micro_batch` items from now on, continuing the current epoch where it
        was: the same clips are still to come. Returns how many clips of the current epoch will be seen a
        second time (0 when the position falls on a boundary of the new split, as it does when each size
        divides the one before; otherwise the new position is the boundary just before it)."""
        if not 1 <= micro_batch <= self.batch_size:
            raise ValueError(f"micro-batch {micro_batch}: must be from 1 to the batch size {self.batch_size}")
        old = self.epoch_batches(self.state.epoch)
        taken = sum(len(b) for b in old[: self.state.position])
        self.micro_batch = micro_batch
        position, seen = 0, 0
        for batch in self.epoch_batches(self.state.epoch):
            if seen + len(batch) > taken:
                break
            seen, position = seen + len(batch), position + 1
        self.state = SamplerState(self.state.epoch, position)
        return taken - seen

    @property
    def batches_per_epoch(self) -> int:
        return len(self.epoch_batches(self.state.epoch))

    def remaining_batches(self) -> list[list[int]]:
        """The batches of the current epoch not yet taken (all of them at an epoch start)."""
        return self.epoch_batches(self.state.epoch)[self.state.position :]

    def advance(self) -> bool:
        """Record that one batch was consumed; True when that ended the epoch (the epoch then advances)."""
        self.state.position += 1
        if self.state.position >= self.batches_per_epoch:
            self.state = SamplerState(epoch=self.state.epoch + 1, position=0)
            return True
        return False

    def state_dict(self) -> dict:
        return {
            "epoch": self.state.epoch,
            "position": self.state.position,
            "seed": self.seed,
            "batch_size": self.batch_size,
            "pool_batches": self.pool_batches,
            "micro_batch": self.micro_batch,
            "items": len(self.lengths),
            "world_size": self.world_size,
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue at the saved position. The position counts this process's batches of its share, so it
        only means the same thing with as many processes as when it was saved."""
        saved_world = int(state.get("world_size", 1))
        if saved_world != self.world_size:
            raise ResumeMismatch(
                f"this checkpoint was written by a run of {saved_world} process(es) and this one has "
                f"{self.world_size}: resume it with the same number (torchrun --nproc_per_node="
                f"{saved_world}), or start a new run in another --checkpoint_dir"
            )
        self.micro_batch = int(state.get("micro_batch", self.batch_size))  # the position counts these
        self.state = SamplerState(epoch=int(state["epoch"]), position=int(state["position"]))
