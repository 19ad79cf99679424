"""A small CNN trained on an image folder, end to end: fastcollate.images decodes, crops and
resizes the JPEGs into each batch, CudaPrefetcher normalizes on the device (the CPU here when no
GPU is visible), train_one_epoch steps. Without --root it writes a tiny folder of two classes
(bright and dark photos) first, so the run is self-contained and the loss must fall.

    python examples/image_folder_train.py                 # a made-up folder, 3 epochs
    python examples/image_folder_train.py --root train/   # your folder: root/<class>/<image>
"""
from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np
import torch

import fastcollate
import fastcollate.images as fi
from fastcollate.transforms import Normalize


def make_folder(root: str, per_class: int = 48) -> None:
    from PIL import Image

    rng = np.random.default_rng(0)
    for label, level in (("dark", 60), ("bright", 190)):
        os.makedirs(os.path.join(root, label), exist_ok=True)
        for i in range(per_class):
            h, w = int(rng.integers(80, 140)), int(rng.integers(80, 140))
            img = np.clip(rng.normal(level, 30, (h, w, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(img).save(os.path.join(root, label, f"{i:03d}.jpg"), quality=85)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--root")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--workers", default="0", help='an int, or "auto"')
    args = ap.parse_args()
    root = args.root or tempfile.mkdtemp(prefix="fastcollate-example-")
    if args.root is None:
        make_folder(root)
    train = fi.ImageFolder(root, transform=fi.RandomResizedCrop(args.size, scale=(0.3, 1.0), flip=0.5), seed=0)
    workers = args.workers if args.workers == "auto" else int(args.workers)
    loader = fastcollate.DataLoader(train, batch_size=args.batch_size, shuffle=True, num_workers=workers)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    norm = Normalize(mean=[0.5, 0.5, 0.5], std=[0.25, 0.25, 0.25], dtype=torch.float32, keys=[0])
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, stride=2, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, 3, stride=2, padding=1), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, len(train.classes))).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)

    def forward(model, batch):
        x, y = batch
        return torch.nn.functional.cross_entropy(model(x), y)

    print(f"{len(train)} images, classes {train.classes}, JPEG stage "
          f"{'compiled' if fi.available() else 'absent: ' + str(fi.why_not())}")
    for epoch in range(args.epochs):
        train.set_epoch(epoch)
        batches = fastcollate.CudaPrefetcher(loader, device=device, transform=norm)
        stats = fastcollate.train_one_epoch(model, batches, optimizer, forward=forward)
        print(f"epoch {epoch}: {stats.steps} steps, mean loss {stats.loss:.3f}, "
              f"{stats.samples_per_s:.0f} samples/s")
    print("fallbacks to Pillow:", train.stats()["fallbacks"])


if __name__ == "__main__":
    main()
