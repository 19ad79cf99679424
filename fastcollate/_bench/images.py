"""The image-folder workload: JPEG files written at bench time (PIL), decoded per sample with the
usual train transforms done with PIL/numpy (random resized crop, horizontal flip) and returned as
torchvision's ``PILToTensor()`` returns them -- a uint8 CHW view of HWC memory (no torchvision
needed). The most common vision pipeline, and one where decoding is most of a sample's cost.

``python -m fastcollate doctor --dataset fastcollate._bench.images:dataset`` diagnoses it.
"""
from __future__ import annotations

import os
import tempfile
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

_FOLDERS: dict[tuple[int, int, int], str] = {}


def write_folder(root: str, n: int = 256, size: int = 320, classes: int = 10, seed: int = 0) -> list[tuple[str, int]]:
    """n JPEGs of about size x size (smooth noise, so they compress like photos), in class folders."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    items = []
    for i in range(n):
        label = i % classes
        folder = os.path.join(root, f"class{label}")
        os.makedirs(folder, exist_ok=True)
        h, w = size + int(rng.integers(-32, 33)), size + int(rng.integers(-32, 33))
        small = rng.integers(0, 256, (h // 8 + 1, w // 8 + 1, 3), dtype=np.uint8)
        img = Image.fromarray(small).resize((w, h), Image.BILINEAR)
        path = os.path.join(folder, f"{i:05d}.jpg")
        img.save(path, quality=90)
        items.append((path, label))
    return items


class ImageFolder(Dataset):
    """(image, label): decode, random resized crop to ``crop``, random flip, CHW uint8 view."""

    def __init__(self, items: list[tuple[str, int]], crop: int = 224, seed: int = 0) -> None:
        self.items, self.crop, self.seed = items, crop, seed

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        from PIL import Image

        path, label = self.items[i]
        rng = np.random.default_rng((self.seed, i))
        with Image.open(path) as im:
            img = im.convert("RGB")
        w, h = img.size
        area = w * h * rng.uniform(0.08, 1.0)
        ratio = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
        cw = int(min(w, max(8, round(np.sqrt(area * ratio)))))
        ch = int(min(h, max(8, round(np.sqrt(area / ratio)))))
        x, y = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
        img = img.resize((self.crop, self.crop), Image.BILINEAR, box=(x, y, x + cw, y + ch))
        if rng.random() < 0.5:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
        hwc = torch.from_numpy(np.asarray(img).copy())
        return hwc.permute(2, 0, 1), label  # what PILToTensor() returns: CHW over HWC memory


def dataset(n: int = 256, size: int = 320, crop: int = 224) -> ImageFolder:
    """The workload's dataset; its JPEGs are written once per process into a temporary folder."""
    key = (n, size, crop)
    if key not in _FOLDERS:
        _FOLDERS[key] = tempfile.mkdtemp(prefix="fastcollate-images-")
    root = _FOLDERS[key]
    items = sorted((os.path.join(dp, f), int(os.path.basename(dp)[5:]))
                   for dp, _, fs in os.walk(root) for f in fs if f.endswith(".jpg"))
    if len(items) != n:
        items = write_folder(root, n, size)
    return ImageFolder(items, crop)


def collate_equal(a: Any, b: Any) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b))
