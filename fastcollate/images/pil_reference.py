"""The pure-Python reference of the image stage, which the compiled one equals bitwise: Pillow's
decode, the box, ``torch.nn.functional.interpolate(..., mode="bilinear", antialias=True)`` on
uint8, the window, the flip. It is also the path taken where the engine did not load. And
torchvision v1's PIL path for the same box (Pillow's own bilinear resize), for the documented
difference between the two."""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from .boxes import Box, Plan
from .decoding import as_bytes, pillow_pixels

__all__ = ["pillow_rgb", "apply", "sample", "torchvision_v1"]


def pillow_rgb(data: Any) -> torch.Tensor:
    """``Image.open(f).convert("RGB")`` as [H, W, 3] uint8."""
    return pillow_pixels(as_bytes(data), "the image")


def apply(hwc: torch.Tensor, plan: Plan, out_hw: tuple[int, int]) -> torch.Tensor:
    """``plan`` run on decoded pixels (at the plan's scale): [3, *out_hw] uint8, contiguous."""
    chw = hwc.permute(2, 0, 1)[:, plan.top:plan.top + plan.h, plan.left:plan.left + plan.w]
    resized = F.interpolate(chw[None], size=plan.resize_hw, mode="bilinear", antialias=True, align_corners=False)[0]
    (ct, cl), (oh, ow) = plan.crop_tl, out_hw
    out = resized[:, ct:ct + oh, cl:cl + ow]
    return (out.flip(-1) if plan.flip else out).contiguous()


def sample(data: Any, transform: Any, box: Box) -> torch.Tensor:
    """The reference sample for ``box`` of an encoded image under ``transform`` (exact mode)."""
    hwc = pillow_rgb(data)
    plan = transform.plan(box, int(hwc.shape[0]), int(hwc.shape[1]), scalable=False)
    return apply(hwc, plan, transform.size)


def torchvision_v1(data: Any, box: Box, size: tuple[int, int]) -> torch.Tensor:
    """torchvision v1's PIL path for the same box: ``img.crop`` then ``img.resize(size[::-1],
    BILINEAR)`` (what ``F.resized_crop`` does on a PIL image), the flip, then CHW uint8."""
    from PIL import Image

    import io

    img = Image.open(io.BytesIO(as_bytes(data).numpy().tobytes())).convert("RGB")
    img = img.crop((box.left, box.top, box.left + box.width, box.top + box.height))
    img = img.resize((size[1], size[0]), Image.BILINEAR)
    if box.flipped:
        img = img.transpose(Image.FLIP_LEFT_RIGHT)
    return torch.from_numpy(np.array(img)).permute(2, 0, 1).contiguous()
