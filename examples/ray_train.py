"""Ray Data feeding a Ray Train ``TorchTrainer`` through fastcollate: each worker reads its
shard with ``iter_torch_batches(collate_fn=fastcollate.ray.ArrowCollate(...), device="cpu")`` --
token lists padded with a mask; with CUDA every batch one pinned arena, on the CPU the number
columns zero-copy views of Ray's batch and what is copied one arena -- and
``fastcollate.CudaPrefetcher`` moves it to the worker's device (one copy per batch on a GPU; on
the CPU it passes through).

    python examples/ray_train.py                 # a local cluster, 2 workers, CPU (GPUs when there are)
    python examples/ray_train.py --workers 2 --epochs 2 --out /tmp/ray_train

It checks its own claims and exits 1 if one fails: every row trained on exactly once per
epoch across the workers, every batch's copied columns one arena on the host (one copy per batch
on a GPU), the parameters identical on every worker after training.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import numpy as np
import torch

VOCAB, FEATURES = 64, 16


def make_rows(n: int) -> list[dict]:
    rng = np.random.default_rng(0)
    w = rng.standard_normal(FEATURES).astype(np.float32)
    rows = []
    for i in range(n):
        x = rng.standard_normal(FEATURES).astype(np.float32)
        ids = rng.integers(1, VOCAB, int(rng.integers(4, 33))).tolist()  # a token list of 4-32 tokens
        rows.append({"idx": i, "x": x, "ids": ids, "y": float(x @ w) + 0.01 * len(ids)})
    return rows


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, 8)
        self.head = torch.nn.Linear(FEATURES + 8, 1)

    def forward(self, batch: dict) -> torch.Tensor:
        mask = batch["attention_mask"].unsqueeze(-1).float()
        pooled = (self.emb(batch["ids"]) * mask).sum(1) / mask.sum(1)  # mean over the real tokens only
        return self.head(torch.cat([batch["x"], pooled], dim=1)).squeeze(1)


def train_loop(config: dict) -> None:
    import ray.train
    import ray.train.torch

    import fastcollate
    from fastcollate.device.transport import find_arena
    from fastcollate.ray import ArrowCollate

    ctx = ray.train.get_context()
    rank = ctx.get_world_rank()
    device = ray.train.torch.get_device()
    shard = ray.train.get_dataset_shard("train")
    torch.manual_seed(rank)  # different weights per worker: DDP broadcasts rank 0's
    model = ray.train.torch.prepare_model(Model())
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    # pad the token lists (mask and lengths made in the same arena); pin the arena where there is CUDA
    # (then every column is in it); unpinned, the columns Ray hands out zero-copy are views here too
    collate = ArrowCollate(pad={"ids": 0}, pad_to_multiple_of=8, pin_memory="auto")
    seen, losses, arenas, batches = [], [], 0, 0
    stats = {}
    for epoch in range(config["epochs"]):
        # device="cpu": Ray leaves the batch on the host as it is; the prefetcher moves the arena in one copy
        host = shard.iter_torch_batches(batch_size=config["batch_size"], collate_fn=collate, device="cpu")
        total = torch.zeros((), device=device)
        with fastcollate.CudaPrefetcher(host, device=device) as prefetcher:
            for batch in prefetcher:
                if device.type == "cpu":  # the batch as the collate made it: the padding and its mask one arena
                    arenas += find_arena({k: batch[k] for k in ("ids", "attention_mask")}) is not None
                batches += 1
                loss = torch.nn.functional.mse_loss(model(batch), batch["y"].float())
                opt.zero_grad()
                loss.backward()
                opt.step()
                total += loss.detach()
                seen += batch["idx"].tolist()
            stats = prefetcher.stats()
        losses.append(float(total))
    params = torch.cat([p.detach().flatten().double().cpu() for p in model.parameters()])
    result = {"rank": rank, "seen": seen, "losses": losses, "batches": batches, "arenas": arenas,
              "single_copy_batches": stats.get("single_copy_batches", 0), "device": str(device),
              "param_bytes": params.numpy().tobytes().hex()}
    with open(os.path.join(config["out"], f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    ray.train.report({"loss": losses[-1]})


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rows", type=int, default=512)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--out", help="where each worker writes its results (default: a temporary directory)")
    args = ap.parse_args()

    import ray
    import ray.data
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    out = args.out or tempfile.mkdtemp(prefix="ray_train_")
    os.makedirs(out, exist_ok=True)
    use_gpu = torch.cuda.is_available()
    # a local cluster: one CPU per worker, and as many again for Ray Data and the controller
    ray.init(num_cpus=2 * args.workers, include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    ds = ray.data.from_items(make_rows(args.rows))
    trainer = TorchTrainer(train_loop, scaling_config=ScalingConfig(num_workers=args.workers, use_gpu=use_gpu),
                           train_loop_config={"epochs": args.epochs, "batch_size": args.batch_size, "out": out},
                           datasets={"train": ds}, run_config=RunConfig(name="fastcollate_ray_train",
                                                                        storage_path=os.path.join(out, "storage")))
    trainer.fit()
    ray.shutdown()

    results = [json.load(open(os.path.join(out, f"rank{r}.json"))) for r in range(args.workers)]
    seen = sorted(i for r in results for i in r["seen"])
    once = seen == sorted(list(range(args.rows)) * args.epochs)
    one_arena = all((r["arenas"] if r["device"] == "cpu" else r["single_copy_batches"]) == r["batches"]
                    for r in results)
    identical = len({r["param_bytes"] for r in results}) == 1
    for r in results:
        print(f"worker {r['rank']} on {r['device']}: {r['batches']} batches, losses per epoch "
              f"{[round(x, 4) for x in r['losses']]}")
    print(f"every row once per epoch: {once}; every batch one arena / one copy: {one_arena}; "
          f"parameters identical on every worker: {identical}")
    return 0 if once and one_arena and identical else 1


if __name__ == "__main__":
    sys.exit(main())
