"""Rare slow batches told from the typical ones (fastcollate.tuning.spikes), on made-up batch
times: the histogram finds them wherever they come in an epoch and however often (up to half),
and the workers' inline counting matches the function's."""
from __future__ import annotations

import random

import numpy as np
import pytest

from fastcollate.loader import autotune as la
from fastcollate.tuning import spikes
from fastcollate.tuning import decide as plan


def hist_of(walls):
    h = [0.0] * spikes.COLUMNS
    for w in walls:
        spikes.add(h, 0, w)
    return h


@pytest.mark.parametrize("every", [2, 4, 37])
def test_every_slow_batch_is_found_however_often_and_wherever_it_comes(every):
    # 30 ms batches among 0.45 ms ones, the first of them second in the epoch: judged against a
    # running mean, the early ones had no mean to stand out from and frequent ones lifted it (8 of 11)
    rng = random.Random(0)
    walls = [30e-3 + rng.uniform(0, 2e-3) if i % every == 1 else 0.45e-3 + rng.uniform(0, 0.1e-3) for i in range(96)]
    n, excess = spikes.spikes(hist_of(walls))
    slow = [w for w in walls if w > 10e-3]
    typical = np.mean([w for w in walls if w <= 10e-3])
    assert n == len(slow)
    assert excess == pytest.approx(sum(slow) - len(slow) * typical, rel=1e-9)


def test_uniform_and_noisy_batches_have_no_spike():
    rng = random.Random(1)
    assert spikes.spikes(hist_of([5e-3 * rng.uniform(0.5, 1.8) for _ in range(200)])) == (0, 0.0)
    # tiny batches: 4x the median, but not a millisecond more -- a timer's noise, not a slow sample
    assert spikes.spikes(hist_of([20e-6] * 50 + [150e-6] * 3)) == (0, 0.0)
    assert spikes.spikes(hist_of([1e-3, 50e-3, 1e-3, 1e-3])) == (0, 0.0)  # too few to say
    assert spikes.spikes(hist_of([])) == (0, 0.0)


def test_a_huge_batch_lands_in_the_last_bucket_and_still_counts():
    n, excess = spikes.spikes(hist_of([1e-3] * 20 + [100.0]))
    assert n == 1 and excess == pytest.approx(100.0 - 1e-3)


def test_the_workers_inline_counting_is_the_functions():
    rng = random.Random(2)
    walls = [rng.choice([0.3e-3, 0.5e-3, 40e-3, 3.0]) for _ in range(300)]
    row = la.row_view(np.zeros((1, la.COLUMNS)), 0)
    for w in walls:
        la.FetchTimer.add(row, w)
    # a row's first batch is its start-up (FIRST_WALL), not in the histogram
    assert list(row[la.HIST:la.HIST + spikes.COLUMNS]) == hist_of(walls[1:])
    assert row[la.FIRST_WALL] == walls[0] and row[la.BATCHES] == len(walls)


def test_the_main_process_clock_counts_every_batch_as_the_function_does(monkeypatch):
    # no workers: the consumer's clock times each fetch, most batches on a short path and one now
    # and then in full (the countdown); both paths must add the same as spikes.add, and every batch
    rng = random.Random(3)
    q = 2.0 ** -20  # ~1 us: times in whole steps of it add up exactly
    walls = [q * rng.choice([21, 315, 41943, 2097152]) for _ in range(400)]  # 20 us, 0.3 ms, 40 ms, 2 s
    ticks = iter([0.0])  # the clock's start
    monkeypatch.setattr(la, "now", lambda: next(ticks))

    class Fetcher:
        collate_fn = staticmethod(lambda d: d)

    class It:
        def __init__(self):
            self.left = len(walls)

        def _next_data(self):
            if not self.left:
                raise StopIteration
            self.left -= 1
            return [0, 0]

    # each next() reads the clock before and after the fetch: the scripted times make the walls
    t, script = 0.0, []
    for w in walls:
        script += [t, t + w]
        t += w + q
    script += [t, t]  # the call that ends the epoch: before it, and when it raised
    clock = la.EpochClock(plan.Choice(0), machine=False)
    clock.fetcher = Fetcher()
    ticks = iter(script)

    class Tuner:
        _clock = clock

    it = It()
    nxt = la.timed_next(Tuner(), it)
    got = []
    with pytest.raises(StopIteration):
        while True:
            got.append(nxt())
    assert len(got) == clock.batches == len(walls) and clock.samples == 2 * len(walls)
    assert 0 < clock.cpu_n < len(walls)  # both paths taken
    assert clock.hist == hist_of(walls[1:])  # the epoch's first batch is its start-up, apart
    assert clock.wait == pytest.approx(sum(walls))
