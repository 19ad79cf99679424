"""DistributedDataParallel training fed by fastcollate: one DataLoader per rank with a
DistributedSampler, CudaPrefetcher (cuda:LOCAL_RANK, or the CPU), train_one_epoch, and the
stall report gathered across ranks.

    torchrun --nproc_per_node=2 examples/ddp_train.py                # CPU (gloo) or GPUs (nccl)
    torchrun --nproc_per_node=2 examples/ddp_train.py --slow-rank 1  # watch the straggler
"""
from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler

import fastcollate


class Regression(Dataset):
    def __init__(self, n: int, delay: float = 0.0) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 16, generator=g)
        self.y = self.x @ torch.randn(16, generator=g)
        self.delay = delay

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict:
        if self.delay:
            time.sleep(self.delay)  # a slow rank: decoding, a slow disk...
        return {"x": self.x[i], "y": self.y[i], "idx": i}


class Recording(torch.optim.SGD):
    """SGD that keeps a device-side checksum of the parameters after every step (no sync)."""

    def __init__(self, params, **kw):
        super().__init__(params, **kw)
        self.checksums: list[torch.Tensor] = []

    def step(self, closure=None):
        out = super().step(closure)
        with torch.no_grad():
            self.checksums.append(torch.stack([p.double().sum() for g in self.param_groups for p in g["params"]]).sum())
        return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--samples", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--slow-rank", type=int, default=-1, help="this rank's dataset sleeps 2 ms per sample")
    ap.add_argument("--out", help="write each rank's results to OUT/rank<N>.json (the CI test reads them)")
    args = ap.parse_args()

    use_cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if use_cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if use_cuda:
        torch.cuda.set_device(local_rank)

    ds = Regression(args.samples, delay=0.002 if rank == args.slow_rank else 0.0)
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(ds, batch_size=args.batch_size, sampler=sampler, collate_fn=fastcollate.collate)
    prefetcher = fastcollate.CudaPrefetcher(loader)  # device=None: cuda:LOCAL_RANK under torchrun, else CPU
    torch.manual_seed(0)  # every rank starts from the same weights (DDP also broadcasts them)
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)).to(prefetcher.device)
    model = DDP(net, device_ids=[local_rank] if use_cuda else None)
    opt = Recording(model.parameters(), lr=0.05)
    seen: list[torch.Tensor] = []

    def forward(m, batch):
        seen.append(batch["idx"])
        return torch.nn.functional.mse_loss(m(batch["x"]).squeeze(1), batch["y"])

    monitor = fastcollate.StallMonitor(prefetcher, trace=True)  # each rank traces its own pipeline
    losses = []
    for epoch in range(args.epochs):
        prefetcher.set_epoch(epoch)  # reaches the DistributedSampler: a new shuffle each epoch
        stats = fastcollate.train_one_epoch(model, prefetcher, opt, forward=forward, monitor=monitor,
                                            amp_dtype=torch.bfloat16, accumulation_steps=2)
        losses.append(stats.loss)
    report = monitor.report(distributed=True)
    if rank == 0:
        print(f"losses per epoch (averaged over {world} ranks): {[round(l, 4) for l in losses]}")
        print(monitor.format(report))
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
            json.dump({"rank": rank, "world": world, "losses": losses,
                       "seen": [int(i) for t in seen for i in t.tolist()],
                       "checksums": [float(c) for c in opt.checksums],
                       "slowest_rank": report.get("slowest_rank"), "rank_wait_s": report.get("rank_wait_s"),
                       "bottleneck": report["bottleneck"],
                       "epochs": args.epochs, "samples": args.samples}, f)
    prefetcher.close()
    dist.barrier()  # no rank tears the group down while another is still using it
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
