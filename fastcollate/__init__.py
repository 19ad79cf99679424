"""fastcollate: an exact, compiled drop-in for torch's default_collate.

>>> from torch.utils.data import DataLoader
>>> import fastcollate
>>> loader = DataLoader(range(8), batch_size=4, collate_fn=fastcollate.collate)
"""
import sys as _sys

from . import _compat
from .core import trace as _trace  # noqa: F401  (loaded with the package, as before: hooks read it at import)
from ._ext import backend, cuda_kernels_built
from . import transforms
from .core import reference
from .data.arrays import ArrayDataset, Gathered, Ragged, TokenWindows
from .cache.cached import Cached
from .core.collator import Collator, collate, reset_stats, set_pool_limit, stats, trim_pool
from .loader.dataloader import DataLoader, with_ring
from .training.monitor import StallMonitor
from .device.prefetcher import CudaPrefetcher
from .loader.ring import RingCollator
from .loader.release import release_after
from .data.sampler import LengthGroupedSampler, padding_fraction
from .data.node_sampler import NodeAffineSampler
from .training.loop import EpochStats, train_one_epoch
from .doctor import Diagnosis, TuneResult, tune_loader
from . import doctor  # the package, callable: fastcollate.doctor(dataset, ...) runs the doctor

doctor.doctor  # noqa: B018  (the function bound in its package, as dir() and autodoc expect)

__version__ = "0.1.0"

# fastcollate.reference is a stable path (the pure-Python semantics, the test oracle)
_sys.modules.setdefault("fastcollate.reference", reference)
_compat.install()


def __getattr__(name: str):
    # fastcollate.StatefulDataLoader: torchdata is optional, imported when first asked for (so it
    # is not in __all__: a star import must not need torchdata)
    if name == "StatefulDataLoader":
        from .loader.dataloader import stateful_loader_class

        return stateful_loader_class()
    if name == "ray":  # fastcollate.ray (ArrowCollate, NumpyCollate) imports ray: only when first asked for
        import importlib

        return importlib.import_module(".ray", __name__)
    moved = _compat.moved_module(name)  # an old module path (fastcollate.pad, .ring...): deprecated
    if moved is not None:
        return moved
    raise AttributeError(f"module 'fastcollate' has no attribute {name!r}")

__all__ = [
    "ArrayDataset",
    "Cached",
    "Collator",
    "CudaPrefetcher",
    "DataLoader",
    "Diagnosis",
    "EpochStats",
    "Gathered",
    "LengthGroupedSampler",
    "NodeAffineSampler",
    "Ragged",
    "RingCollator",
    "StallMonitor",
    "TokenWindows",
    "TuneResult",
    "backend",
    "collate",
    "cuda_kernels_built",
    "doctor",
    "padding_fraction",
    "release_after",
    "reset_stats",
    "set_pool_limit",
    "stats",
    "train_one_epoch",
    "transforms",
    "trim_pool",
    "tune_loader",
    "with_ring",
]
