"""JPEG files for the image tests, made here (Pillow writes them; simplejpeg, where installed,
the 4:4:0 subsampling Pillow cannot write): photo-like content (smooth gradients, edges and
noise), so that the decoder's upsampling and IDCT paths all matter."""
from __future__ import annotations

import io
import os

import numpy as np
from PIL import Image


def photo(h: int, w: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([np.sin(x / (9.0 + 5 * c) + c) * 60 + np.cos(y / (13.0 + 3 * c)) * 50 + 128 for c in range(3)], -1)
    base[(x // 16 + y // 16) % 5 == 0] += 40  # hard edges
    base += rng.normal(0, 12, base.shape)
    return np.clip(base, 0, 255).astype(np.uint8)


def jpeg(arr: np.ndarray, **kw) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "JPEG", **kw)
    return buf.getvalue()


def variants() -> dict[str, bytes]:
    """name -> an encoded file, one per JPEG variant the acceptance names (and a few more)."""
    a = photo(75, 101, 1)
    out = {
        "baseline-444": jpeg(a, quality=92, subsampling=0),
        "baseline-422": jpeg(a, quality=85, subsampling=1),
        "baseline-420": jpeg(a, quality=75, subsampling=2),
        "progressive-420": jpeg(a, quality=80, subsampling=2, progressive=True),
        "progressive-444": jpeg(a, quality=95, subsampling=0, progressive=True),
        "restart-markers": jpeg(a, quality=80, restart_marker_rows=1),
        "grayscale": jpeg(a[..., 0], quality=85),
        "grayscale-progressive": jpeg(a[..., 1], quality=70, progressive=True),
        "low-quality": jpeg(a, quality=5),
        "1x1": jpeg(photo(1, 1, 2)),
        "7x5": jpeg(photo(5, 7, 3)),
        "10x2000": jpeg(photo(2000, 10, 4)),
        "2000x10": jpeg(photo(10, 2000, 4)),
        "224x224": jpeg(photo(224, 224, 5)),
        "odd-17x33": jpeg(photo(33, 17, 6), subsampling=2),
    }
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: rotate 90 (Pillow's open does not apply it, and neither do we)
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, "JPEG", exif=exif)
    out["exif-rotated"] = buf.getvalue()
    buf = io.BytesIO()
    Image.fromarray(a).convert("CMYK").save(buf, "JPEG")
    out["cmyk"] = buf.getvalue()
    try:
        import simplejpeg

        out["baseline-440"] = simplejpeg.encode_jpeg(np.ascontiguousarray(a), quality=85, colorsubsampling="440")
        out["baseline-411"] = simplejpeg.encode_jpeg(np.ascontiguousarray(a), quality=85, colorsubsampling="411")
    except ImportError:
        pass
    return out


def write_folder(root: str, n_per_class: int = 6, classes=("ant", "bee", "cow"), size=(60, 80), seed: int = 0) -> None:
    """An image folder: JPEGs of mixed sizes, subsamplings and extensions (some upper-case), a
    PNG and a grayscale image among them, and a file that is no image, not matched by extension."""
    rng = np.random.default_rng(seed)
    for c, name in enumerate(classes):
        os.makedirs(os.path.join(root, name), exist_ok=True)
        for k in range(n_per_class):
            h, w = int(size[0] + rng.integers(0, 40)), int(size[1] + rng.integers(0, 40))
            arr = photo(h, w, seed * 100 + c * 10 + k)
            ext = (".jpg", ".JPEG", ".jpeg", ".JPG")[k % 4]
            kw = {"quality": int(rng.integers(50, 95)), "subsampling": int(rng.integers(0, 3)),
                  "progressive": bool(k % 3 == 0)}
            if k == 1:
                arr = arr[..., 0]
                kw.pop("subsampling")
            with open(os.path.join(root, name, f"img{k:02d}{ext}"), "wb") as f:
                f.write(jpeg(arr, **kw))
        Image.fromarray(photo(50, 70, c)).save(os.path.join(root, name, "zz.png"))
        with open(os.path.join(root, name, "notes.txt"), "w") as f:
            f.write("not an image")
