"""A small end-to-end training run on embedded data: the stall breakdown of `fastcollate bench`
and `fastcollate doctor`."""
from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import torch
from torch.utils.data import DataLoader, Dataset, default_collate

from . import noise
from ..core.collator import collate
from ..training.monitor import StallMonitor
from ..training.loop import train_one_epoch


class SyntheticImages(Dataset):
    """uint8 images and int labels, made on the fly (a little CPU work per sample, like decoding)."""

    def __init__(self, n: int = 2048, size: int = 32, classes: int = 10, work: int = 0) -> None:
        self.n, self.size, self.classes, self.work = n, size, classes, work

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        g = torch.Generator().manual_seed(i)
        img = torch.randint(0, 256, (3, self.size, self.size), dtype=torch.uint8, generator=g)
        for _ in range(self.work):  # simulated decode / augmentation cost
            img = img.flip(-1)
        return {"image": img, "label": i % self.classes}


def small_convnet(classes: int = 10) -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(), torch.nn.Linear(32, classes))


def _forward(model: torch.nn.Module, batch: dict[str, Any]) -> torch.Tensor:
    x = batch["image"].float().div_(255)
    return torch.nn.functional.cross_entropy(model(x), batch["label"])


def run(collate_fn: Callable = collate, *, n: int = 1024, batch_size: int = 64, num_workers: int = 0,
        work: int = 0, seed: int = 0, dataset: Dataset | None = None,
        forward: Callable | None = None, trace: bool = False) -> dict[str, Any]:
    """Train one epoch; return samples/s, loss and the StallMonitor report."""
    torch.manual_seed(seed)
    model = small_convnet()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ds = dataset if dataset is not None else SyntheticImages(n, work=work)
    loader = DataLoader(ds, batch_size=batch_size, num_workers=num_workers, collate_fn=collate_fn)
    mon = StallMonitor(trace=trace)
    t0 = time.perf_counter()
    try:
        stats = train_one_epoch(model, loader, opt, amp_dtype=torch.bfloat16, monitor=mon,
                                forward=forward or _forward)
    finally:
        mon.close()
    return {"collate": "fastcollate" if collate_fn is collate else getattr(collate_fn, "__name__", "custom"),
            "samples_per_s": stats.samples_per_s, "loss": stats.loss, "wall_s": time.perf_counter() - t0,
            "report": mon.report(), "summary": mon.summary()}


def compare(rounds: int = 1, **kw: Any) -> list[dict[str, Any]]:
    """default_collate's run and fastcollate's, alternating for ``rounds`` rounds: each row has the
    median samples/s and every round's; fastcollate's row also the ratio to default_collate's (the
    median of the per-round ratios, with its spread) and the last run's report and summary."""
    runs: dict[str, list[dict[str, Any]]] = {"default": [], "fast": []}
    for _ in range(rounds):
        runs["default"].append(run(default_collate, **kw))
        runs["fast"].append(run(collate, **kw))
    rows = []
    for key in ("default", "fast"):
        last = dict(runs[key][-1])
        per_round = [r["samples_per_s"] for r in runs[key]]
        last.update(samples_per_s=statistics.median(per_round), rounds_samples_per_s=per_round, rounds=rounds)
        rows.append(last)
    vs = noise.spread(noise.ratio_rounds(rows[1]["rounds_samples_per_s"], rows[0]["rounds_samples_per_s"]))
    rows[1].update(vs_default_collate=vs["median"], spread={"vs default_collate": vs},
                   description="end-to-end: fastcollate vs default_collate")
    return rows
