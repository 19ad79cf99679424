"""fastcollate.DataLoader: torch's DataLoader (same arguments, same iteration), collate_fn
defaulting to fastcollate's, and -- with num_workers > 0 on Linux -- workers that collate
straight into a recycled ring of shared slots (see fastcollate.loader.ring)."""
from __future__ import annotations

import inspect
import logging
import sys
from typing import Any, TypeVar

import torch
import torch.utils.data as tud

from .. import _ext, _trace
from ..core.collator import Collator, collate as _collate_fn
from .ring import Ring, RingCollator

logger = logging.getLogger("fastcollate")
_SIGNATURE = inspect.signature(tud.DataLoader.__init__)
EXTRA_SLOTS = 5  # batches the consumer (current + previous) and a prefetcher (depth 2 + 1) hold
T_co = TypeVar("T_co", covariant=True)


def _ours(fn: Any) -> bool:
    return fn is _collate_fn or isinstance(fn, Collator)


class _RingLoader:
    """The ring, for any DataLoader class whose __init__ takes torch's arguments."""

    _base_signature = _SIGNATURE

    def _setup(self, dataset: Any, args: tuple, kwargs: dict, ring: bool, ring_slot_bytes: int | None,
               ring_max_bytes: int) -> dict[str, Any]:
        bound = self._base_signature.bind(self, dataset, *args, **kwargs)
        arguments = dict(bound.arguments)
        arguments.pop("self")
        for p in self._base_signature.parameters.values():
            if p.kind is p.VAR_KEYWORD:
                arguments.update(arguments.pop(p.name, {}))
            elif p.kind is p.VAR_POSITIONAL and arguments.pop(p.name, ()):
                raise TypeError(f"{type(self).__name__} with the ring: pass the arguments after the dataset by "
                                "keyword (batch_size=..., num_workers=...)")
        collate_fn = arguments.get("collate_fn")
        if isinstance(collate_fn, RingCollator):  # re-created from a loader's attributes (Lightning)
            collate_fn = collate_fn.inner
        auto_collation = arguments.get("batch_size", 1) is not None or arguments.get("batch_sampler") is not None
        if collate_fn is None and auto_collation:
            collate_fn = _collate_fn
        num_workers = arguments.get("num_workers", 0)
        self._ring: Ring | None = None
        if (ring and auto_collation and _ours(collate_fn) and num_workers > 0 and sys.platform.startswith("linux")
                and _ext._C is not None):
            self._ring = _make_ring(num_workers, arguments.get("prefetch_factor"), ring_slot_bytes, ring_max_bytes,
                                    bool(arguments.get("pin_memory", False)))
        arguments["collate_fn"] = RingCollator(collate_fn, self._ring) if self._ring is not None else collate_fn
        return arguments

    def _get_iterator(self) -> Any:
        if self._ring is not None:
            self._ring.reclaim_dead()  # slots of workers that died holding them (a killed epoch)
            self._ring.poll()
        init = self.worker_init_fn  # type: ignore[attr-defined]
        if _trace.enabled() and self.num_workers > 0 and not isinstance(init, _trace.WorkerInit):  # type: ignore[attr-defined]
            # spawned workers import nothing of fastcollate unless something they unpickle does:
            # for the time the workers start, an init that turns the worker-side trace on
            self.worker_init_fn = _trace.WorkerInit(init)
            try:
                return super()._get_iterator()  # type: ignore[misc]
            finally:
                self.worker_init_fn = init
        return super()._get_iterator()  # type: ignore[misc]

    def stats(self) -> dict[str, Any]:
        """ring_hits, ring_fallbacks (ring_full + ring_oversize), ring_bytes, slot counts,
        ring_pinned (False, True, or why page-locking is off) and ring_pinned_bytes."""
        if self._ring is None:
            return {"ring": False}
        return {"ring": True, **self._ring.stats()}


