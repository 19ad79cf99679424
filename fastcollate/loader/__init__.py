"""DataLoader workers -> the main process: fastcollate.DataLoader, the recycled ring of shared
slots, how a worker's arenas cross the queue (wire), page-locked slots and the fences before one
is reused. ``from fastcollate.loader import DataLoader, StatefulDataLoader`` works as it did
when this was one module."""
from typing import Any

from .dataloader import DataLoader, stateful_loader_class, with_ring
from .ring import RingCollator

__all__ = ["DataLoader", "RingCollator", "stateful_loader_class", "with_ring"]


def __getattr__(name: str) -> Any:
    if name == "StatefulDataLoader":  # torchdata is optional: imported when first asked for
        return stateful_loader_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
