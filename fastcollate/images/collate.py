"""A batch of images into one arena: the engine's image jobs (decode the box, resize, window,
flip), every image of the batch a task on the pool with the GIL released; what the engine does
not decode goes through Pillow first and joins the batch as pixels. ``ImageBatch`` is what
``ImageFolder.__getitems__`` returns; ``decode_collate`` is the collate_fn for samples that
carry encoded bytes (WebDataset, 🤗 datasets, Ray Data's ``read_binary_files``)."""
from __future__ import annotations

import collections.abc
import itertools
import os
import time
from typing import Any, Callable, Sequence

import torch

from .. import _ext
from ..core import trace as _trace
from . import pil_reference as reference
from .boxes import CenterCrop, Plan, RandomResizedCrop
from .decoding import DecodeError, Source, count_route, as_bytes, available, default_max_pixels, inspect

__all__ = ["run_batch", "ImageBatch", "decode_collate", "Stats", "arena_for", "decode_threads"]


class Stats:
    """What one process's image batches cost: images, fallbacks, decode and resize seconds."""

    def __init__(self) -> None:
        self.images = self.fallbacks = self.batches = 0
        self.decode_s = self.resize_s = self.read_s = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"batches": self.batches, "images": self.images, "fallbacks": self.fallbacks,
                "read_s": self.read_s, "decode_s": self.decode_s, "resize_s": self.resize_s}


def decode_threads(threads: int | None) -> int:
    if threads is not None:
        return max(1, int(threads))
    from torch.utils.data import get_worker_info

    from ..core.collator import usable_cores

    return 1 if get_worker_info() is not None else min(4, usable_cores())


