"""fastcollate: an exact, compiled drop-in for torch's default_collate.

>>> from torch.utils.data import DataLoader
>>> import fastcollate
>>> loader = DataLoader(range(8), batch_size=4, collate_fn=fastcollate.collate)
"""
from ._ext import backend, cuda_kernels_built
from . import transforms
from .collate import Collator, collate, reset_stats, set_pool_limit, stats, trim_pool
from .prefetch import CudaPrefetcher

__version__ = "0.1.0"

__all__ = [
    "Collator",
    "CudaPrefetcher",
    "backend",
    "collate",
    "cuda_kernels_built",
    "reset_stats",
    "set_pool_limit",
    "stats",
    "transforms",
    "trim_pool",
]
