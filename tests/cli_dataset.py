"""Tiny datasets for the CLI tests (`--dataset cli_dataset:DATASET`), and broken ones for its errors."""
import torch

DATASET = [{"image": torch.zeros(3, 8, 8, dtype=torch.uint8), "label": i} for i in range(256)]


class Images(torch.utils.data.Dataset):
    """A class made with no arguments: `--dataset cli_dataset:Images`."""

    def __len__(self):
        return 64

    def __getitem__(self, i):
        return {"image": torch.full((3, 8, 8), i % 256, dtype=torch.uint8), "label": i}


class Broken(Images):
    """Raises at index 5, wherever it is read."""

    def __getitem__(self, i):
        if i == 5:
            return 1 / 0
        return super().__getitem__(i)


class BrokenInWorkers(Images):
    """Raises at index 5 in a DataLoader worker only (the main process reads it fine)."""

    def __getitem__(self, idx):
        if idx == 5 and torch.utils.data.get_worker_info() is not None:
            raise ValueError("the file of sample 5 is truncated")
        return super().__getitem__(idx)


class NeedsRoot(Images):
    def __init__(self, root):
        self.root = root


class NoLen(torch.utils.data.Dataset):
    def __getitem__(self, i):
        return torch.zeros(2)


def broken_factory():
    raise FileNotFoundError("no such folder: /data/imagenet")


BROKEN = Broken()
