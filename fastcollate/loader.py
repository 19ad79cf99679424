"""fastcollate.DataLoader: torch's DataLoader (same arguments, same iteration), collate_fn
defaulting to fastcollate's, and -- with num_workers > 0 on Linux -- workers that collate
straight into a recycled ring of pre-faulted shared slots (see fastcollate.ring)."""
from __future__ import annotations

import inspect
import logging
import random
import sys
from typing import Any

import torch
import torch.utils.data as tud

from . import _ext
from .collate import Collator, collate as _default_collate_fn
from .ring import Ring, RingCollator, materialize

logger = logging.getLogger("fastcollate")
_SIGNATURE = inspect.signature(tud.DataLoader.__init__)
EXTRA_SLOTS = 5  # batches the consumer (current + previous) and a prefetcher (depth 2 + 1) hold


class _RingIterator:
    """torch's iterator, with ring handles turned into batches on the way out."""

    def __init__(self, inner: Any, ring: Ring) -> None:
        self._inner = inner
        self._ring = ring

    def __iter__(self) -> "_RingIterator":
        return self

    def __next__(self) -> Any:
        try:
            data = next(self._inner)
        except StopIteration:
            raise
        except BaseException:
            self._ring.reclaim_dead()  # a worker that died holding a slot
            raise
        return materialize(data)

    def __len__(self) -> int:
        return len(self._inner)

    def _reset(self, loader: Any, first_iter: bool = False) -> None:
        self._ring.reclaim_dead()
        self._inner._reset(loader, first_iter)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class DataLoader(tud.DataLoader):
    """A drop-in for ``torch.utils.data.DataLoader``; ``collate_fn`` defaults to fastcollate's.

    With ``num_workers > 0`` on Linux (and fastcollate's collate), workers write each batch into
    one of K pre-faulted shared-memory slots and send only a small handle; the main process
    rebuilds the batch as views over the slot, which returns to the ring when the last view
    has died. Slots are sized from a probe batch (``dataset[0:batch_size]`` collated in the main
    process, RNG states restored) or by ``ring_slot_bytes``; K is ``num_workers *
    prefetch_factor`` plus what a consumer and a prefetcher hold, capped by ``ring_max_bytes``.
    With CUDA and ``pin_memory=True`` the slots are page-locked once (cudaHostRegister), so the
    pin thread has nothing to do for ring batches. A batch that finds no free slot, or does not
    fit one, goes the ordinary shared-memory way (``stats()`` counts both).

    >>> import torch, fastcollate
    >>> loader = fastcollate.DataLoader([torch.ones(2)] * 8, batch_size=4, num_workers=0)
    >>> [b.shape for b in loader]
    [torch.Size([4, 2]), torch.Size([4, 2])]
    """

    def __init__(self, dataset: Any, *args: Any, ring: bool = True, ring_slot_bytes: int | None = None,
                 ring_max_bytes: int = 2 << 30, **kwargs: Any) -> None:
        bound = _SIGNATURE.bind(self, dataset, *args, **kwargs)
        arguments = dict(bound.arguments)
        arguments.pop("self")
        user_collate = arguments.get("collate_fn")
        if user_collate is None or user_collate is _default_collate_fn:
            collator: Collator | None = Collator()
        elif isinstance(user_collate, Collator):
            collator = user_collate
        else:
            collator = None  # a custom collate_fn: torch's path, no ring
        num_workers = arguments.get("num_workers", 0)
        use_ring = bool(ring and collator is not None and num_workers > 0 and sys.platform.startswith("linux")
                        and _ext._C is not None)
        self._ring_collator = RingCollator(collator) if use_ring else None
        if collator is not None:
            arguments["collate_fn"] = self._ring_collator or collator
        self._ring_slot_bytes = ring_slot_bytes
        self._ring_max_bytes = ring_max_bytes
        self._ring: Ring | None = None
        super().__init__(**arguments)

    # -- the ring
    def _probe_bytes(self) -> int | None:
        batch_size = self.batch_size or getattr(self.batch_sampler, "batch_size", None)
        if isinstance(self.dataset, tud.IterableDataset) or not batch_size:
            return None  # cannot index without side effects: give ring_slot_bytes
        n = min(batch_size, len(self.dataset))  # type: ignore[arg-type]
        if n == 0:
            return None
        py_state = random.getstate()
        np_state = None
        if "numpy" in sys.modules:
            np_state = sys.modules["numpy"].random.get_state()
        try:
            with torch.random.fork_rng(devices=[]):  # the probe must not shift anyone's random stream
                samples = [self.dataset[i] for i in range(n)]
                nbytes = self._ring_collator.collator.planned_bytes(samples)  # type: ignore[union-attr]
        finally:
            random.setstate(py_state)
            if np_state is not None:
                sys.modules["numpy"].random.set_state(np_state)
        return int(nbytes * 1.25) + (64 << 10)  # headroom: later batches may be larger (padding)

    def _ensure_ring(self) -> Ring | None:
        if self._ring_collator is None or self._ring is not None:
            return self._ring
        slot_bytes = self._ring_slot_bytes or self._probe_bytes()
        if not slot_bytes:
            logger.info("fastcollate.DataLoader: no ring (cannot size the slots; pass ring_slot_bytes=)")
            self._ring_collator.ring = None
            self._ring_collator = None
            return None
        prefetch = self.prefetch_factor or 2
        slots = self.num_workers * prefetch + EXTRA_SLOTS
        slots = min(slots, self._ring_max_bytes // max(1, slot_bytes))
        if slots < 2:
            logger.info("fastcollate.DataLoader: no ring (ring_max_bytes=%d holds fewer than 2 slots of %d bytes)",
                        self._ring_max_bytes, slot_bytes)
            self._ring_collator = None
            return None
        self._ring = Ring(slots, slot_bytes, register_cuda=bool(self.pin_memory))
        self._ring_collator.ring = self._ring
        return self._ring

    def _get_iterator(self) -> Any:
        ring = self._ensure_ring()
        inner = super()._get_iterator()
        if ring is None or self.num_workers == 0:
            return inner
        return _RingIterator(inner, ring)

    def stats(self) -> dict[str, Any]:
        """ring_hits, ring_fallbacks (ring_full + ring_oversize), ring_bytes, slot counts."""
        if self._ring is None:
            return {"ring": False}
        return {"ring": True, **self._ring.stats()}

    def __del__(self) -> None:
        ring = getattr(self, "_ring", None)
        if ring is not None:
            try:
                ring.close()
            except Exception:  # pragma: no cover - interpreter shutdown
                pass
