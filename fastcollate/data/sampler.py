"""LengthGroupedSampler: batches of similar lengths, to cut padding waste."""
from __future__ import annotations

import math
from typing import Iterator, Sequence

import torch
from torch.utils.data import Sampler


class LengthGroupedSampler(Sampler[list[int]]):
    """A batch sampler grouping samples of similar length; deterministic per (seed, epoch).

    Indices are shuffled, cut into mega-batches of ``mega_batch_mult * batch_size``, each sorted
    by length (longest first) and cut into batches; the batch order is shuffled again. With
    several replicas (DDP; taken from torch.distributed when initialized) each rank gets every
    ``num_replicas``-th batch of that list, so every rank runs exactly ``len(sampler)`` steps:

    * without drop_last the list is padded to a multiple of ``num_replicas`` by repeating it from
      its start, as often as needed (as ``DistributedSampler`` repeats its indices): with fewer
      batches than replicas some batches run on several ranks, and no rank is left without a
      step; ``len`` is ``ceil(ceil(n / batch_size) / num_replicas)`` and the ranks together
      cover every sample;
    * with drop_last the partial batch is dropped and the list trimmed to a multiple of
      ``num_replicas``: ``len`` is ``n // batch_size // num_replicas`` (0 when there are fewer
      full batches than replicas) and no sample is seen twice;
    * an empty dataset yields nothing on every rank.

    >>> s = LengthGroupedSampler([5, 1, 4, 2, 3, 6], batch_size=2, shuffle=False)
    >>> list(s)
    [[5, 0], [2, 4], [3, 1]]
    >>> [list(LengthGroupedSampler([5, 3, 4], 4, num_replicas=4, rank=r)) for r in range(4)]
    [[[0, 2, 1]], [[0, 2, 1]], [[0, 2, 1]], [[0, 2, 1]]]
    """

    def __init__(self, lengths: Sequence[int], batch_size: int, *, shuffle: bool = True, seed: int = 0,
                 mega_batch_mult: int = 50, drop_last: bool = False, num_replicas: int | None = None,
                 rank: int | None = None) -> None:
        if batch_size < 1:
            raise ValueError(f"LengthGroupedSampler: batch_size must be >= 1, got {batch_size}")
        if num_replicas is None or rank is None:
            import torch.distributed as dist

            ddp = dist.is_available() and dist.is_initialized()
            num_replicas = num_replicas if num_replicas is not None else (dist.get_world_size() if ddp else 1)
            rank = rank if rank is not None else (dist.get_rank() if ddp else 0)
        if not 0 <= rank < num_replicas:
            raise ValueError(f"LengthGroupedSampler: rank {rank} is not in [0, {num_replicas})")
        self.lengths = torch.as_tensor(list(lengths), dtype=torch.int64)
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.mega = max(1, mega_batch_mult) * batch_size
        self.drop_last = drop_last
        self.num_replicas = num_replicas
        self.rank = rank
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _all_batches(self) -> list[list[int]]:
        n = len(self.lengths)
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(n, generator=g) if self.shuffle else torch.arange(n)
        batches: list[list[int]] = []
        for start in range(0, n, self.mega):
            chunk = order[start:start + self.mega]
            # stable sort, longest first: ties keep the shuffled order
            chunk = chunk[torch.argsort(-self.lengths[chunk], stable=True)]
            batches += [chunk[i:i + self.batch_size].tolist() for i in range(0, len(chunk), self.batch_size)]
        if self.drop_last and batches and len(batches[-1]) < self.batch_size:
            batches = [b for b in batches if len(b) == self.batch_size]
        if self.shuffle:
            perm = torch.randperm(len(batches), generator=g).tolist()
            batches = [batches[i] for i in perm]
        if self.num_replicas > 1:
            if self.drop_last:
                batches = batches[: len(batches) // self.num_replicas * self.num_replicas]
            elif batches:
                # repeat the whole list as often as it takes (as DistributedSampler does):
                # ``batches[:short]`` alone runs out when there are fewer batches than replicas
                total = math.ceil(len(batches) / self.num_replicas) * self.num_replicas
                batches = (batches * math.ceil(total / len(batches)))[:total]
        return batches

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self._all_batches()[self.rank::self.num_replicas])

    def __len__(self) -> int:
        # mega-batches hold a whole number of batches, so only the last batch can be partial
        n = len(self.lengths)
        total = n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)
        if self.num_replicas > 1:
            total = total // self.num_replicas if self.drop_last else math.ceil(total / self.num_replicas)
        return total


def padding_fraction(lengths: Sequence[int], batches: Sequence[Sequence[int]], multiple: int = 1) -> float:
    """Share of a padded batch's positions that are padding, over all batches."""
    real = padded = 0
    for b in batches:
        ls = [int(lengths[i]) for i in b]
        longest = -(-max(ls, default=0) // multiple) * multiple
        real += sum(ls)
        padded += longest * len(ls)
    return 1.0 - real / padded if padded else 0.0
