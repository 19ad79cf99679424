"""Where each sample's pixels come from: the crop box, drawn from (seed, epoch, index) alone.

``RandomResizedCrop`` draws its box as torchvision's ``RandomResizedCrop.get_params`` does (ten
tries of a scale and a log-uniform ratio, then the central fallback), and its flip as
``RandomHorizontalFlip``, but from a counter-based generator of (seed, epoch, index) instead of
the process's global one: the same boxes whatever the number of workers, whichever loader,
persistent workers included, and a resumed loader given its epoch by ``set_epoch``. ``CenterCrop`` is torchvision's ``Resize`` of
the shorter side then ``CenterCrop``. Both turn a box into a :class:`Plan`, what the engine
runs: the DCT scale to decode at, the box in decoded pixels, the size it is resized to, the
window taken from that, the flip.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Sequence

__all__ = ["Box", "Plan", "RandomResizedCrop", "CenterCrop", "Draws", "scaled_size"]

_M = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def _mix(z: int) -> int:
    """splitmix64's finalizer: a bijection of 64-bit ints that scatters every input bit."""
    z = (z + _GOLDEN) & _M
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M
    return z ^ (z >> 31)


class Draws:
    """The uniform numbers of one sample: the k-th is a hash of (seed, epoch, index, k), so any
    process draws the same ones for the same sample, in any order."""

    __slots__ = ("key", "k")

    def __init__(self, seed: int, epoch: int, index: int) -> None:
        self.key = _mix(_mix(_mix(seed & _M) ^ (epoch & _M)) ^ (index & _M))
        self.k = 0

    def uniform(self, low: float = 0.0, high: float = 1.0) -> float:
        self.k += 1
        u = (_mix(self.key ^ ((self.k * _GOLDEN) & _M)) >> 11) * (1.0 / (1 << 53))
        return low + (high - low) * u

    def randint(self, high: int) -> int:
        """A whole number in [0, high)."""
        return min(high - 1, int(self.uniform() * high))


@dataclasses.dataclass(frozen=True)
class Box:
    """A sample's crop this epoch, in the decoded image's pixels."""

    top: int
    left: int
    height: int
    width: int
    flipped: bool = False

    def __iter__(self):  # (top, left, height, width, flipped), as crop_box returns it
        return iter((self.top, self.left, self.height, self.width, self.flipped))


@dataclasses.dataclass(frozen=True)
class Plan:
    """What the engine does to one image: decode at 1/denom, take the box (in scaled pixels),
    resize it to resize_hw, take the out_hw window at crop_tl, flip."""

    denom: int
    top: int
    left: int
    h: int
    w: int
    resize_hw: tuple[int, int]
    crop_tl: tuple[int, int]
    flip: bool
    box: Box | None = None  # the box in the image's own pixels that this plan samples


def scaled_size(height: int, width: int, denom: int) -> tuple[int, int]:
    """The image's size decoded at DCT scale 1/denom, as libjpeg rounds it."""
    return -(-height // denom), -(-width // denom)


def _pair(size: int | Sequence[int], name: str) -> tuple[int, int]:
    if isinstance(size, bool) or not isinstance(size, (int, tuple, list)):
        raise TypeError(f"fastcollate.images.{name}: size must be an int or (height, width), got {size!r}")
    out = (size, size) if isinstance(size, int) else tuple(size)
    if len(out) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in out):
        raise ValueError(f"fastcollate.images.{name}: size must be positive ints, got {size!r}")
    return int(out[0]), int(out[1])


_MODES = ("exact", "fast")
# fast mode decodes at 1/d only where the box keeps FAST_KEEP times the output's size: the box's
# edges move by up to d/2 decoded pixels when mapped onto the scaled image, at most
# 1 / (2 * FAST_KEEP) of an output pixel (the images guide has the measured distance)
FAST_KEEP = 1.0


