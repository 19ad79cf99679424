"""Run inside a private mount namespace with a tiny /dev/shm (tests/test_containers.py): one
loader's epoch of 9.6 MB batches; prints OK and the loader's stats, or dies as torch's does.
``cache-fork`` / ``cache-spawn`` (tests/test_cache.py): 134 MB of samples in a fastcollate.Cached
filled by two workers in epoch 1 and read by them in epoch 2; prints OK, hits, misses, bytes."""
import sys

import torch
from torch.utils.data import DataLoader, Dataset

import fastcollate


class Big(Dataset):
    def __len__(self):
        return 32

    def __getitem__(self, i):
        return {"x": torch.full((300_000,), float(i)), "y": i}  # 1.2 MB a sample


class Megabytes(Dataset):
    def __len__(self):
        return 128

    def __getitem__(self, i):
        return torch.full((262_144,), float(i))  # 1 MB a sample, 128 MB in all


def cache(context: str) -> None:
    ds = fastcollate.Cached(Megabytes())
    loader = fastcollate.DataLoader(ds, batch_size=8, num_workers=2, timeout=120, multiprocessing_context=context)
    for _ in range(2):
        seen = 0
        for b in loader:
            assert torch.equal(b[:, 0], torch.arange(seen, seen + 8, dtype=torch.float32)), "a batch arrived wrong"
            assert torch.equal(b[:, -1], b[:, 0]), "a batch arrived wrong"
            seen += 8
        assert seen == 128
    s = ds.stats()
    print("OK", s["hits"], s["misses"], s["bytes"], flush=True)


def main(which: str) -> None:
    if which.startswith("cache-"):
        return cache(which.split("-", 1)[1])
    kw = dict(batch_size=8, num_workers=2, timeout=60)  # 9.6 MB batches
    if which == "torch":
        loader = DataLoader(Big(), **kw)
    elif which == "torch+fastcollate.collate":
        loader = DataLoader(Big(), collate_fn=fastcollate.collate, **kw)
    elif which == "ring":
        loader = fastcollate.DataLoader(Big(), **kw)
    elif which == "fallback":  # slots too small: every batch takes the fallback arena
        loader = fastcollate.DataLoader(Big(), ring_max_bytes=4 << 20, **kw)
    else:
        raise SystemExit(f"unknown loader {which}")
    seen = 0
    for b in loader:
        assert torch.equal(b["x"][:, 0], b["y"].to(torch.float32)), "a batch arrived wrong"
        seen += b["y"].numel()
    assert seen == 32
    stats = loader.stats() if hasattr(loader, "stats") else {}
    print("OK", stats.get("ring_hits", "-"), stats.get("ring_fallbacks", "-"), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
