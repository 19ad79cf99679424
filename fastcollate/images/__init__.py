"""fastcollate.images: JPEG folders and streams decoded, cropped, resized and flipped by the
compiled engine straight into the batch -- exact against the Pillow + torch pipeline it
replaces, the same crops whatever the number of workers.

>>> import fastcollate.images as fi
>>> fi.RandomResizedCrop(224, flip=0.5).size
(224, 224)
"""
from .boxes import Box, CenterCrop, RandomResizedCrop
from .collate import ImageBatch, decode_collate
from .decoding import DecodeError, available, counts, decode, why_not
from .folder import IMG_EXTENSIONS, ImageFolder

__all__ = ["ImageFolder", "RandomResizedCrop", "CenterCrop", "Box", "decode", "decode_collate", "DecodeError",
           "ImageBatch", "available", "why_not", "counts", "IMG_EXTENSIONS"]
