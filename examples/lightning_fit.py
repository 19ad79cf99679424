"""PyTorch Lightning with fastcollate.DataLoader: fit, then predict on the same loader, on the CPU
in seconds. Lightning re-creates the loader from its attributes for predict; the copy is again a
fastcollate.DataLoader with a ring of its own. The same run with torch's DataLoader gives the
same parameters and predictions, bitwise.

    python examples/lightning_fit.py [--workers 2] [--epochs 3]
"""
from __future__ import annotations

import argparse

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, Dataset

import fastcollate


class Regression(Dataset):
    def __init__(self, n: int = 1024) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 32, generator=g)
        self.y = self.x @ torch.randn(32, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict:
        return {"x": self.x[i], "y": self.y[i]}


class Net(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.mlp = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))

    def training_step(self, batch: dict, _: int) -> torch.Tensor:
        return torch.nn.functional.mse_loss(self.mlp(batch["x"]).squeeze(1), batch["y"])

    def predict_step(self, batch: dict, _: int) -> torch.Tensor:
        return self.mlp(batch["x"]).squeeze(1)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def run(loader_cls, args) -> tuple[Net, list, object]:
    torch.manual_seed(0)
    net = Net()
    loader = loader_cls(Regression(), batch_size=64, num_workers=args.workers, shuffle=True,
                        generator=torch.Generator().manual_seed(0), persistent_workers=args.workers > 0)
    kw = dict(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
              enable_model_summary=False)
    pl.Trainer(max_epochs=args.epochs, **kw).fit(net, train_dataloaders=loader)
    preds = pl.Trainer(**kw).predict(net, dataloaders=loader)
    return net, preds, loader


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--epochs", type=int, default=3)
    args = p.parse_args()
    ours, our_preds, loader = run(fastcollate.DataLoader, args)
    theirs, their_preds, _ = run(DataLoader, args)
    same = all(torch.equal(a, b) for a, b in zip(ours.parameters(), theirs.parameters())) and \
        all(torch.equal(a, b) for a, b in zip(our_preds, their_preds))
    print("parameters and predictions identical to torch's DataLoader:", same)
    print("fastcollate ring:", {k: v for k, v in loader.stats().items() if k in ("ring", "ring_hits", "ring_fallbacks")})
    if not same:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
