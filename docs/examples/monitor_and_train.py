"""
Training with the stall monitor
===============================

``train_one_epoch`` runs the usual mixed-precision step without a host sync per step;
``StallMonitor(trace=True)`` follows every batch through the loader's stages and names the one
the loop waits for.
"""

# %%
import time

import torch

import fastcollate


class SlowDataset(torch.utils.data.Dataset):
    """Each sample costs 2 ms to make: a dataset-bound pipeline."""

    def __len__(self):
        return 256

    def __getitem__(self, i):
        time.sleep(0.002)
        return {"x": torch.full((16,), float(i % 7)), "y": i % 2}


model = torch.nn.Linear(16, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)


def forward(model, batch):
    return torch.nn.functional.cross_entropy(model(batch["x"]), batch["y"])


mon = fastcollate.StallMonitor(trace=True)
loader = fastcollate.DataLoader(SlowDataset(), batch_size=32, num_workers=2)
stats = fastcollate.train_one_epoch(model, loader, optimizer, forward=forward, monitor=mon)
print(f"{stats.steps} steps, skipped {stats.skipped_steps}, loss {stats.loss:.3f}")

# %%
# The report: the bottleneck, and each stage's time per batch.
report = mon.report()
print("bottleneck:", report["bottleneck"])
for stage, s in report["stages"].items():
    print(f"  {stage:<8} p50 {s['p50_ms']:7.2f} ms  ({s['count']} batches)")
mon.close()
