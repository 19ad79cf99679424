"""Small deterministic datasets for the loader tests (importable by spawned workers)."""
import numpy as np
import torch

import fastcollate
from torch.utils.data import Dataset


class Mixed(Dataset):
    def __init__(self, n=40):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return {
            "image": torch.randint(0, 255, (3, 16, 16), dtype=torch.uint8, generator=g),
            "feat": np.full((4,), i, dtype=np.float32),
            "label": i,
            "weight": float(i) / 3,
            "name": f"s{i}",
            "pair": (torch.randn(2, generator=g), np.int16(i)),
        }


class GatherOnly(fastcollate.ArrayDataset):
    """An ArrayDataset whose samples must not be made one by one in a worker: batches there
    can only come from the gather (indexing in the main process still works, for references)."""

    def __getitem__(self, i):
        from torch.utils.data import get_worker_info

        if get_worker_info() is not None:
            raise AssertionError(f"sample {i} was materialized in a worker")
        return super().__getitem__(i)
