"""The worker ring: K slots of shared memory owned by the main process, pre-faulted once, that
DataLoader workers collate straight into. What crosses the worker queue is a RingHandle (slot,
layout, non-tensor leaves); the main process rebuilds the batch as views over its own mapping.

Slot states live in a shared control block of int64 atomics (csrc/ring.cpp): free, filled by
a worker (its pid), or held by the main process's views -- freed by their storage's deleter
when the last view dies. A worker never waits for a slot: with none free, or a batch larger
than a slot, it collates into an ordinary shared arena (counted). A handle dropped unread
(a loader reset discarding prefetched batches) frees its slot; slots of dead workers are
reclaimed at epoch boundaries and on errors.
"""
from __future__ import annotations

import os
import uuid
import weakref
from typing import Any

import torch

from . import _ext
from ._tree import map_tensors
from .collate import Collator, _alloc_shared

_RINGS: "weakref.WeakValueDictionary[str, Ring]" = weakref.WeakValueDictionary()
_COUNTERS = ("hits", "full", "oversize", "bytes")
SLOT_ALIGN = 64 << 10


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover - another user's process
        return True
    try:  # a zombie (exited, not yet reaped) is dead for our purposes
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _shared(n: int, dtype: torch.dtype) -> torch.Tensor:
    storage = torch.UntypedStorage._new_shared(n * torch.empty((), dtype=dtype).element_size())
    return torch.empty(0, dtype=dtype).set_(storage)


