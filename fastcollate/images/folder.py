"""fastcollate.images.ImageFolder: torchvision's ImageFolder layout and order (a folder per
class, classes sorted, files sorted within each), its samples decoded, cropped, resized and
flipped by the engine -- a whole batch per call from ``__getitems__``.

A sample's box depends on (seed, epoch, index) alone (fastcollate.images.boxes). The epoch lives
in a small shared tensor, so ``set_epoch`` in the main process reaches every worker, persistent
ones included (each batch reads it). ``fastcollate.DataLoader`` advances it at each new epoch
when you never call ``set_epoch`` yourself; with torch's DataLoader call it each epoch, as you
do for a DistributedSampler (well over an epoch's samples at one epoch, counted across workers, says so once).
"""
from __future__ import annotations

import os
import time
import warnings
from typing import Any, Sequence

import torch
from torch.utils.data import Dataset

from .. import _ext
from ..core import trace as _trace
from .boxes import Box, CenterCrop, RandomResizedCrop
from .collate import ImageBatch, Stats, decode_threads, arena_for, run_batch
from .decoding import DecodeError, Source, as_bytes, default_max_pixels, inspect_many

__all__ = ["ImageFolder", "IMG_EXTENSIONS", "find_classes", "make_dataset"]

# torchvision's IMG_EXTENSIONS, matched case-insensitively as it matches them
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def find_classes(root: str) -> tuple[list[str], dict[str, int]]:
    """The class folders of ``root``, sorted, and their indices (torchvision's rule)."""
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
    if not classes:
        raise FileNotFoundError(f"fastcollate.images.ImageFolder: no class folder in {root}")
    return classes, {c: i for i, c in enumerate(classes)}


def make_dataset(root: str, class_to_idx: dict[str, int], extensions: Sequence[str]) -> list[tuple[str, int]]:
    """(path, class index) of every file with one of ``extensions``, in torchvision's order."""
    exts = tuple(e.lower() for e in extensions)
    out: list[tuple[str, int]] = []
    for cls in sorted(class_to_idx):
        target = os.path.join(root, cls)
        for dirpath, _, names in sorted(os.walk(target, followlinks=True)):
            for name in sorted(names):
                if name.lower().endswith(exts):
                    out.append((os.path.join(dirpath, name), class_to_idx[cls]))
    found = {c for _, c in out}
    empty = [cls for cls, i in sorted(class_to_idx.items(), key=lambda kv: kv[1]) if i not in found]
    if empty:  # torchvision's ImageFolder refuses them too (allow_empty=False)
        raise FileNotFoundError(f"fastcollate.images.ImageFolder: no file with one of {tuple(extensions)} in the "
                                f"class folder(s) {', '.join(empty)} of {root}")
    return out


