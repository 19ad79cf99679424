"""Arenas and RSS stay flat over many batches."""
import gc

import torch

import fastcollate


def _rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def test_arenas_and_rss_flat_over_1000_batches():
    batch = [{"img": torch.randint(0, 255, (3, 64, 64), dtype=torch.uint8), "y": i, "s": "x"} for i in range(32)]
    def loop(n):
        out = None
        for _ in range(n):
            out = fastcollate.collate(batch)  # like a training loop: the previous batch is alive meanwhile
        return out

    loop(50)  # warm-up: the pool reaches its steady state (two arenas)
    gc.collect()
    s0, rss0 = fastcollate.stats(), _rss_bytes()
    loop(1000)
    gc.collect()
    s1, rss1 = fastcollate.stats(), _rss_bytes()
    assert s1["arenas_in_use"] == s0["arenas_in_use"]
    assert s1["pool_bytes"] == s0["pool_bytes"]
    assert s1["arenas_allocated"] == s0["arenas_allocated"]
    assert s1["arenas_reused"] - s0["arenas_reused"] >= 999
    assert rss1 - rss0 < 8 << 20, f"RSS grew by {(rss1 - rss0) >> 20} MiB"
