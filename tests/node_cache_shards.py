"""Run under torchrun by tests/test_node_cache.py: ranks that wrap *different* datasets of one
type and length in ``fastcollate.Cached`` (each rank its own shard: samples seeded by the rank).

Rank 0 wraps its shard and loads it whole through ``fastcollate.DataLoader`` (one worker); then
rank 1 does the same, so rank 1 always joins a cache rank 0 has filled. ``--key``: each rank
passes ``key=f"shard-{rank}"``. Each rank writes ``rank<r>.json``: whether it was refused (and
the message), else whether every batch equals its own shard's samples, the cache's inode and
whether it made the cache.
"""
from __future__ import annotations

import argparse
import json
import os

import torch
import torch.distributed as dist
from torch.utils.data import Dataset

import fastcollate
from fastcollate.core.shm import segment_fd

SAMPLES, ROW = 64, 1024


class Shard(Dataset):
    def __init__(self, shard: int) -> None:
        self.shard = shard

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> dict:
        g = torch.Generator().manual_seed(1000 * self.shard + i)
        return {"x": torch.randint(0, 256, (ROW,), dtype=torch.uint8, generator=g), "y": i}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--key", action="store_true")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    report: dict = {"rank": rank}
    ds = None
    for turn in range(dist.get_world_size()):
        if turn == rank:
            try:
                ds = fastcollate.Cached(Shard(rank), key=f"shard-{rank}" if args.key else None)
            except ValueError as exc:
                report["refused"] = str(exc)
            if ds is not None:
                want = Shard(rank)
                equal = True
                for batch in fastcollate.DataLoader(ds, batch_size=16, num_workers=1):
                    for x, y in zip(batch["x"], batch["y"].tolist()):
                        equal &= torch.equal(x, want[y]["x"])
                report.update(equal=equal, made=ds._node.made, inode=os.fstat(segment_fd(ds.data)[0]).st_ino,
                              hits=ds.stats()["rank"]["hits"])
        dist.barrier()
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump(report, f)
    dist.barrier()  # every rank has measured before any lets its cache go
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
