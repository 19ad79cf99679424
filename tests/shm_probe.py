"""Run inside a private mount namespace with a tiny /dev/shm (tests/test_containers.py): one
loader's epoch of 9.6 MB batches; prints OK and the loader's stats, or dies as torch's does.
``cache-fork`` / ``cache-spawn`` (tests/test_cache.py): 134 MB of samples in a fastcollate.Cached
filled by two workers in epoch 1 and read by them in epoch 2; prints OK, hits, misses, bytes.
``cache-strategy-<file_system|file_descriptor>-<spawn|forkserver>``: a 64 MB cache read in the main
process first, then filled and read by two workers under that sharing strategy, then read again in
the main process; prints OK, hits, misses and the bytes of /dev/shm files of the main process's."""
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


class Rows(Dataset):
    def __len__(self):
        return 32

    def __getitem__(self, i):
        return torch.full((16_384,), float(i))  # 64 KB a sample


def cache_strategy(strategy: str, context: str) -> None:
    import os

    import torch.multiprocessing

    torch.multiprocessing.set_sharing_strategy(strategy)
    ds = fastcollate.Cached(Rows(), max_bytes=64 << 20)
    for i in (0, 1, 1):  # the main process maps the data segment and reads it first
        assert torch.equal(ds[i], Rows()[i]), "a sample read wrong"
    loader = DataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context=context, persistent_workers=True,
                        timeout=120)
    for _ in range(2):
        seen = 0
        for b in loader:
            assert torch.equal(b[:, 0], torch.arange(seen, seen + 4, dtype=torch.float32)), "a batch arrived wrong"
            seen += 4
        assert seen == 32
    for i in range(32):  # the main process reads what the workers inserted, through its mapping
        assert torch.equal(ds[i], Rows()[i]), "a sample read wrong after the workers"
    mine = f"torch_{os.getpid()}_"
    shm = sum(os.path.getsize(os.path.join("/dev/shm", f)) for f in os.listdir("/dev/shm") if f.startswith(mine))
    s = ds.stats()
    print("OK", s["hits"], s["misses"], shm, flush=True)


def main(which: str) -> None:
    if which.startswith("cache-strategy-"):
        return cache_strategy(*which.split("-")[2:])
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
