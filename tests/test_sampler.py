"""Length-bucketed batches: coverage, little padding, determinism, sharding, resumable position."""

import numpy as np

from finetune.data.sampler import BucketSampler, bucketed_batches, padding_fraction, shard


def lengths(n=1000, seed=0):
    return np.random.default_rng(seed).integers(30, 600, size=n).tolist()


def test_every_item_appears_exactly_once_per_epoch_and_nothing_is_dropped():
    for epoch in range(3):
        batches = bucketed_batches(lengths(1003), batch_size=8, seed=1, epoch=epoch)
        flat = sorted(i for b in batches for i in b)
        assert flat == list(range(1003))
        assert all(1 <= len(b) <= 8 for b in batches)


def test_bucketing_pads_far_less_than_random_batches():
    lens = lengths()
    bucketed = bucketed_batches(lens, 8, seed=1, epoch=0)
    order = np.random.default_rng(1).permutation(len(lens))
    random_batches = [order[i : i + 8].tolist() for i in range(0, len(lens), 8)]
    assert padding_fraction(bucketed, lens) < 0.1 < padding_fraction(random_batches, lens)


def test_one_batch_a_pool_draws_batches_at_random_whatever_the_lengths():
    """--length_pool_batches 1 (finetune-hf-vits's batches): every item once an epoch, each batch a mix of
    lengths, so the padding of random batches; the default's pools of 32 batches pad far less."""
    lens = lengths()
    mixed = bucketed_batches(lens, 8, seed=1, epoch=0, pool_batches=1)
    assert sorted(i for b in mixed for i in b) == list(range(len(lens)))
    assert padding_fraction(mixed, lens) > 0.3 > 0.1 > padding_fraction(bucketed_batches(lens, 8, 1, 0), lens)
    sampler = BucketSampler(lens, 8, seed=1, pool_batches=1)
    assert sampler.remaining_batches() == mixed and sampler.state_dict()["pool_batches"] == 1


def test_order_is_a_function_of_seed_and_epoch():
    lens = lengths(200)
    assert bucketed_batches(lens, 8, 1, 0) == bucketed_batches(lens, 8, 1, 0)
    assert bucketed_batches(lens, 8, 1, 0) != bucketed_batches(lens, 8, 1, 1)
    assert bucketed_batches(lens, 8, 1, 0) != bucketed_batches(lens, 8, 2, 0)


def test_shards_have_equal_steps_and_cover_everything():
    batches = bucketed_batches(lengths(83), 4, seed=0, epoch=0)  # 21 batches over 4 ranks
    shards = [shard(batches, rank, 4) for rank in range(4)]
    assert len({len(s) for s, _ in shards}) == 1 and shards[0][1] == 3
    covered = {i for s, _ in shards for b in s for i in b}
    assert covered == set(range(83))


def test_resuming_from_a_position_continues_the_same_epoch():
    lens = lengths(50)
    first = BucketSampler(lens, 4, seed=3)
    taken = [first.remaining_batches()[0] for _ in range(5) if not first.advance()]
    resumed = BucketSampler(lens, 4, seed=3)
    resumed.load_state_dict(first.state_dict())
    assert resumed.remaining_batches() == first.remaining_batches() == bucketed_batches(lens, 4, 3, 0)[5:]
    assert len(taken) == 5
    for _ in range(len(first.remaining_batches()) - 1):
        assert not first.advance()
    assert first.advance() and first.state.epoch == 1 and first.state.position == 0