class RandomResizedCrop:
    """torchvision's ``RandomResizedCrop(size, scale, ratio)`` followed by
    ``RandomHorizontalFlip(flip)``, on uint8 tensors (antialiased bilinear), its boxes drawn from
    (seed, epoch, index).

    ``mode="exact"``: every pixel equals the reference (Pillow's decode, the crop,
    ``torch.nn.functional.interpolate(..., mode="bilinear", antialias=True)``, the flip).
    ``mode="fast"``: decodes at the smallest DCT scale (1/2, 1/4, 1/8) at which the box still
    covers the output, the box mapped onto the scaled image; close to exact, not equal (the
    images guide has the measured distance).

    >>> t = RandomResizedCrop(224, flip=0.5)
    >>> t.box(375, 500, seed=0, epoch=0, index=7) == t.box(375, 500, seed=0, epoch=0, index=7)
    True
    """

    def __init__(self, size: int | Sequence[int], scale: Sequence[float] = (0.08, 1.0),
                 ratio: Sequence[float] = (3.0 / 4.0, 4.0 / 3.0), flip: float = 0.0, mode: str = "exact") -> None:
        self.size = _pair(size, "RandomResizedCrop")
        scale, ratio = tuple(float(v) for v in scale), tuple(float(v) for v in ratio)
        if len(scale) != 2 or len(ratio) != 2 or scale[0] > scale[1] or ratio[0] > ratio[1] or min(scale + ratio) <= 0:
            raise ValueError(f"fastcollate.images.RandomResizedCrop: scale and ratio must be increasing (low, high) "
                             f"pairs of positive numbers, got scale={scale}, ratio={ratio}")
        if not 0.0 <= float(flip) <= 1.0:
            raise ValueError(f"fastcollate.images.RandomResizedCrop: flip is a probability in [0, 1], got {flip!r}")
        if mode not in _MODES:
            raise ValueError(f"fastcollate.images.RandomResizedCrop: mode must be 'exact' or 'fast', got {mode!r}")
        self.scale, self.ratio, self.flip, self.mode = scale, ratio, float(flip), mode
        self._log_ratio = (math.log(ratio[0]), math.log(ratio[1]))

    def __repr__(self) -> str:
        return (f"RandomResizedCrop(size={self.size}, scale={self.scale}, ratio={self.ratio}, flip={self.flip}, "
                f"mode={self.mode!r})")

    def box(self, height: int, width: int, seed: int, epoch: int, index: int) -> Box:
        """Sample ``index``'s box this epoch in an image of height x width."""
        d = Draws(seed, epoch, index)
        area = height * width
        for _ in range(10):
            target_area = area * d.uniform(self.scale[0], self.scale[1])
            aspect = math.exp(d.uniform(self._log_ratio[0], self._log_ratio[1]))
            w = int(round(math.sqrt(target_area * aspect)))
            h = int(round(math.sqrt(target_area / aspect)))
            if 0 < w <= width and 0 < h <= height:
                top, left = d.randint(height - h + 1), d.randint(width - w + 1)
                break
        else:  # the central crop, as torchvision falls back
            in_ratio = width / height
            if in_ratio < min(self.ratio):
                w, h = width, int(round(width / min(self.ratio)))
            elif in_ratio > max(self.ratio):
                h, w = height, int(round(height * max(self.ratio)))
            else:
                w, h = width, height
            top, left = (height - h) // 2, (width - w) // 2
        flipped = self.flip > 0 and d.uniform() < self.flip
        return Box(top, left, h, w, flipped)

    def plan(self, box: Box, height: int, width: int, scalable: bool) -> Plan:
        """What the engine runs for ``box`` of an image of height x width (``scalable``: a JPEG
        the engine decodes, which can be decoded at a DCT scale)."""
        oh, ow = self.size
        denom = 1
        if self.mode == "fast" and scalable:
            for d in (8, 4, 2):
                if box.height / d >= FAST_KEEP * oh and box.width / d >= FAST_KEEP * ow:
                    denom = d
                    break
        if denom == 1:
            return Plan(1, box.top, box.left, box.height, box.width, (oh, ow), (0, 0), box.flipped, box)
        # the box snapped to the scaled image's grid, so that the scaled box is exactly the
        # snapped one (a box moved by under denom pixels: the augmentation is unchanged); the
        # sample then differs from exact only by the DCT's downscale
        d = denom
        sh, sw = scaled_size(height, width, d)
        top, left = box.top // d, box.left // d
        bottom = min(sh, max(top + 1, int(round((box.top + box.height) / d))))
        right = min(sw, max(left + 1, int(round((box.left + box.width) / d))))
        snapped = Box(top * d, left * d, min(height, bottom * d) - top * d, min(width, right * d) - left * d, box.flipped)
        return Plan(d, top, left, bottom - top, right - left, (oh, ow), (0, 0), box.flipped, snapped)


class CenterCrop:
    """torchvision's ``Resize(resize)`` (the shorter side to ``resize``, antialiased bilinear)
    then ``CenterCrop(size)``; without ``resize``, the center crop alone (the image must be at
    least that large). The evaluation recipe: ``CenterCrop(224, resize=256)``.

    >>> CenterCrop(224, resize=256).box(375, 500, seed=0, epoch=0, index=0)
    Box(top=0, left=0, height=375, width=500, flipped=False)
    """

    mode = "exact"

    def __init__(self, size: int | Sequence[int], resize: int | None = None) -> None:
        self.size = _pair(size, "CenterCrop")
        if resize is not None and (isinstance(resize, bool) or not isinstance(resize, int) or resize <= 0):
            raise ValueError(f"fastcollate.images.CenterCrop: resize is the shorter side's new length, a positive "
                             f"int, got {resize!r}")
        self.resize = resize

    def __repr__(self) -> str:
        return f"CenterCrop(size={self.size}, resize={self.resize})"

    def box(self, height: int, width: int, seed: int = 0, epoch: int = 0, index: int = 0) -> Box:
        return Box(0, 0, height, width, False)  # the whole image: resized, then the center taken

    def resized(self, height: int, width: int) -> tuple[int, int]:
        """The image's size after the Resize, as torchvision computes it."""
        if self.resize is None:
            return height, width
        short, long = (height, width) if height <= width else (width, height)
        new_short, new_long = self.resize, int(self.resize * long / short)
        return (new_short, new_long) if height <= width else (new_long, new_short)

    def plan(self, box: Box, height: int, width: int, scalable: bool) -> Plan:
        rh, rw = self.resized(height, width)
        oh, ow = self.size
        if oh > rh or ow > rw:
            raise ValueError(f"fastcollate.images.CenterCrop: a {oh}x{ow} crop of a {rh}x{rw} image (resized from "
                             f"{height}x{width}); torchvision would pad, fastcollate refuses: give resize= at least "
                             f"the crop's size")
        return Plan(1, 0, 0, height, width, (rh, rw), (int(round((rh - oh) / 2.0)), int(round((rw - ow) / 2.0))), False,
                    box)