def _make_ring(num_workers: int, prefetch_factor: int | None, slot_bytes: int | None, max_bytes: int,
               pin: bool) -> Ring | None:
    slots = num_workers * (prefetch_factor or 2) + EXTRA_SLOTS
    if slot_bytes:
        slots = min(slots, max_bytes // slot_bytes)
    else:
        slot_bytes = max_bytes // slots
    if slots < 2 or slot_bytes < 1:
        logger.info("fastcollate.DataLoader: no ring (ring_max_bytes=%d holds fewer than 2 slots of %d bytes)",
                    max_bytes, slot_bytes)
        return None
    return Ring(slots, slot_bytes, pin=pin and torch.cuda.is_available())


class DataLoader(_RingLoader, tud.DataLoader[T_co]):
    """A drop-in for ``torch.utils.data.DataLoader``; ``collate_fn`` defaults to fastcollate's
    (and, with ``batch_size=None``, to torch's ``default_convert``, as torch does).

    With ``num_workers > 0`` on Linux (and fastcollate's collate), workers write each batch into
    one of K slots of one shared segment and send only a small handle, which turns back into the
    batch -- views over the slot -- when the main process unpickles it; the slot returns to the
    ring when the last view has died. Nothing is read from the dataset in the main process. The
    segment is sparse: a slot's pages are allocated by its first batch, so a new loader's first
    batches cost what torch's do and every later one saves the allocation and the page faults.
    K is ``num_workers * prefetch_factor`` plus what a consumer and a prefetcher hold; each slot
    may hold up to ``ring_slot_bytes`` (default ``ring_max_bytes / K``, address space only).
    With CUDA and ``pin_memory=True`` each slot is page-locked the first time it holds a batch,
    so the pin thread has nothing to copy, and a slot is reused only after the copies that may
    read it have completed. A batch that finds no free slot, or does not fit one, goes the
    ordinary shared-memory way (``stats()`` counts both).

    ``loader.collate_fn`` is a :class:`fastcollate.RingCollator` around what you passed
    (``.inner``): a complete collate_fn in any loader, so frameworks that re-create the loader
    from its attributes keep the ring.

    >>> import torch, fastcollate
    >>> loader = fastcollate.DataLoader([torch.ones(2)] * 8, batch_size=4, num_workers=0)
    >>> [b.shape for b in loader]
    [torch.Size([4, 2]), torch.Size([4, 2])]
    """

    def __init__(self, dataset: Any, *args: Any, ring: bool = True, ring_slot_bytes: int | None = None,
                 ring_max_bytes: int = 2 << 30, **kwargs: Any) -> None:
        super().__init__(**self._setup(dataset, args, kwargs, ring, ring_slot_bytes, ring_max_bytes))

    def state_dict(self) -> dict[str, Any]:
        raise TypeError(_STATEFUL_HINT)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        raise TypeError(_STATEFUL_HINT)


_STATEFUL_HINT = ("fastcollate.DataLoader keeps no iteration state, as torch's DataLoader; for a mid-epoch resume "
                  "use fastcollate.StatefulDataLoader (torchdata's StatefulDataLoader with the ring; needs "
                  "`pip install torchdata`)")


def with_ring(loader_class: type) -> type:
    """``loader_class`` -- a subclass of torch's DataLoader -- with fastcollate's collate and worker
    ring, as :class:`fastcollate.DataLoader` is for torch's own: the same arguments plus ``ring``,
    ``ring_slot_bytes``, ``ring_max_bytes``, and ``stats()``. The loader class must pass the
    ``collate_fn`` it is given on to torch's DataLoader (wrapping it is fine: LitData's
    StreamingDataLoader does); its own arguments are kept, and one that takes only
    ``*args, **kwargs`` (MosaicML streaming's) is read with torch's. Arguments after the dataset
    go by keyword. One class per base, made once.

    >>> import fastcollate, torch.utils.data as tud
    >>> class MyLoader(tud.DataLoader): pass
    >>> Loader = fastcollate.with_ring(MyLoader)
    >>> Loader is fastcollate.with_ring(MyLoader), issubclass(Loader, MyLoader)
    (True, True)
    """
    if not (isinstance(loader_class, type) and issubclass(loader_class, tud.DataLoader)):
        raise TypeError(f"fastcollate.with_ring: expected a subclass of torch.utils.data.DataLoader, got "
                        f"{loader_class!r} (a loader that only wraps one cannot carry the ring: give it a "
                        "fastcollate.DataLoader instead)")
    if issubclass(loader_class, _RingLoader):
        return loader_class
    if loader_class is tud.DataLoader:
        return DataLoader
    made = _WITH_RING.get(loader_class)
    if made is None:
        signature = inspect.signature(loader_class.__init__)
        if all(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in list(signature.parameters.values())[1:]):
            signature = _SIGNATURE  # (self, *args, **kwargs): torch's arguments, passed through

        class Ring(_RingLoader, loader_class):  # type: ignore[valid-type,misc]
            _base_signature = signature

            def __init__(self, dataset: Any, *args: Any, ring: bool = True, ring_slot_bytes: int | None = None,
                         ring_max_bytes: int = 2 << 30, **kwargs: Any) -> None:
                super().__init__(**self._setup(dataset, args, kwargs, ring, ring_slot_bytes, ring_max_bytes))

        Ring.__name__ = loader_class.__name__
        Ring.__qualname__ = f"with_ring({loader_class.__qualname__})"
        Ring.__module__ = __name__
        Ring.__doc__ = loader_class.__doc__
        made = _WITH_RING[loader_class] = Ring
    return made


_WITH_RING: dict[type, type] = {}


def stateful_loader_class() -> type:
    """fastcollate.StatefulDataLoader: torchdata's StatefulDataLoader with fastcollate's collate
    and ring; state_dict()/load_state_dict() resume mid-epoch exactly, workers included."""
    global _STATEFUL
    if _STATEFUL is None:
        try:
            from torchdata.stateful_dataloader import StatefulDataLoader as _Base
        except ImportError as exc:
            raise ImportError("fastcollate.StatefulDataLoader needs torchdata: pip install torchdata") from exc

        StatefulDataLoader = with_ring(_Base)
        StatefulDataLoader.__doc__ = stateful_loader_class.__doc__
        StatefulDataLoader.__qualname__ = "StatefulDataLoader"  # found again by name (pickle, repr)
        _STATEFUL = StatefulDataLoader
    return _STATEFUL


_STATEFUL: type | None = None


def __getattr__(name: str) -> Any:
    if name == "StatefulDataLoader":
        return stateful_loader_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