class Ring:
    def __init__(self, slots: int, slot_bytes: int, *, register_cuda: bool = False) -> None:
        if slots < 1 or slot_bytes < 1:
            raise ValueError(f"fastcollate ring: need slots >= 1 and slot_bytes >= 1, got {slots}, {slot_bytes}")
        self.id = uuid.uuid4().hex
        self.slots = int(slots)
        self.slot_bytes = int(-(-slot_bytes // SLOT_ALIGN) * SLOT_ALIGN)
        # file_descriptor sharing: the segment is unlinked at creation, no name stays behind
        self.mem = _shared(self.slots * self.slot_bytes, torch.uint8)
        self.mem.fill_(0)  # pre-fault every page once, here, not per batch
        self.ctrl = _shared(_ext._C.ring_header + self.slots, torch.int64)
        self.ctrl.zero_()
        self.ctrl[4] = self.slots
        self.owner = os.getpid()
        self.registered = False
        if register_cuda and torch.cuda.is_available():
            # page-locked once: pin_memory costs no copy, the prefetcher's H2D reads the slot
            err = torch.cuda.cudart().cudaHostRegister(self.mem.data_ptr(), self.mem.numel(), 0)
            self.registered = int(err) == 0
        _RINGS[self.id] = self

    def __getstate__(self) -> dict[str, Any]:
        # tensors travel as torch shares them (fd passing under spawn; inherited under fork)
        return {k: getattr(self, k) for k in ("id", "slots", "slot_bytes", "mem", "ctrl", "owner")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.registered = False
        _RINGS[self.id] = self

    # -- worker side
    def claim(self) -> int:
        return int(_ext._C.ring_claim(self.ctrl, os.getpid()))

    def slot_view(self, slot: int, nbytes: int) -> torch.Tensor:
        return self.mem.narrow(0, slot * self.slot_bytes, nbytes)

    def count(self, name: str, value: int = 1) -> None:
        _ext._C.ring_add(self.ctrl, _COUNTERS.index(name), value)

    # -- main side
    def states(self) -> list[int]:
        return list(_ext._C.ring_states(self.ctrl))

    def free(self, slot: int, tag: int) -> bool:
        return bool(_ext._C.ring_transfer(self.ctrl, slot, tag, 0))

    def reclaim_dead(self) -> int:
        """Free slots filled by workers that are no longer alive."""
        n = 0
        for slot, s in enumerate(self.states()):
            if s > 0 and s != self.owner and not _pid_alive(s) and self.free(slot, s):
                n += 1
        return n

    def stats(self) -> dict[str, Any]:
        c = self.ctrl[:4].tolist()
        st = self.states()
        return {"ring_hits": c[0], "ring_full": c[1], "ring_oversize": c[2], "ring_fallbacks": c[1] + c[2],
                "ring_bytes": c[3], "ring_slots": self.slots, "ring_slot_bytes": self.slot_bytes,
                "ring_slots_free": st.count(0), "ring_slots_held": sum(1 for s in st if s < 0),
                "ring_slots_filled": sum(1 for s in st if s > 0), "ring_registered": self.registered}

    def close(self) -> None:
        if self.registered and all(s == 0 for s in self.states()):
            torch.cuda.cudart().cudaHostUnregister(self.mem.data_ptr())
            self.registered = False


class _Leaf:
    """A tensor leaf of a ring batch: where it lies in the slot."""

    __slots__ = ("offset", "dtype", "shape")

    def __init__(self, offset: int, dtype: torch.dtype, shape: tuple[int, ...]) -> None:
        self.offset, self.dtype, self.shape = offset, dtype, shape

    def __reduce__(self):
        return (_Leaf, (self.offset, self.dtype, self.shape))


class RingHandle:
    """What a worker sends for a batch in a ring slot."""

    def __init__(self, ring_id: str, slot: int, tag: int, nbytes: int, tree: Any) -> None:
        self.ring_id, self.slot, self.tag, self.nbytes, self.tree = ring_id, slot, tag, nbytes, tree
        self._live = False  # true only in the process that received it

    def __reduce__(self):
        return (_received, (self.ring_id, self.slot, self.tag, self.nbytes, self.tree))

    def materialize(self) -> Any:
        ring = _RINGS[self.ring_id]
        lease = _ext._C.ring_lease(ring.mem, ring.ctrl, self.slot, self.tag, ring.slot_bytes, self.nbytes)
        self._live = False
        storage = lease.untyped_storage()

        def view(leaf: _Leaf) -> torch.Tensor:
            item = torch.empty((), dtype=leaf.dtype).element_size()
            return torch.empty(0, dtype=leaf.dtype).set_(storage, leaf.offset // item, leaf.shape)

        return map_tensors(self.tree, view, _Leaf)

    def __del__(self) -> None:
        if self._live:  # dropped unread: give the slot back
            try:
                ring = _RINGS.get(self.ring_id)
                if ring is not None:
                    ring.free(self.slot, self.tag)
            except Exception:  # pragma: no cover - interpreter shutdown
                pass


def _received(ring_id: str, slot: int, tag: int, nbytes: int, tree: Any) -> RingHandle:
    h = RingHandle(ring_id, slot, tag, nbytes, tree)
    h._live = True
    return h


class _SlotAlloc:
    """The worker's arena allocator: a free slot when the batch fits, else a shared arena."""

    def __init__(self, ring: Ring) -> None:
        self.ring = ring
        self.slot = -1
        self.nbytes = 0

    def __call__(self, nbytes: int) -> torch.Tensor:
        if nbytes <= self.ring.slot_bytes:
            slot = self.ring.claim()
            if slot >= 0:
                self.slot, self.nbytes = slot, nbytes
                return self.ring.slot_view(slot, nbytes)
            self.ring.count("full")
        else:
            self.ring.count("oversize")
        return _alloc_shared(nbytes)


class RingCollator:
    """collate_fn of fastcollate.DataLoader: in a worker with a ring, a RingHandle; else a batch."""

    def __init__(self, collator: Collator) -> None:
        self.collator = collator
        self.ring: Ring | None = None

    def __call__(self, batch: Any) -> Any:
        from torch.utils.data import get_worker_info

        ring = self.ring
        if ring is None or get_worker_info() is None or not self.collator.compiled:
            return self.collator(batch)
        alloc = _SlotAlloc(ring)
        try:
            out = self.collator.run(batch, worker_alloc=alloc)
        except BaseException:
            if alloc.slot >= 0:
                ring.free(alloc.slot, os.getpid())
            raise
        if alloc.slot < 0:
            return out  # fallback: an ordinary shared-memory batch
        ring_storage = ring.mem.untyped_storage().data_ptr()
        slot_start = alloc.slot * ring.slot_bytes

        def describe(t: torch.Tensor) -> Any:
            # the engine's views share the ring's storage; their offsets place them in the slot
            if t.device.type == "cpu" and t.untyped_storage().data_ptr() == ring_storage:
                return _Leaf(t.storage_offset() * t.element_size() - slot_start, t.dtype, tuple(t.shape))
            return t  # a leaf left outside the arena (e.g. one that requires grad): sent as torch sends it

        tree = map_tensors(out, describe)
        ring.count("hits")
        ring.count("bytes", alloc.nbytes)
        return RingHandle(ring.id, alloc.slot, os.getpid(), alloc.nbytes, tree)


def materialize(data: Any) -> Any:
    return data.materialize() if isinstance(data, RingHandle) else data
