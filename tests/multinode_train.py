"""One "node" of the multi-node test (tests/test_multinode.py launches two torchrun agents on this
host, each with --nnodes=2 --nproc_per_node=1 and a c10d rendezvous): fastcollate.DataLoader with
workers (the ring) + DistributedSampler + train_one_epoch on a DDP model (gloo) +
StallMonitor.report(distributed=True). `--slow` makes this node's dataset sleep per sample.
Each rank writes OUT/rank<RANK>.json: the indices it trained on per epoch, a hash of its
parameters' bytes after each epoch, the report's slowest rank, the ring's counters.

    torchrun --nnodes=2 --node_rank=0 --rdzv_backend=c10d --rdzv_endpoint=127.0.0.1:29400 \\
        --nproc_per_node=1 tests/multinode_train.py --out /tmp/mn        # and --node_rank=1 --slow
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import Dataset, DistributedSampler

import fastcollate


class Regression(Dataset):
    def __init__(self, n: int, delay: float) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 16, generator=g)
        self.y = self.x @ torch.randn(16, generator=g)
        self.delay = delay

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict:
        if self.delay:
            time.sleep(self.delay)  # this node's storage or decoding is slower
        return {"x": self.x[i], "y": self.y[i], "idx": i}


def param_hash(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--samples", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--slow", action="store_true", help="this node's dataset sleeps 4 ms per sample")
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    ds = Regression(args.samples, delay=0.004 if args.slow else 0.0)
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = fastcollate.DataLoader(ds, batch_size=args.batch_size, sampler=sampler, num_workers=args.workers)
    torch.manual_seed(rank)  # different initial weights on purpose: DDP broadcasts rank 0's
    model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    monitor = fastcollate.StallMonitor()
    seen: list[list[int]] = []
    hashes, losses = [], []

    def forward(m, batch):
        seen[-1].extend(batch["idx"].tolist())
        return torch.nn.functional.mse_loss(m(batch["x"]).squeeze(1), batch["y"])

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        seen.append([])
        stats = fastcollate.train_one_epoch(model, loader, opt, forward=forward, monitor=monitor)
        losses.append(stats.loss)
        hashes.append(param_hash(model.module))
    report = monitor.report(distributed=True)
    if rank == 0:
        print(monitor.format(report), flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump({"rank": rank, "world": world, "slow": args.slow, "node": os.environ.get("GROUP_RANK"),
                   "seen": seen, "hashes": hashes, "losses": losses, "slowest_rank": report.get("slowest_rank"),
                   "rank_wait_s": report.get("rank_wait_s"), "ring": loader.stats()}, f)
    dist.barrier()  # no rank tears the group down while another still uses it
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