class ImageFolder(Dataset):
    """Images in class folders (``root/<class>/<file>``), as torchvision's ImageFolder finds them;
    sample i is ``(uint8 [3, H, W], class index)`` after ``transform``.

    Args:
        root: the folder of class folders.
        transform: :class:`RandomResizedCrop` (training) or :class:`CenterCrop` (evaluation);
            None: the whole decoded image (sizes differ: collate with a collate_fn of yours).
        seed: with the epoch and the index, all a sample's randomness depends on.
        extensions: the files taken (torchvision's ``IMG_EXTENSIONS`` by default, any case).
        max_pixels: images larger than this are refused (default: where Pillow refuses,
            twice its ``Image.MAX_IMAGE_PIXELS``).
        threads: decode threads in the main process (default ``min(4, cores)``; in a DataLoader
            worker, the collate's: 1 unless its Collator says otherwise).

    >>> import tempfile, os, numpy as np
    >>> from PIL import Image
    >>> root = tempfile.mkdtemp()
    >>> for c in ("cat", "dog"):
    ...     os.makedirs(os.path.join(root, c))
    ...     Image.fromarray(np.zeros((40, 60, 3), np.uint8)).save(os.path.join(root, c, "1.jpg"))
    >>> ds = ImageFolder(root, transform=RandomResizedCrop(32, flip=0.5), seed=0)
    >>> ds.classes, ds[1][0].shape, ds[1][1]
    (['cat', 'dog'], torch.Size([3, 32, 32]), 1)
    """

    # the epoch is in shared memory: persistent workers follow set_epoch (the doctor reads this)
    epoch_reaches_workers = True

    def __init__(self, root: str | os.PathLike, transform: RandomResizedCrop | CenterCrop | None = None,
                 seed: int = 0, extensions: Sequence[str] = IMG_EXTENSIONS, max_pixels: int | None = None,
                 threads: int | None = None) -> None:
        if transform is not None and not isinstance(transform, (RandomResizedCrop, CenterCrop)):
            raise TypeError(f"fastcollate.images.ImageFolder: transform must be a fastcollate.images "
                            f"RandomResizedCrop or CenterCrop (or None), got {type(transform).__name__}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"fastcollate.images.ImageFolder: seed must be an int, got {seed!r}")
        self.root = os.fspath(root)
        self.transform = transform
        self.seed = seed
        self.extensions = tuple(extensions)
        self.max_pixels = default_max_pixels() if max_pixels is None else int(max_pixels)
        self.threads = threads
        self.classes, self.class_to_idx = find_classes(self.root)
        self.samples = make_dataset(self.root, self.class_to_idx, self.extensions)
        if not self.samples:
            raise FileNotFoundError(f"fastcollate.images.ImageFolder: no file with one of {self.extensions} under "
                                    f"{self.root}")
        self.targets = [t for _, t in self.samples]
        self.imgs = self.samples
        # shared, so every worker reads the epoch: [epoch, set by the user, loader passes begun,
        # samples decoded in loader batches at epoch [4], said already]
        self._epoch = torch.zeros(6, dtype=torch.int64).share_memory_()
        self.stats_ = Stats()

    def _fastcollate_identity(self) -> Any:
        """What its samples depend on, for the node cache's fingerprint
        (fastcollate.cache.identity): not the epoch, counters or this process's notes."""
        return (self.root, self.transform, self.seed, self.extensions, self.max_pixels, self.samples)

    # -- the epoch
    def set_epoch(self, epoch: int) -> None:
        """The epoch the next boxes are drawn for, in every worker (persistent ones too)."""
        self._epoch[0] = int(epoch)
        self._epoch[1] = 1

    @property
    def epoch(self) -> int:
        return int(self._epoch[0])

    def _loader_epoch(self) -> None:
        """fastcollate.DataLoader's call at each pass it begins: from the second pass on (of any
        loader over this dataset), the next epoch, unless the user sets them."""
        if int(self._epoch[2]) and not int(self._epoch[1]):
            self._epoch[0] += 1
        self._epoch[2] += 1

    def __len__(self) -> int:
        return len(self.samples)

    def __repr__(self) -> str:
        return f"ImageFolder({self.root!r}, {len(self)} images, {len(self.classes)} classes, transform={self.transform})"

    def stats(self) -> dict[str, Any]:
        """This process's image batches: how many images, how many went through Pillow, and the
        seconds spent reading, decoding and resizing (a worker counts its own)."""
        return self.stats_.as_dict()

    # -- what a sample is
    def _name(self, i: int) -> str:
        return f"{self.samples[i][0]} (index {i})"

    def _sources(self, indices: Sequence[int], threads: int) -> list[Source]:
        C = _ext._C
        t0 = time.perf_counter()
        paths = [self.samples[i][0] for i in indices]
        if C is not None:
            files = C.image_read(paths, threads)
        else:
            files = []
            for p in paths:
                try:
                    with open(p, "rb") as f:
                        files.append(as_bytes(f.read()))
                except OSError as exc:
                    files.append(exc.strerror or str(exc))
        t1 = time.perf_counter()
        self.stats_.read_s += t1 - t0
        _trace.note_fetch_part("read files", t0, t1)
        for i, data in zip(indices, files):
            if isinstance(data, str):
                raise DecodeError(f"fastcollate.images: {self._name(i)} cannot be read: {data}")
        return inspect_many(files, [self._name(i) for i in indices], self.max_pixels)

    def _check_index(self, i: Any) -> int:
        if isinstance(i, torch.Tensor) and i.dim() == 0:
            i = int(i)
        if isinstance(i, bool) or not hasattr(i, "__index__"):
            raise TypeError(f"fastcollate.images.ImageFolder: an index must be an int, got {type(i).__name__}")
        i = i.__index__()
        n = len(self.samples)
        if not -n <= i < n:
            raise IndexError(f"fastcollate.images.ImageFolder: index {i} out of range for {n} images")
        return i % n

    def _box(self, i: int, height: int, width: int, epoch: int) -> Box:
        return self.transform.box(height, width, self.seed, epoch, i)

    def crop_box(self, i: int) -> tuple[int, int, int, int, bool]:
        """(top, left, height, width, flipped): sample i's box this epoch, in decoded pixels."""
        i = self._check_index(i)
        if self.transform is None:
            raise ValueError("fastcollate.images.ImageFolder: no transform, no box")
        src = self._sources([i], 1)[0]
        box = self._box(i, src.height, src.width, self.epoch)
        return tuple(self.transform.plan(box, src.height, src.width, src.engine).box)  # type: ignore[return-value]

    def _note_repeats(self, n: int, epoch: int) -> None:
        """Counts the samples loader batches decoded at this epoch, in every process (the counts
        are shared: fresh workers each epoch add to the same ones); well past one epoch's worth
        without a new epoch, says once that the crops repeat."""
        e = self._epoch
        if int(e[1]) or int(e[5]):
            return
        if int(e[4]) != epoch:
            e[4], e[3] = epoch, 0
        e[3] += n
        if int(e[3]) > 1.5 * len(self.samples) + n:
            e[5] = 1
            warnings.warn(f"fastcollate.images.ImageFolder: {int(e[3])} samples decoded at epoch {epoch} of a "
                          f"{len(self.samples)}-image folder: a new epoch without set_epoch repeats the last epoch's "
                          "crops. Call dataset.set_epoch(epoch) each epoch (fastcollate.DataLoader advances it for "
                          "you; a sampler with replacement draws more on purpose)", stacklevel=3)

    def _decode(self, indices: Sequence[int], alloc: Any, threads: int | None, batch: bool = True
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """(images [B, 3, H, W], labels [B]) of ``indices``, in one arena from ``alloc``
        (``batch``: a loader's batch, whose indices an epoch draws once each)."""
        idx = [self._check_index(i) for i in indices]
        if not idx:
            raise ValueError("fastcollate.images.ImageFolder: an empty batch")
        threads = decode_threads(threads if threads is not None else self.threads)
        epoch = self.epoch
        sources = self._sources(idx, threads)
        plans = [self.transform.plan(self._box(i, s.height, s.width, epoch), s.height, s.width, s.engine)
                 for i, s in zip(idx, sources)]
        images, labels = arena_for(len(idx), self.transform.size, alloc)
        run_batch(sources, plans, self.transform.size, images, threads, self.stats_)
        if batch:
            self._note_repeats(len(idx), epoch)
        labels.copy_(torch.tensor([self.samples[i][1] for i in idx], dtype=torch.int64))
        return images, labels

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        i = self._check_index(i)
        if self.transform is None:
            from .decoding import decode

            src = self._sources([i], 1)[0]
            return decode(src.data, max_pixels=self.max_pixels), self.samples[i][1]
        images, labels = self._decode([i], lambda n: torch.empty(n, dtype=torch.uint8), 1, batch=False)
        return images[0], int(labels[0])

    def __getitems__(self, indices: Sequence[int]) -> Any:
        if self.transform is None:
            return [self[i] for i in indices]
        return ImageBatch(self, indices)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["stats_"] = Stats()  # a worker's own
        return state
