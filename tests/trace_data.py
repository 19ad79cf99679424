"""Datasets with injected stalls, importable by spawned DataLoader workers (test_trace.py)."""
import os
import time

import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info


class Stalling(Dataset):
    """Each sample costs `per_sample` seconds; in worker `slow_worker`, `slow_factor` times more."""

    def __init__(self, n=48, per_sample=0.0, slow_worker=None, slow_factor=10.0, leaf_numel=8, die_at=None):
        self.n, self.per_sample, self.slow_worker, self.slow_factor = n, per_sample, slow_worker, slow_factor
        self.leaf_numel, self.die_at = leaf_numel, die_at
        self.big = torch.ones(leaf_numel)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.die_at is not None and i == self.die_at and get_worker_info() is not None:
            os._exit(3)  # the worker dies mid-epoch
        cost = self.per_sample
        info = get_worker_info()
        if self.slow_worker is not None and info is not None and info.id == self.slow_worker:
            cost *= self.slow_factor
        if cost:
            time.sleep(cost)
        return {"x": self.big, "y": i}


class SlowBatchSampler:
    def __init__(self, n, batch_size, delay):
        self.n, self.batch_size, self.delay = n, batch_size, delay

    def __len__(self):
        return (self.n + self.batch_size - 1) // self.batch_size

    def __iter__(self):
        for start in range(0, self.n, self.batch_size):
            time.sleep(self.delay)
            yield list(range(start, min(self.n, start + self.batch_size)))


def slow_collate(batch):
    time.sleep(0.03)  # tokenizing in the collate, say
    return torch.utils.data.default_collate(batch)


class Nesting(Dataset):
    """Each sample iterates a DataLoader of its own (main-process loading inside the worker)."""

    def __init__(self, n=16):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        inner = DataLoader([torch.full((2,), float(i + j)) for j in range(4)], batch_size=2)
        batches = list(inner)
        assert all(type(b) is torch.Tensor for b in batches), [type(b) for b in batches]
        return {"x": torch.stack(batches).sum(0), "y": i}
