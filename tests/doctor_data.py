"""Misconfigured pipelines for the doctor's tests (test_doctor.py), importable by spawned
DataLoader workers: each has one lever that fixes it. Costs are CPU work, not sleeps (a sleep
parallelizes past the cores), except where the point is waiting."""
import time

import numpy as np
import torch
from torch.utils.data import Dataset


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


class SlowGetitem(Dataset):
    """A per-sample Python __getitem__ that costs ``per_sample`` seconds of CPU (run with
    num_workers=0: workers fix it)."""

    def __init__(self, n=512, per_sample=400e-6):
        self.n, self.per_sample = n, per_sample

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        spin(self.per_sample)
        return {"x": torch.full((16,), float(i)), "y": i}


class Expensive(Dataset):
    """Deterministic and expensive: the same index always gives the same sample (the cache)."""

    def __init__(self, n=256, per_sample=1e-3):
        self.n, self.per_sample = n, per_sample

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        spin(self.per_sample)
        g = torch.Generator().manual_seed(i)
        return {"x": torch.randn(64, generator=g), "y": i}


class Cheap(Dataset):
    """Almost free samples (spawned non-persistent workers, tiny batches: the loader's own costs)."""

    def __init__(self, n=512, width=8):
        self.n, self.width = n, width

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"x": torch.full((self.width,), float(i)), "y": i}


class RareSlow(Dataset):
    """Most samples cheap, one in ``every`` slow (waiting, as a remote read would)."""

    def __init__(self, n=512, every=37, slow=0.03):
        self.n, self.every, self.slow = n, every, slow

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i % self.every == 0:
            time.sleep(self.slow)
        else:
            spin(50e-6)
        return {"x": torch.full((8,), float(i)), "y": i}


class ManyFields(Dataset):
    """Samples of many small fields, made once: default_collate's per-leaf cost dominates."""

    def __init__(self, n=1024, fields=40):
        self.samples = [{f"f{k}": torch.full((4,), float(i + k)) for k in range(fields)} for i in range(n)]

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        return self.samples[i]


class PythonObjects(Dataset):
    """Millions of Python objects held by the dataset and touched by every worker: copy-on-write
    copies their pages into each worker."""

    def __init__(self, n=256, objects=2_000_000):
        self.n = n
        self.table = [{"id": k, "name": str(k)} for k in range(objects // 2)]

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        # reads (and so reference-counts) a spread of the objects, as lookups over an epoch do
        stride = max(1, len(self.table) // 4096)
        total = 0
        for k in range(i % stride, len(self.table), stride):
            total += self.table[k]["id"]
        return {"x": torch.full((8,), float(total % 997)), "y": i}


def compute_step(seconds=0.02):
    def step(batch):
        spin(seconds)
    return step


def light_step(batch):
    return None


__all__ = ["SlowGetitem", "Expensive", "Cheap", "RareSlow", "ManyFields", "PythonObjects", "compute_step", "light_step",
           "np"]
