"""Micro-batches for the training loop, one at a time, in the sampler's order.

A DataLoader (workers, pinned memory on CUDA) collates the sampler's remaining batches of the current
epoch; each micro-batch moves to the device as it is taken. The sampler's position moves only when the
loop takes a micro-batch, never when the loader prefetches one, so a checkpoint never skips or repeats
data, and a window cut short at the deadline leaves its untaken batches for a resumed run.

The workers are forked on Linux whatever the process's default start method. Started through a
forkserver (Python 3.14's default there, and what a process a forkserver started inherits), a run on an
H200 waited 26 s for its first batch and spent 54.6% of its step time on data (bench/RESULTS.md).
"""

from __future__ import annotations

import multiprocessing
import sys
import time
from functools import partial

import torch
from torch.utils.data import DataLoader

from finetune.data.examples import Batch, Example, collate
from finetune.data.sampler import BucketSampler


class ExampleList(torch.utils.data.Dataset):
    def __init__(self, examples: list[Example]):
        self.examples = examples

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, index: int) -> Example:
        return self.examples[index]


def worker_context(num_workers: int):
    """How the loader's workers start: forked on Linux (they copy the examples already in memory and touch
    no CUDA); the platform's default elsewhere (macOS and Windows spawn)."""
    if num_workers == 0 or sys.platform != "linux":
        return None
    return multiprocessing.get_context("fork")


class MicroBatchFeed:
    def __init__(
        self,
        examples: list[Example],
        sampler: BucketSampler,
        hop: int,
        num_workers: int,
        seed: int,
        device: torch.device,
    ):
        self.examples, self.sampler, self.hop = examples, sampler, hop
        self.num_workers, self.seed, self.device = num_workers, seed, device
        self.wait_s = 0.0  # real seconds spent waiting for data
        self._batches = None

    def make_loader(self, batches: list[list[int]]) -> DataLoader:
        generator = torch.Generator().manual_seed(self.seed)  # keeps DataLoader seeding off the global RNG
        return DataLoader(
            ExampleList(self.examples),
            batch_sampler=batches,
            collate_fn=partial(collate, hop=self.hop),
            num_workers=self.num_workers,
            pin_memory=self.device.type == "cuda",
            generator=generator,
            multiprocessing_context=worker_context(self.num_workers),
        )

    def _host_batches(self):
        """Host batches from the sampler's position on, epoch after epoch (a new loader each epoch)."""
        while True:
            remaining = self.sampler.remaining_batches()
            for host_batch in self.make_loader(remaining):
                yield host_batch

    def close(self) -> None:
        """End the loader under way (its worker processes are shut down and joined now, not when the
        interpreter exits); a later `take` starts a new one at the sampler's position."""
        if self._batches is not None:
            self._batches.close()
            self._batches = None

    def take(self) -> tuple[Batch, bool]:
        """The next micro-batch on the device, and whether it ended the epoch (the sampler moves on)."""
        if self._batches is None:
            self._batches = self._host_batches()
        started = time.perf_counter()
        host_batch = next(self._batches)
        batch = host_batch.to(self.device, non_blocking=self.device.type == "cuda")
        self.wait_s += time.perf_counter() - started
        return batch, self.sampler.advance()

    def restart(self) -> None:
        """Forget prefetched batches: the next take() starts from the sampler's position as it is now
        (after the sampler was moved back, for one)."""
        self._batches = None
