"""Rare slow batches (a remote read, a retry, one huge sample) told from the typical ones, after
the epoch, from a histogram of batch times -- so that the model can play them out in order,
where a slow batch holds up every batch behind it unless prefetching hides it.

Judged online against the mean of the batches so far, the first slow batches are missed (there is
no mean yet) and frequent ones lift the mean until the later ones no longer stand out: one batch
in four 30 ms among 0.5 ms ones, 8 of 11 were found, and the 3 missed, spread over every batch
as if they overlapped, made the model 22% fast for 2 workers. A histogram does not depend on the
order the batches came in: each batch adds 1 and its time to one of ``BUCKETS`` power-of-two
buckets (a counter pair, no allocation), and the epoch's spikes are the buckets far above the
median. Workers keep theirs in their row of the shared counters table; the main process, its own.
"""
from __future__ import annotations

from typing import Sequence

BUCKETS = 16       # bucket k >= 1: [FLOOR_S * 2**(k-1), FLOOR_S * 2**k); the last: everything above
FLOOR_S = 50e-6
INV_FLOOR = 1.0 / FLOOR_S
LAST = 2 * (BUCKETS - 1)
COLUMNS = 2 * BUCKETS  # count, then seconds, for each bucket
FACTOR = 4.0       # a spike: several times the median batch ...
MIN_S = 1e-3       # ... and this much longer than a typical one (a timer's noise on tiny batches is not one)


def add(hist: Sequence[float] | list, at: int, wall: float) -> None:
    """Count one batch of ``wall`` seconds into the histogram at ``hist[at:at + COLUMNS]``
    (the hot paths inline this: it is the same two lines)."""
    k = at + min(2 * int(wall * INV_FLOOR).bit_length(), LAST)
    hist[k] += 1
    hist[k + 1] += wall


def spikes(hist: Sequence[float]) -> tuple[int, float]:
    """``(n, excess_s)``: how many batches of the histogram were spikes, and their time beyond a
    typical batch (the mean of the others), in all."""
    counts = [float(hist[2 * k]) for k in range(BUCKETS)]
    sums = [float(hist[2 * k + 1]) for k in range(BUCKETS)]
    total = sum(counts)
    if total < 5:
        return 0, 0.0
    seen, median = 0.0, 0.0
    for c, s in zip(counts, sums):
        seen += c
        if c and seen >= total / 2:
            median = s / c  # the mean of the bucket that holds the median batch
            break
    slow = [c > 0 and s / c > FACTOR * median for c, s in zip(counts, sums)]
    n_typical = sum(c for c, x in zip(counts, slow) if not x)
    typical = sum(s for s, x in zip(sums, slow) if not x) / max(1.0, n_typical)
    n, excess = 0, 0.0
    for c, s, x in zip(counts, sums, slow):
        if x and s / c - typical > MIN_S:
            n += int(c)
            excess += s - c * typical
    return n, excess


__all__ = ["BUCKETS", "COLUMNS", "add", "spikes"]
