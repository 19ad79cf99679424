"""LengthGroupedSampler under DDP: every rank yields exactly len() batches, the same count on
every rank, in every configuration (tiny and empty datasets, fewer batches than replicas,
drop_last, shuffle, mega_batch_mult); without drop_last the ranks together cover every sample,
with it no sample is seen twice. A rank with fewer steps than the others hangs DDP's all-reduce."""
import random

import pytest

from fastcollate.data.sampler import LengthGroupedSampler


def ranks(n, bs, replicas, **kw):
    lengths = [(7 * i) % 13 + 1 for i in range(n)]
    samplers = [LengthGroupedSampler(lengths, bs, num_replicas=replicas, rank=r, **kw) for r in range(replicas)]
    return samplers, [list(s) for s in samplers]


def check(n, bs, replicas, drop_last, **kw):
    samplers, seen = ranks(n, bs, replicas, drop_last=drop_last, **kw)
    where = f"n={n} batch_size={bs} num_replicas={replicas} drop_last={drop_last} {kw}"
    lens = {len(s) for s in samplers}
    assert len(lens) == 1, f"{where}: len() differs between ranks: {sorted(lens)}"
    want = lens.pop()
    assert [len(x) for x in seen] == [want] * replicas, f"{where}: len() {want}, yielded {[len(x) for x in seen]}"
    flat = [i for x in seen for b in x for i in b]
    assert all(1 <= len(b) <= bs for x in seen for b in x), where
    assert all(0 <= i < n for i in flat), where
    if drop_last:
        assert all(len(b) == bs for x in seen for b in x), where
        assert len(flat) == len(set(flat)), f"{where}: a sample seen twice with drop_last"
        assert want == n // bs // replicas, where
    else:
        assert set(flat) == set(range(n)), f"{where}: samples missing: {sorted(set(range(n)) - set(flat))}"
        assert want == -(-(-(-n // bs)) // replicas), where
    return seen


@pytest.mark.parametrize("n, bs, replicas", [(3, 4, 4), (16, 8, 8), (1, 1, 5), (2, 1, 7), (5, 2, 8), (9, 4, 3)])
def test_fewer_batches_than_replicas_every_rank_a_step(n, bs, replicas):
    # the issue's cases: [5, 3, 4] with batch 4 on 4 replicas gave ranks 2-3 no batch at all
    seen = check(n, bs, replicas, drop_last=False, shuffle=False)
    batches = -(-n // bs)
    # repeated as DistributedSampler repeats: rank r gets batch r mod (number of batches)
    first = [x[0] for x in seen]
    assert first == [first[r % batches] for r in range(replicas)]


def test_issue_example_exactly():
    samplers = [LengthGroupedSampler([5, 3, 4], batch_size=4, num_replicas=4, rank=r) for r in range(4)]
    assert [list(s) for s in samplers] == [[[0, 2, 1]]] * 4
    assert [len(s) for s in samplers] == [1] * 4


def test_empty_dataset_yields_nothing_everywhere():
    for drop_last in (False, True):
        for replicas in (1, 3):
            seen = check(0, 4, replicas, drop_last)
            assert seen == [[]] * replicas


def test_random_configurations():
    rng = random.Random(0)
    for _ in range(600):
        n = rng.choice([0, 1, 2, 3, rng.randrange(0, 40), rng.randrange(0, 400)])
        bs = rng.choice([1, 2, 3, 4, 8, rng.randrange(1, 64)])
        replicas = rng.choice([1, 2, 3, 4, 8, rng.randrange(1, 17)])
        kw = dict(shuffle=rng.random() < 0.5, seed=rng.randrange(100), mega_batch_mult=rng.choice([0, 1, 2, 50]))
        check(n, bs, replicas, rng.random() < 0.5, **kw)


def test_epochs_keep_every_rank_equal():
    samplers, _ = ranks(37, 4, 6)
    for epoch in range(4):
        for s in samplers:
            s.set_epoch(epoch)
        seen = [list(s) for s in samplers]
        assert [len(x) for x in seen] == [len(samplers[0])] * 6
        assert {i for x in seen for b in x for i in b} == set(range(37))
