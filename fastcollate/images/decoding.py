"""Decoding an encoded image: the compiled libjpeg-turbo path where it gives Pillow's pixels
exactly, Pillow where it cannot (CMYK and YCCK JPEGs, 12-bit or arithmetic-coded ones, PNG,
WebP, GIF, ...), each counted. Pillow is also the whole path where the engine was built without
libjpeg (``available()`` says so, ``why_not()`` says how to get it).

Bad input -- empty, truncated, header-only, corrupt, not an image, or larger than
``max_pixels`` (where Pillow refuses: twice its ``Image.MAX_IMAGE_PIXELS``, by default) -- raises :class:`DecodeError`
(an ``OSError``, as Pillow's errors are) naming the file and the sample.
"""
from __future__ import annotations

import collections
import dataclasses
import io
import threading
from typing import Any, Sequence

import numpy as np
import torch

from .. import _ext

__all__ = ["DecodeError", "decode", "available", "why_not", "Source", "inspect", "inspect_many", "pillow_pixels", "as_bytes", "count_route",
           "default_max_pixels", "counts"]

_DEFAULT_MAX_PIXELS = 89_478_485  # Pillow's Image.MAX_IMAGE_PIXELS, where Pillow is not installed
_counts: collections.Counter = collections.Counter()  # this process's: engine, pillow:<why>
_counts_lock = threading.Lock()


class DecodeError(OSError):
    """An image that cannot be decoded (the message names the file, the sample and why)."""


def counts() -> dict[str, int]:
    """Images this process decoded, by path: ``engine`` (libjpeg-turbo, compiled), and
    ``pillow: <why>`` for each reason an image went through Pillow."""
    with _counts_lock:
        return dict(_counts)


def count_route(key: str, n: int = 1) -> None:
    with _counts_lock:
        _counts[key] += n


def available() -> bool:
    """Whether the compiled JPEG stage is here (the engine loaded, built with libjpeg)."""
    C = _ext._C
    return C is not None and bool(getattr(C, "jpeg_available", False))


def why_not() -> str | None:
    """None where the compiled JPEG stage is available; else what is missing and how to get it."""
    C = _ext._C
    if C is None:
        return f"the compiled engine did not load ({_ext.LOAD_ERROR}); images decode with Pillow"
    if not getattr(C, "jpeg_available", False):
        return ("fastcollate was built without libjpeg (its build said why: `pip install -v`); images decode with "
                "Pillow. Install libjpeg-turbo's headers (Debian/Ubuntu: apt-get install libjpeg62-turbo-dev or "
                "libjpeg-turbo8-dev; conda: libjpeg-turbo) and build fastcollate again")
    return None


def default_max_pixels() -> int:
    """Where Pillow refuses an image (its DecompressionBombError: twice ``Image.MAX_IMAGE_PIXELS``;
    at once that it only warns), so that what torchvision's ImageFolder loads loads here too."""
    try:
        from PIL import Image
    except ImportError:
        return 2 * _DEFAULT_MAX_PIXELS
    return 2 * int(Image.MAX_IMAGE_PIXELS) if Image.MAX_IMAGE_PIXELS else (1 << 62)


def as_bytes(data: Any) -> torch.Tensor:
    """The encoded file as a contiguous 1-D uint8 tensor (no copy where it can be avoided)."""
    if isinstance(data, torch.Tensor):
        if data.dtype != torch.uint8 or data.device.type != "cpu":
            raise TypeError(f"fastcollate.images: an encoded image tensor must be uint8 on the CPU, got {data.dtype} "
                            f"on {data.device}")
        return data.reshape(-1).contiguous()
    if isinstance(data, np.ndarray):
        return as_bytes(torch.from_numpy(np.ascontiguousarray(data).view(np.uint8).reshape(-1)))
    if isinstance(data, (bytes, bytearray, memoryview)):
        if len(data) == 0:
            return torch.empty(0, dtype=torch.uint8)
        if isinstance(data, bytes) or (isinstance(data, memoryview) and data.readonly):
            data = bytearray(data)  # torch.frombuffer warns on a read-only buffer; the copy is ~1% of a decode
        return torch.frombuffer(data, dtype=torch.uint8)
    raise TypeError(f"fastcollate.images: an encoded image is bytes, a bytearray, a memoryview or a uint8 tensor, "
                    f"got {type(data).__name__}")