def run_batch(sources: Sequence[Source], plans: Sequence[Plan], out_hw: tuple[int, int], out: torch.Tensor,
              threads: int, stats: Stats | None = None) -> None:
    """Every image into ``out`` ([B, 3, *out_hw] uint8, contiguous). Raises DecodeError naming
    the first image that failed (and how many others did); ``out`` is then not to be used."""
    t0 = time.perf_counter()
    C = _ext._C
    fallbacks = [i for i, s in enumerate(sources) if not s.engine]
    for i in fallbacks:
        count_route(f"pillow: {sources[i].why}")
    if C is None:  # no engine: the reference, image by image
        for i, (s, p) in enumerate(zip(sources, plans)):
            out[i].copy_(reference.apply(s.pixels(), p, out_hw))
        decode_s, resize_s = time.perf_counter() - t0, 0.0
    else:
        jobs = []
        for s, p in zip(sources, plans):
            src = {"data": s.data} if s.engine else {"pixels": s.pixels()}
            jobs.append(C.ImageJob(**src, denom=p.denom, width=-(-s.width // p.denom), top=p.top, left=p.left, h=p.h, w=p.w,
                                   resize_h=p.resize_hw[0], resize_w=p.resize_hw[1], crop_top=p.crop_tl[0],
                                   crop_left=p.crop_tl[1], flip=p.flip, partial=True))
        errors, decode_s, resize_s = C.image_batch(out, jobs, threads)
        bad = [i for i, e in enumerate(errors) if e]
        if bad:
            more = f" ({len(bad) - 1} more images of this batch failed too)" if len(bad) > 1 else ""
            raise DecodeError(f"fastcollate.images: {sources[bad[0]].name} cannot be decoded: {errors[bad[0]]}{more}")
        count_route("engine", len(sources) - len(fallbacks))
    # the engine decodes and resizes image by image on every thread (Pillow's fallbacks before it):
    # one span of wall time, with the engine's CPU seconds split between the two
    _trace.note_fetch_part("decode + resize", t0, time.perf_counter(), decode_cpu_s=decode_s, resize_cpu_s=resize_s,
                           images=len(sources), fallbacks=len(fallbacks))
    if stats is not None:
        stats.batches += 1
        stats.images += len(sources)
        stats.fallbacks += len(fallbacks)
        stats.decode_s += decode_s
        stats.resize_s += resize_s


class ImageBatch(collections.abc.Sequence):
    """What ``ImageFolder.__getitems__`` returns: a sequence of (image, label) samples, and a
    batch fastcollate's collate decodes straight into its arena (``__fastcollate_gather__``).
    Any other collate_fn sees ordinary samples: on first access the whole batch is decoded in one
    engine call, and each sample is a view of it."""

    __slots__ = ("dataset", "indices", "_made")

    def __init__(self, dataset: Any, indices: Sequence[int]) -> None:
        self.dataset, self.indices, self._made = dataset, list(indices), None

    def __len__(self) -> int:
        return len(self.indices)

    def _samples(self) -> list[Any]:
        if self._made is None:
            images, labels = self.dataset._decode(self.indices, None, None)
            self._made = [(images[j], int(labels[j])) for j in range(len(self.indices))]
        return self._made

    def __getitem__(self, j: Any) -> Any:
        return self._samples()[j]

    def __iter__(self):
        return iter(self._samples())

    def __repr__(self) -> str:
        return f"ImageBatch({len(self)} images of {self.dataset!r})"

    def __fastcollate_gather__(self, alloc: Any, threads: int, pad: Any) -> Any:
        if pad is not None or self.dataset.transform is None or self._made is not None:
            return None  # the ordinary path: padding, or images of unequal sizes
        t0 = time.perf_counter()
        images, labels = self.dataset._decode(self.indices, alloc, threads)
        _trace.note_dataset_work(time.perf_counter() - t0)  # the trace names it the dataset's, as Pillow's was
        return [images, labels]


def arena_for(batch: int, out_hw: tuple[int, int], alloc: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, 3, H, W] uint8 and [B] int64 views of one arena (``alloc``: nbytes -> uint8 tensor;
    None: the engine's pool, else a fresh tensor)."""
    align = _ext._C.align if _ext._C is not None else 64  # the engine's leaf alignment, as every arena's
    img_bytes = batch * 3 * out_hw[0] * out_hw[1]
    at = -(-img_bytes // align) * align
    total = at + batch * 8
    if alloc is not None:
        arena = alloc(total)
    elif _ext._C is not None:
        arena = _ext._C.pool_allocate(total)
    else:
        arena = torch.empty(total, dtype=torch.uint8)
    images = arena[:img_bytes].view(batch, 3, out_hw[0], out_hw[1])
    labels = arena[at:at + batch * 8].view(torch.int64)
    return images, labels


# ---- decode_collate ------------------------------------------------------------------------------

_BYTES = (bytes, bytearray, memoryview)


def _encoded_at(sample: Any, key: Any) -> Any:
    """Where a sample keeps its encoded image: ``key`` if given; else a tuple's/list's first
    bytes element, a dict's first bytes value (or a 🤗 Image feature's {"bytes": ...})."""
    if key is not None:
        return key
    items = sample.items() if isinstance(sample, collections.abc.Mapping) else enumerate(sample)
    for k, v in items:
        if isinstance(v, _BYTES) or (isinstance(v, collections.abc.Mapping) and isinstance(v.get("bytes"), _BYTES)):
            return k
    raise TypeError(f"fastcollate.images.decode_collate: the sample ({type(sample).__name__}) has no encoded image "
                    "(bytes); pass key= to name it")


def decode_collate(transform: RandomResizedCrop | CenterCrop, *, key: Any = None, seed: int = 0,
                   collate_fn: Callable[[Any], Any] | None = None, max_pixels: int | None = None,
                   threads: int | None = None) -> Callable[[Sequence[Any]], Any]:
    """A collate_fn for samples that carry an encoded image -- ``(bytes, label, ...)`` tuples,
    ``{"jpg": bytes, "cls": 3}`` dicts (WebDataset), 🤗 datasets' ``{"image": {"bytes": ...}}``,
    Ray Data's ``{"bytes": ..., "path": ...}``: the images decoded, cropped and resized by
    ``transform`` in one engine call into a [B, 3, H, W] uint8 batch, the other fields collated
    by ``collate_fn`` (default fastcollate.collate). Streamed samples have no index: each box is
    drawn from (seed, the process's batch count, the position in the batch), so the crops are
    random but not the same for another number of workers.

    >>> import io, numpy as np, fastcollate.images as fi
    >>> from PIL import Image
    >>> buf = io.BytesIO(); Image.fromarray(np.zeros((40, 50, 3), np.uint8)).save(buf, "JPEG")
    >>> batch = fi.decode_collate(fi.CenterCrop(32))([(buf.getvalue(), 1), (buf.getvalue(), 0)])
    >>> batch[0].shape, batch[1].tolist()
    (torch.Size([2, 3, 32, 32]), [1, 0])
    """
    if not isinstance(transform, (RandomResizedCrop, CenterCrop)):
        raise TypeError(f"fastcollate.images.decode_collate: transform must be a fastcollate.images "
                        f"RandomResizedCrop or CenterCrop, got {type(transform).__name__}")
    counter = itertools.count()
    stats = Stats()
    limit = default_max_pixels() if max_pixels is None else max_pixels

    def collate(batch: Sequence[Any]) -> Any:
        from ..core.collator import collate as default

        if len(batch) == 0:
            raise ValueError("fastcollate.images.decode_collate: an empty batch")
        where = _encoded_at(batch[0], key)
        n = next(counter)
        worker = _worker()
        sources, plans = [], []
        for j, s in enumerate(batch):
            try:
                enc = s[where]
            except (KeyError, IndexError, TypeError) as exc:
                raise TypeError(f"fastcollate.images.decode_collate: sample {j} of the batch has no {where!r}") from exc
            if isinstance(enc, collections.abc.Mapping):
                enc = enc.get("bytes")
            name = f"sample {j} of the batch" + (f" ({s['path']})" if isinstance(s, dict) and "path" in s else "")
            src = inspect(as_bytes(enc), name, limit)
            box = transform.box(src.height, src.width, seed, (worker << 40) + n, j)
            sources.append(src)
            plans.append(transform.plan(box, src.height, src.width, src.engine))
        images, _ = arena_for(len(batch), transform.size, None)
        run_batch(sources, plans, transform.size, images, decode_threads(threads), stats)
        rest = [_without(s, where) for s in batch]
        out = (collate_fn or default)(rest)
        return _with(out, where, images, batch[0])

    collate.stats = stats.as_dict  # type: ignore[attr-defined]
    return collate


def _worker() -> int:
    from torch.utils.data import get_worker_info

    info = get_worker_info()
    return 0 if info is None else info.id + 1 + (os.getpid() << 8)


def _without(sample: Any, where: Any) -> Any:
    if isinstance(sample, collections.abc.Mapping):
        return {k: v for k, v in sample.items() if k != where}
    return [v for i, v in enumerate(sample) if i != where]


def _with(out: Any, where: Any, images: torch.Tensor, first: Any) -> Any:
    if isinstance(first, collections.abc.Mapping):
        merged = {}
        for k in first:
            merged[k] = images if k == where else out[k]
        return merged
    out = list(out)
    out.insert(where, images)
    return out
