"""Batch transforms that run where the batch is: on the prefetcher's side stream on the GPU, or
on the CPU. Normalize is the torch op ``fastcollate::normalize`` (a schema, a CPU kernel, a fused
CUDA kernel -- uint8 -> float, (x / scale - mean) / std and channels_last in one pass -- in CUDA
builds, and a fake kernel for torch.compile), called the same way on every device; its Python
reference (``normalize_reference``) computes the same values with the same fp32 true divisions
and subtraction in the same order, and serves where the op is not there (no compiled engine, or
a CUDA tensor and a build without the kernel). Its constants are tensors, the scale included:
CUDA turns a division by a Python scalar into a multiplication by the reciprocal, which can
differ from the kernel's division in the last bit."""
from __future__ import annotations

from typing import Any, Sequence

import torch

from . import _ext

_OUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def normalize_reference(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor, scale: torch.Tensor,
                        dtype: torch.dtype, channels_last: bool) -> torch.Tensor:
    """``fastcollate::normalize`` in torch operations: ``(x / scale - mean[c]) / std[c]`` in fp32,
    cast to ``dtype``. The op's CPU kernel runs these operations; its fake kernel is this function
    on fake tensors (same shapes, dtypes and strides); the CUDA kernel is tested bitwise against it.

    >>> x = torch.full((1, 1, 1, 1), 255, dtype=torch.uint8)
    >>> one = torch.ones(1)
    >>> normalize_reference(x, one, one, torch.tensor(255.0), torch.float32, False).item()
    0.0
    """
    shape = (-1, 1, 1)
    y = x.to(torch.float32).div_(scale).sub_(mean.view(shape)).div_(std.view(shape))
    if channels_last:
        return y.to(dtype=dtype, memory_format=torch.channels_last)
    return y.to(dtype)


if _ext._C is not None:  # loading the engine registered the op (csrc/engine/normalize.cpp)
    torch.library.register_fake("fastcollate::normalize")(normalize_reference)


class Normalize:
    """``(x / scale - mean[c]) / std[c]`` for uint8 image leaves, cast to ``dtype``.

    Args:
        mean, std: one value per channel (in units of ``x / scale``).
        dtype: float32, float16 or bfloat16 output.
        keys: which leaves of the batch: dict keys, or indices for tuple/list batches.
        channels_last: return NHWC-strided (``torch.channels_last``) 4-D tensors.
        scale: divides the raw uint8 values first (255 maps them to [0, 1]).

    Shipping uint8 and normalizing on the GPU moves 4x fewer bytes over PCIe than float32.

    >>> import torch
    >>> norm = Normalize([0.5, 0.5, 0.5], [0.25, 0.25, 0.25], keys=["image"])
    >>> out = norm({"image": torch.full((1, 3, 2, 2), 255, dtype=torch.uint8), "label": torch.tensor([0])})
    >>> out["image"][0, 0, 0, 0].item()
    2.0
    """

    def __init__(self, mean: Sequence[float], std: Sequence[float], dtype: torch.dtype = torch.float32,
                 keys: Sequence[Any] = ("image",), channels_last: bool = False, scale: float = 255.0) -> None:
        self.mean = [float(m) for m in mean]
        self.std = [float(s) for s in std]
        if len(self.mean) != len(self.std) or not self.mean:
            raise ValueError(f"Normalize: mean and std need one value per channel, got {len(self.mean)} and {len(self.std)}")
        if any(s == 0 for s in self.std):
            raise ValueError("Normalize: std must not contain 0")
        if dtype not in _OUT_DTYPES:
            raise ValueError(f"Normalize: dtype must be one of float32, float16, bfloat16; got {dtype}")
        if scale == 0:
            raise ValueError("Normalize: scale must not be 0")
        self.dtype = dtype
        self.keys = list(keys)
        self.channels_last = bool(channels_last)
        self.scale = float(scale)
        self._consts: dict[tuple[torch.device, int], tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    def __repr__(self) -> str:
        return (f"Normalize(mean={self.mean}, std={self.std}, dtype={self.dtype}, keys={self.keys}, "
                f"channels_last={self.channels_last}, scale={self.scale})")

    def __call__(self, batch: Any) -> Any:
        for key in self.keys:
            try:
                x = batch[key]
            except (KeyError, IndexError, TypeError) as exc:
                raise type(exc)(f"Normalize: the batch has no leaf {key!r} ({type(batch).__name__})") from exc
            batch[key] = self.apply(x, key)
        return batch

    def apply(self, x: torch.Tensor, key: Any = "input") -> torch.Tensor:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"Normalize: batch[{key!r}] must be a uint8 tensor, got {type(x).__name__}")
        if x.dtype != torch.uint8:
            raise TypeError(f"Normalize: batch[{key!r}] must be uint8 (raw pixels), got {x.dtype}; "
                            "normalize float images with torch ops instead")
        if x.dim() not in (3, 4):
            raise ValueError(f"Normalize: batch[{key!r}] must be [N, C, H, W] or [C, H, W], got shape {list(x.shape)}")
        c = x.shape[-3]
        if c != len(self.mean):
            raise ValueError(f"Normalize: batch[{key!r}] has {c} channels, mean/std have {len(self.mean)}")
        if self.channels_last and x.dim() != 4:
            raise ValueError(f"Normalize: channels_last needs 4-D [N, C, H, W] input, batch[{key!r}] is {list(x.shape)}")
        mean, std, scale = self._constants(x.device)
        if _ext._C is not None and (x.device.type == "cpu" or (x.is_cuda and _ext.cuda_kernels_built())):
            return torch.ops.fastcollate.normalize(x, mean, std, scale, self.dtype, self.channels_last)
        return normalize_reference(x, mean, std, scale, self.dtype, self.channels_last)

    def _torch(self, x: torch.Tensor) -> torch.Tensor:
        """The reference's result for x (what the op must equal bitwise)."""
        mean, std, scale = self._constants(x.device)
        return normalize_reference(x, mean, std, scale, self.dtype, self.channels_last)

    def _constants(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """mean, std, scale on ``device``, made once per (device, stream) and, on CUDA, copied
        non-blocking from pinned memory on the stream that uses them: no synchronous upload on
        the prefetch thread's or the consumer's path, no cross-stream read before the copy."""
        stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
        key = (device, stream)
        if key not in self._consts:
            host = torch.tensor(self.mean + self.std + [self.scale], dtype=torch.float32)
            if device.type == "cuda":
                host = host.pin_memory().to(device, non_blocking=True)
            c = len(self.mean)
            self._consts[key] = (host[:c], host[c:2 * c], host[2 * c])
        return self._consts[key]

__all__ = ["Normalize", "normalize_reference"]
