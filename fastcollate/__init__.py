"""fastcollate: an exact, compiled drop-in for torch's default_collate.

>>> from torch.utils.data import DataLoader
>>> import fastcollate
>>> loader = DataLoader(range(8), batch_size=4, collate_fn=fastcollate.collate)
"""
from ._ext import backend, cuda_kernels_built
from . import transforms
from .arrays import ArrayDataset, Gathered, Ragged, TokenWindows
from .collate import Collator, collate, reset_stats, set_pool_limit, stats, trim_pool
from .loader import DataLoader
from .monitor import StallMonitor
from .prefetch import CudaPrefetcher
from .ring import RingCollator
from .sampler import LengthGroupedSampler, padding_fraction
from .train import EpochStats, train_one_epoch
from .tune import TuneResult, tune_loader

__version__ = "0.1.0"


def __getattr__(name: str):
    # fastcollate.StatefulDataLoader: torchdata is optional, imported when first asked for (so it
    # is not in __all__: a star import must not need torchdata)
    if name == "StatefulDataLoader":
        from .loader import stateful_loader_class

        return stateful_loader_class()
    raise AttributeError(f"module 'fastcollate' has no attribute {name!r}")

__all__ = [
    "ArrayDataset",
    "Collator",
    "CudaPrefetcher",
    "DataLoader",
    "EpochStats",
    "Gathered",
    "LengthGroupedSampler",
    "Ragged",
    "RingCollator",
    "StallMonitor",
    "TokenWindows",
    "TuneResult",
    "backend",
    "collate",
    "cuda_kernels_built",
    "padding_fraction",
    "reset_stats",
    "set_pool_limit",
    "stats",
    "train_one_epoch",
    "transforms",
    "trim_pool",
    "tune_loader",
]
