"""The image-folder workload: JPEG files written at bench time (PIL), decoded per sample with the
usual train transforms done with PIL/numpy (random resized crop, horizontal flip) and returned as
torchvision's ``PILToTensor()`` returns them -- a uint8 CHW view of HWC memory (no torchvision
needed). The most common vision pipeline, and one where decoding is most of a sample's cost.

``python -m fastcollate doctor --dataset fastcollate._bench.image_bench:dataset`` diagnoses it.

The JPEGs live in a temporary folder owned by a ``Folder`` object: every dataset made from it holds
it, so the files last as long as a dataset that reads them, and are removed when the last one is
garbage-collected, at interpreter exit, or by ``Folder.cleanup()`` -- on an error or Ctrl-C too, and
only by the process that wrote them (a forked worker that drops its copy removes nothing).
"""
from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset


def _remove(path: str, owner_pid: int) -> None:
    if os.getpid() == owner_pid:  # a forked child's copy never removes its parent's files
        shutil.rmtree(path, ignore_errors=True)


class Folder:
    """A temporary folder of JPEGs, removed when this object is collected, at interpreter exit,
    or on ``cleanup()`` (also as a context manager)."""

    def __init__(self, n: int = 256, size: int = 320, seed: int = 0) -> None:
        self.path = tempfile.mkdtemp(prefix="fastcollate-images-")
        self._finalizer = weakref.finalize(self, _remove, self.path, os.getpid())
        try:
            self.items = write_folder(self.path, n, size, seed=seed)
        except BaseException:
            self.cleanup()
            raise

    def cleanup(self) -> None:
        self._finalizer()

    @property
    def removed(self) -> bool:
        return not self._finalizer.alive

    def __enter__(self) -> "Folder":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.cleanup()

    def __reduce__(self) -> Any:
        raise TypeError("a Folder owns its files in one process; pickle the ImageFolder, which leaves it behind")


# one folder per (n, size) while a dataset holds it: datasets made again share the files
_FOLDERS: "weakref.WeakValueDictionary[tuple[int, int], Folder]" = weakref.WeakValueDictionary()


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
    """(image, label): decode, random resized crop to ``crop``, random flip, CHW uint8 view. The
    crop and flip of sample i are drawn from ``seed`` and i (the same every epoch: a benchmark's
    repeatable work), or, with ``seed=None``, afresh at every fetch, as a training pipeline does."""

    def __init__(self, items: list[tuple[str, int]], crop: int = 224, seed: int | None = 0,
                 folder: Folder | None = None) -> None:
        self.items, self.crop, self.seed = items, crop, seed
        self.folder = folder  # keeps the files alive as long as this dataset

    def __getstate__(self) -> dict[str, Any]:
        # to a worker (spawn, forkserver): the paths, not the ownership of the files
        return {**self.__dict__, "folder": None}

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        from PIL import Image

        path, label = self.items[i]
        rng = np.random.default_rng() if self.seed is None else np.random.default_rng((self.seed, i))
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
    """The workload's dataset; its JPEGs are written into a temporary folder that lives as long as
    a dataset holding it (one folder per (n, size), shared while any dataset holds it)."""
    folder = _FOLDERS.get((n, size))
    if folder is None:
        folder = _FOLDERS[(n, size)] = Folder(n, size)
    return ImageFolder(folder.items, crop, folder=folder)


def augmented(n: int = 256, size: int = 320, crop: int = 224) -> ImageFolder:
    """The same JPEGs with a new random crop and flip at every fetch (``doctor --dataset
    fastcollate._bench.image_bench:augmented``): a training pipeline, which no cache may serve."""
    ds = dataset(n, size, crop)
    return ImageFolder(ds.items, crop, seed=None, folder=ds.folder)


def collate_equal(a: Any, b: Any) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b))