@dataclasses.dataclass
class Source:
    """One encoded image, inspected: its bytes, size, and how it will be decoded (``engine``
    True: the compiled JPEG path; else ``why``, and Pillow)."""

    data: torch.Tensor
    height: int
    width: int
    engine: bool
    why: str = ""
    name: str = "the image"

    def pixels(self) -> torch.Tensor:
        """Pillow's decode, [H, W, 3] uint8 (for what the engine does not decode)."""
        return pillow_pixels(self.data, self.name)


def _pillow_open(data: torch.Tensor, name: str) -> Any:
    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError as exc:
        raise DecodeError(f"fastcollate.images: {name} needs Pillow (it is not a JPEG the engine decodes, or the "
                          f"engine has no JPEG stage): pip install pillow") from exc
    try:
        return Image.open(io.BytesIO(data.numpy().tobytes()))
    except UnidentifiedImageError as exc:
        raise DecodeError(f"fastcollate.images: {name} is not an image Pillow can identify "
                          f"({data.numel()} bytes)") from exc


_NOT_JPEG = "not a JPEG file (no SOI marker)"  # csrc/engine/jpeg.cpp's words for a file without one


def inspect(data: torch.Tensor, name: str, max_pixels: int) -> Source:
    """Reads the header: size and route, without decoding. Raises DecodeError for what no
    decoder could read, and for images over ``max_pixels``."""
    return inspect_many([data], [name], max_pixels)[0]


def inspect_many(files: Sequence[torch.Tensor], names: Sequence[str], max_pixels: int) -> list[Source]:
    """``inspect`` of each file, the JPEG headers read in one engine call."""
    headers = _ext._C.jpeg_headers(files) if available() else [None] * len(files)
    out = []
    for data, name, got in zip(files, names, headers):
        if data.numel() == 0:
            raise DecodeError(f"fastcollate.images: {name} is empty (0 bytes)")
        if isinstance(got, dict):
            src = Source(data, got["height"], got["width"], got["exact"], got["why"], name)
        elif got is not None and got != _NOT_JPEG:
            raise DecodeError(f"fastcollate.images: {name} is a JPEG whose header cannot be read: {got}")
        else:
            img = _pillow_open(data, name)
            src = Source(data, img.height, img.width, False,
                         "no compiled JPEG stage" if img.format == "JPEG" else f"{img.format or 'unknown'} format", name)
        if src.height * src.width > max_pixels:
            raise DecodeError(f"fastcollate.images: {name} is {src.width}x{src.height} = {src.width * src.height} "
                              f"pixels, over the limit of {max_pixels} (a decompression bomb?); raise max_pixels= "
                              f"(or Pillow's Image.MAX_IMAGE_PIXELS) if the image is real")
        out.append(src)
    return out


def pillow_pixels(data: torch.Tensor, name: str) -> torch.Tensor:
    """Pillow's ``Image.open(f).convert("RGB")`` as a contiguous [H, W, 3] uint8 tensor."""
    img = _pillow_open(data, name)
    try:
        rgb = np.array(img.convert("RGB"))
    except (OSError, ValueError, SyntaxError) as exc:  # truncated, corrupt: Pillow's own words
        raise DecodeError(f"fastcollate.images: {name} cannot be decoded: {exc}") from exc
    return torch.from_numpy(rgb)


def decode(data: Any, *, max_pixels: int | None = None) -> torch.Tensor:
    """An encoded image's pixels as uint8 [3, H, W], bitwise what Pillow's
    ``Image.open(f).convert("RGB")`` gives (EXIF orientation not applied, as Pillow's ``open``
    does not). JPEGs the engine decodes exactly go through libjpeg-turbo without the GIL; the
    rest through Pillow.

    >>> import io, numpy as np
    >>> from PIL import Image
    >>> buf = io.BytesIO(); Image.fromarray(np.full((4, 6, 3), 90, np.uint8)).save(buf, "JPEG")
    >>> decode(buf.getvalue()).shape
    torch.Size([3, 4, 6])
    """
    src = inspect(as_bytes(data), "the image", default_max_pixels() if max_pixels is None else max_pixels)
    if src.engine:
        try:
            hwc = _ext._C.jpeg_decode(src.data, 1, 0, 0, src.height, src.width, False)
        except ValueError as exc:
            raise DecodeError(f"fastcollate.images: the image cannot be decoded: {exc}") from None
        count_route("engine")
    else:
        hwc = src.pixels()
        count_route(f"pillow: {src.why}")
    return hwc.permute(2, 0, 1).contiguous()
