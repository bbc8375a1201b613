"""The training loop's micro-batches (finetune/data/feed.py): loader workers that start the same way on
every Python, and the same batches with or without them."""

import multiprocessing
import sys

import numpy as np
import pytest
import torch

from finetune.data.examples import Example
from finetune.data.feed import MicroBatchFeed
from finetune.data.sampler import BucketSampler

HOP = 256


def examples(count: int) -> list[Example]:
    rng = np.random.default_rng(0)
    return [
        Example(
            f"clip{i}",
            rng.integers(1, 30, 5 + i % 7).astype(np.int32),
            rng.integers(-3000, 3000, HOP * (20 + 3 * i)).astype(np.int16),
        )
        for i in range(count)
    ]


def taken(num_workers: int, count: int) -> list:
    clips = examples(12)
    sampler = BucketSampler([c.frame_count(HOP) for c in clips], 4, seed=1)
    feed = MicroBatchFeed(clips, sampler, HOP, num_workers, seed=1, device=torch.device("cpu"))
    try:
        out = []
        for _ in range(count):  # past the epoch's end: a second loader
            batch, _ = feed.take()
            out.append((batch.input_ids.clone(), batch.audio.clone()))
        return out
    finally:
        feed.close()


@pytest.mark.skipif(sys.platform != "linux", reason="workers are forked on Linux only")
@pytest.mark.timeout(60)
def test_workers_are_forked_under_a_forkserver_default_and_give_the_same_batches():
    multiprocessing.set_start_method("forkserver", force=True)  # Python 3.14's default on Linux
    try:
        feed = MicroBatchFeed(examples(4), BucketSampler([20] * 4, 2, seed=1), HOP, 1, 1, torch.device("cpu"))
        assert feed.make_loader([[0, 1]]).multiprocessing_context.get_start_method() == "fork"
        with_workers = taken(1, 5)
    finally:
        multiprocessing.set_start_method(None, force=True)
    alone = taken(0, 5)
    assert len(with_workers) == len(alone) == 5
    for (ids_w, audio_w), (ids_a, audio_a) in zip(with_workers, alone):
        assert torch.equal(ids_w, ids_a) and torch.equal(audio_w, audio_a)
