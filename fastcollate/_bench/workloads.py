"""Embedded synthetic workloads for the benchmarks: the shapes of real pipelines, no files."""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch

SMALL_KEYS = tuple(f"feat{k}" for k in range(12))
FLOAT_KEYS = ("score", "weight", "ratio", "scale")


def images_u8(n: int = 256) -> list[dict[str, Any]]:
    g = torch.Generator().manual_seed(0)
    return [{"image": torch.randint(0, 256, (3, 224, 224), dtype=torch.uint8, generator=g), "label": i % 1000}
            for i in range(n)]


def images_f32(n: int = 128) -> list[tuple[torch.Tensor, int]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(3, 224, 224, generator=g), i % 1000) for i in range(n)]


def small_fields(n: int = 1024) -> list[dict[str, Any]]:
    """12 small tensors + 4 floats + an int + a str per sample (tabular / recsys style)."""
    g = torch.Generator().manual_seed(2)
    out = []
    for i in range(n):
        s: dict[str, Any] = {k: torch.randn(8, generator=g) for k in SMALL_KEYS}
        s.update({k: float(i) / (j + 1) for j, k in enumerate(FLOAT_KEYS)})
        s["label"] = i % 7
        s["id"] = f"row-{i}"
        out.append(s)
    return out


def numpy_samples(n: int = 256) -> list[tuple[np.ndarray, np.int64]]:
    rng = np.random.default_rng(3)
    return [(rng.standard_normal((3, 64, 64), dtype=np.float32), np.int64(i)) for i in range(n)]


def nested(n: int = 256) -> list[dict[str, Any]]:
    g = torch.Generator().manual_seed(4)
    return [{"a": {"b": [torch.randn(16, generator=g), torch.randn(16, generator=g)], "c": (i, float(i))},
             "d": [{"e": torch.randn(4, 4, generator=g), "f": "x"}], "g": torch.randint(0, 9, (32,), generator=g)}
            for i in range(n)]


def tiny(n: int = 4) -> list[dict[str, Any]]:
    return images_u8(n)


def pil_images(n: int = 64) -> list[dict[str, Any]]:
    """What torchvision's PILToTensor / ToImage return: CHW views of HWC uint8 memory."""
    g = torch.Generator().manual_seed(6)
    return [{"image": torch.randint(0, 256, (224, 224, 3), dtype=torch.uint8, generator=g).permute(2, 0, 1),
             "label": i % 1000} for i in range(n)]


def many_fields(n: int = 2048) -> list[dict[str, Any]]:
    """20 fields per sample: 8 small tensors (4 floats), 6 ints, 6 floats."""
    g = torch.Generator().manual_seed(7)
    return [{**{f"t{k}": torch.randn(4, generator=g) for k in range(8)}, **{f"i{k}": i + k for k in range(6)},
             **{f"f{k}": i / (k + 1) for k in range(6)}} for i in range(n)]


def channels_last_clips(n: int = 32) -> list[torch.Tensor]:
    """Video clips made channels_last: [4, 3, 112, 112] each (default_collate keeps the format)."""
    g = torch.Generator().manual_seed(8)
    return [torch.randn(4, 3, 112, 112, generator=g).contiguous(memory_format=torch.channels_last) for _ in range(n)]


WORKLOADS: dict[str, tuple[str, Callable[[], list]]] = {
    "images_u8": ("256 x {uint8 3x224x224, int}", images_u8),
    "images_f32": ("128 x (float32 3x224x224, int)", images_f32),
    "small_fields": ("1024 x (12 small tensors, 4 floats, int, str)", small_fields),
    "numpy": ("256 x (numpy float32 3x64x64, np.int64)", numpy_samples),
    "nested": ("256 x nested dicts/lists", nested),
    "tiny": ("4 x {uint8 3x224x224, int}", tiny),
    "pil_images": ("64 x {uint8 CHW view of HWC 224x224, int}", pil_images),
    "many_fields": ("2048 x 20 fields (8 tensors, 6 ints, 6 floats)", many_fields),
    "channels_last": ("32 x float32 4x3x112x112 channels_last", channels_last_clips),
}
# below this many bytes a batch's time is per leaf, not per byte: "of memcpy" says nothing
MEMCPY_MEANINGFUL_BYTES = 1 << 20


def tensor_bytes(obj: Any) -> int:
    """Bytes of tensor/array data in a batch (for the memcpy ceiling)."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, np.ndarray):
        return obj.nbytes
    if isinstance(obj, np.generic):
        return obj.itemsize
    if isinstance(obj, (bool, int, float)):
        return 8
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    return 0


def token_samples(n: int, as_tensors: bool, seed: int = 5) -> list[dict[str, Any]]:
    """Tokenizer output: input_ids and labels of lengths 16..512, as lists of ints or tensors."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        length = int(rng.integers(16, 513))
        ids = rng.integers(0, 50_000, size=length)
        if as_tensors:
            t = torch.from_numpy(ids)
            out.append({"input_ids": t, "labels": t.clone()})
        else:
            lst = ids.tolist()
            out.append({"input_ids": lst, "labels": list(lst)})
    return out


PAD_WORKLOADS: dict[str, tuple[str, Callable[[], list]]] = {
    "tokens64_lists": ("64 x token ids (lists), len 16-512", lambda: token_samples(64, False)),
    "tokens512_lists": ("512 x token ids (lists), len 16-512", lambda: token_samples(512, False)),
    "tokens64_tensors": ("64 x token ids (tensors), len 16-512", lambda: token_samples(64, True)),
    "tokens512_tensors": ("512 x token ids (tensors), len 16-512", lambda: token_samples(512, True)),
}


def usual_padding(batch: list[dict[str, Any]]) -> dict[str, Any]:
    """What people write by hand: as_tensor per sample, pad_sequence, a mask from lengths."""
    from torch.nn.utils.rnn import pad_sequence

    ids = [torch.as_tensor(s["input_ids"]) for s in batch]
    labels = [torch.as_tensor(s["labels"]) for s in batch]
    lengths = torch.tensor([len(t) for t in ids])
    input_ids = pad_sequence(ids, batch_first=True, padding_value=0)
    mask = (torch.arange(input_ids.shape[1])[None, :] < lengths[:, None]).long()
    return {"input_ids": input_ids, "labels": pad_sequence(labels, batch_first=True, padding_value=-100),
            "attention_mask": mask}


class CachedSamples(torch.utils.data.Dataset):
    """Samples made once and served by index: the loader's cost, not the dataset's, is measured."""

    def __init__(self, samples: list, length: int) -> None:
        self.samples, self.length = samples, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> Any:
        return self.samples[i % len(self.samples)]


LOADER_WORKLOADS: dict[str, tuple[str, Callable[[], tuple[Any, int]]]] = {
    "loader_images": ("256 x {uint8 3x224x224, int}", lambda: (CachedSamples(images_u8(64), 256 * 12), 256)),
    "loader_fields": ("1024 x 17-field samples", lambda: (CachedSamples(small_fields(256), 1024 * 12), 1024)),
}
