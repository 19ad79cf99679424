"""Run under torchrun by tests/test_node_cache.py: the node-wide cache as a user gets it.

Each rank wraps a deterministic dataset (8 MiB of uint8 rows) in ``fastcollate.Cached`` with
default arguments, loads it through ``fastcollate.DataLoader`` (one worker) with a shuffled
``DistributedSampler`` for 3 epochs, and checks every batch against torch's DataLoader over the
same dataset uncached (bitwise). The dataset counts its own fetches (the cache's misses, workers
included), so each rank's hits per epoch are counted outside the cache. It writes
``rank<r>.json``: per epoch the samples, fetches and hits; the cache's memfd inode, its shared
bytes (the memfd's allocated blocks) and the dataset's bytes; its max_bytes and whether it made
the cache. ``--fail-once``: rank 1 crashes after the first epoch of the first attempt, and
torchrun (``--max-restarts``) restarts every rank; the report is the second attempt's.
"""
from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, DistributedSampler

import fastcollate
from fastcollate.core.shm import segment_fd

SAMPLES, ROW = 256, 32 * 1024  # 8 MiB
EPOCHS, BATCH = 3, 16


class Rows(Dataset):
    """Row i: ROW random bytes seeded by i, and its label; ``fetched`` counts the fetches in this
    process and its workers (shared memory)."""

    def __init__(self) -> None:
        self.fetched = torch.zeros(SAMPLES, dtype=torch.int64).share_memory_()

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> dict:
        self.fetched[i] += 1
        g = torch.Generator().manual_seed(i)
        return {"x": torch.randint(0, 256, (ROW,), dtype=torch.uint8, generator=g), "y": i}


class FileBarrier:
    """A barrier by files in the output directory, for the restart run: torch 2.13's restarted
    gloo ranks fail to connect about one time in three here (a restarted rank reads the address
    its predecessor left in the store), with or without a cache, so that run leaves gloo out."""

    def __init__(self, out: str, attempt: int, rank: int, world: int) -> None:
        self.out, self.attempt, self.rank, self.world, self.n = out, attempt, rank, world, 0

    def __call__(self) -> None:
        self.n += 1
        mark = os.path.join(self.out, f"barrier-{self.attempt}-{self.n}-")
        open(mark + str(self.rank), "w").close()
        while not all(os.path.exists(mark + str(r)) for r in range(self.world)):
            time.sleep(0.01)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--fail-once", action="store_true",
                        help="rank 1 dies after the first epoch of the first attempt (torchrun then restarts all)")
    args = parser.parse_args()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if args.fail_once:
        barrier = FileBarrier(args.out, attempt, rank, world)
    else:
        dist.init_process_group("gloo")
        barrier = dist.barrier
    base = Rows()
    ds = fastcollate.Cached(base)  # default arguments: node-wide under torchrun
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = fastcollate.DataLoader(ds, batch_size=BATCH, sampler=sampler, num_workers=1)
    plain = Rows()  # the uncached run, over its own copy of the dataset
    plain_sampler = DistributedSampler(plain, num_replicas=world, rank=rank, shuffle=True, seed=0)
    plain_loader = DataLoader(plain, batch_size=BATCH, sampler=plain_sampler)
    epochs = []
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        plain_sampler.set_epoch(epoch)
        before, rank_before = int(base.fetched.sum()), ds.stats()["rank"]
        seen, equal = 0, True
        for got, want in zip(loader, plain_loader, strict=True):
            seen += len(got["y"])
            equal &= torch.equal(got["x"], want["x"]) and torch.equal(got["y"], want["y"])
        fetches = int(base.fetched.sum()) - before
        rank_stats = ds.stats()["rank"]
        epochs.append({"samples": seen, "fetches": fetches, "hits": seen - fetches,
                       "cache_misses": rank_stats["misses"] - rank_before["misses"],
                       "cache_hits": rank_stats["hits"] - rank_before["hits"], "batches_equal": equal})
        barrier()  # as a DDP step's all-reduce would: every rank's epoch is in before the next
        if args.fail_once and attempt == 0 and rank == 1:
            os._exit(3)  # a crash: no exit handler runs
    fd = segment_fd(ds.data)[0]
    st = os.fstat(fd)
    s = ds.stats()
    report = {"rank": rank, "epochs": epochs, "inode": st.st_ino, "shared_bytes": st.st_blocks * 512,
              "dataset_bytes": SAMPLES * ROW, "dataset_samples": SAMPLES, "max_bytes": ds.max_bytes,
              "made": ds._node is not None and ds._node.made,
              "node": s["node"], "holders": s["holders"], "node_inserts": s["inserts"],
              "fetched_twice": int((base.fetched > 1).sum()), "attempt": attempt}
    with open(ds._node.path) as f:
        report["keeper"] = json.load(f).get("keeper")
    barrier()  # every rank has measured before any lets the cache go
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump(report, f)
    print(f"rank {rank}: hits per epoch {[e['hits'] for e in epochs]} of {[e['samples'] for e in epochs]}; "
          f"shared {report['shared_bytes']} bytes for a {report['dataset_bytes']}-byte dataset", flush=True)
    if not args.fail_once:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
