"""The worker ring: K slots of one shared segment, made by the loader in the main process, that
DataLoader workers collate straight into. A worker's claim of a slot is an arena with a storage
of its own; the batch's tensors cross the worker queue as references to it (fastcollate.loader.
wire) and are unpickled in the main process as views over that process's mapping of the slot --
so any DataLoader class that carries the collate function (torch's, accelerate's, Lightning's
re-created ones, StatefulDataLoader) gets real batches and keeps the ring, and a collate that
wraps ours sees real batches in the worker.

The segment is a sparse memfd: nothing is allocated or faulted when it is made, a page is
allocated by the worker that first writes it, and a slot costs its page faults once, on its
first batch; every later batch in it costs none. Slot states live in a shared control block of
int64 atomics (csrc/engine/ring_state.cpp): free, filled by a worker (its pid), or held by the
main process (its views; for a page-locked ring also the copies still reading it, see
fastcollate.loader.pinning).
A worker never waits for a slot: with none free, or a batch larger than a slot, it collates
into an ordinary shared arena (counted). A slot whose batch is never sent (its collate raised,
or a post-processing collate dropped it) is free again when the worker's last view of it dies.
Slots of dead workers are reclaimed by the next worker that finds the ring full and at each new
epoch.
"""
from __future__ import annotations

import functools
import logging
import os
import time
import uuid
from typing import Any

import torch

from .. import _ext
from ..core import trace as _trace
from ..core.collator import worker_arenas
from ..core.shm import batch_arena, pid_alive, shared_segment
from ..core.tree import iter_tensors
from . import wire
from .wire import RINGS
from .pinning import FenceFactory, Fences, Registrations, cuda_fence

EXTRA_SLOTS = 5  # batches the consumer (current + previous) and a prefetcher (depth 2 + 1) hold

SLOT_ALIGN = 64 << 10


class _Pid:
    """This process's id, read once and again after a fork: os.getpid() is a system call, and
    the ring asked for it twice per batch in each worker, a visible share of a worker's busy
    time with small batches."""

    value = os.getpid()

    @classmethod
    def refresh(cls) -> None:
        cls.value = os.getpid()
        _POPULATED.clear()


# (ring id, slot) -> bytes of the slot this process has mapped (see Ring.claim_view); a new
# process starts with none
_POPULATED: dict[tuple[str, int], int] = {}


os.register_at_fork(after_in_child=_Pid.refresh)


_pid_alive = pid_alive  # the old name


def _free_held(ctrl: torch.Tensor, slot: int) -> None:
    _ext._C.ring_transfer(ctrl, slot, _ext._C.ring_held_by_main, 0)


class Ring:
    """K slots of ``slot_bytes`` each. ``pin``: page-lock each slot in the owning process when
    it first holds a batch (CUDA), and free slots only after the copies that may read them have
    completed (``fence``: a factory of objects with ``query()``/``synchronize()``, default a CUDA
    event on the current stream; tests inject doubles, with ``registrar`` for the page-locking)."""

    def __init__(self, slots: int, slot_bytes: int, *, pin: bool = False, fence: FenceFactory | None = None,
                 registrar: Any = None) -> None:
        if slots < 1 or slot_bytes < 1:
            raise ValueError(f"fastcollate ring: need slots >= 1 and slot_bytes >= 1, got {slots}, {slot_bytes}")
        self.id = uuid.uuid4().hex
        self.slots = int(slots)
        self.slot_bytes = int(-(-slot_bytes // SLOT_ALIGN) * SLOT_ALIGN)
        self.mem = shared_segment(self.slots * self.slot_bytes)
        words = _ext._C.ring_words  # the control block's layout, named by csrc/engine/ring_state.h
        self.ctrl = shared_segment((words["header"] + self.slots) * 8).view(torch.int64)  # zero-filled
        self.ctrl[words["slots"]] = self.slots
        self.owner = os.getpid()
        self.pin_requested = bool(pin)
        can_pin = pin and (registrar is not None or torch.cuda.is_available())
        self.registrations = Registrations(self.mem, self.slot_bytes, registrar) if can_pin else None
        if fence is None and can_pin:
            fence = cuda_fence
        self.fenced = fence is not None
        self.fences = Fences(fence, functools.partial(_free_held, self.ctrl), keep=self.registrations) \
            if fence is not None else None
        RINGS[self.id] = self

    def __reduce__(self):
        from multiprocessing import context

        if context.get_spawning_popen() is not None:
            # a spawn/forkserver worker being started: the segment travels as torch shares it
            # (fd passing); under fork the worker inherits the mapping and pickles nothing
            state = {k: getattr(self, k) for k in ("id", "slots", "slot_bytes", "mem", "ctrl", "owner", "fenced")}
            return (_worker_ring, (state,))
        # a plain copy (pickle, deepcopy) is the same ring: never a copy of the whole segment
        return (_same_ring, (self.id,))

    def __repr__(self) -> str:
        return f"Ring({self.slots} x {self.slot_bytes} bytes, pinned={self.pinned})"

    # -- worker side
    def claim(self) -> int:
        return int(_ext._C.ring_claim(self.ctrl, _Pid.value))

    def claim_slot(self, nbytes: int) -> tuple[int, torch.Tensor | None]:
        """A free slot and an arena over its first nbytes whose storage is the claim's own: when
        the worker's last view of it dies unsent, the slot is free again; (-1, None) when no
        slot is free."""
        slot, arena = _ext._C.ring_claim_slot(self.mem, self.ctrl, _Pid.value, self.slot_bytes, nbytes)
        if slot >= 0:
            self._populate(slot, arena, nbytes)
        return slot, arena

    def _populate(self, slot: int, view: torch.Tensor, nbytes: int) -> None:
        if _POPULATED.get((self.id, slot), -1) < nbytes:
            # first use of this slot in this process: its pages mapped in one call, not one
            # fault per page while the batch is written (a non-persistent loader's workers are
            # new every epoch)
            _ext._C.ring_populate(view)
            _POPULATED[(self.id, slot)] = nbytes

    def claim_view(self, nbytes: int) -> tuple[int, torch.Tensor | None]:
        """A free slot and its first nbytes as a uint8 view, or (-1, None) when none is free."""
        slot, view = _ext._C.ring_claim_view(self.mem, self.ctrl, _Pid.value, self.slot_bytes, nbytes)
        if slot >= 0:
            self._populate(slot, view, nbytes)
        return slot, view

    def slot_view(self, slot: int, nbytes: int) -> torch.Tensor:
        return self.mem.narrow(0, slot * self.slot_bytes, nbytes)

    def count(self, name: str, value: int = 1) -> None:
        """Adds value to counter ``name`` (hits, full, oversize, bytes)."""
        _ext._C.ring_add(self.ctrl, _ext._C.ring_words[name], value)

    # -- main side
    def lease(self, slot: int, tag: int, nbytes: int) -> torch.Tensor:
        """The bytes of a filled slot as a uint8 tensor whose storage frees the slot when its
        last view dies (after a fence, for a fenced ring)."""
        if _Pid.value != self.owner:
            raise RuntimeError(f"fastcollate ring: a batch of ring {self.id[:8]} reached process {os.getpid()}, "
                               f"which did not make the ring (pid {self.owner})")
        if self.registrations is not None:
            self.registrations.ensure(slot, nbytes)
        hook = self.fences.release if self.fences is not None else None
        return _ext._C.ring_lease(self.mem, self.ctrl, slot, tag, self.slot_bytes, nbytes, hook)

    def poll(self) -> int:
        """Free the slots whose fences have completed (never blocks)."""
        return self.fences.poll() if self.fences is not None else 0

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

    @property
    def pinned(self) -> bool | str:
        """False (not asked), True (slots page-locked as they are used), or why pinning is off."""
        if not self.pin_requested:
            return False
        if self.registrations is None:
            return "CUDA is not available"
        return True if self.registrations.active else self.registrations.error

    def stats(self) -> dict[str, Any]:
        self.poll()
        words = _ext._C.ring_words
        header = self.ctrl[:words["counters"]].tolist()
        c = {name: header[words[name]] for name in ("hits", "full", "oversize", "bytes")}
        st = self.states()
        pending = len(self.fences) if self.fences is not None else 0
        return {"ring_hits": c["hits"], "ring_full": c["full"], "ring_oversize": c["oversize"],
                "ring_fallbacks": c["full"] + c["oversize"],
                "ring_bytes": c["bytes"], "ring_slots": self.slots, "ring_slot_bytes": self.slot_bytes,
                "ring_slots_free": st.count(0), "ring_slots_held": sum(1 for s in st if s < 0) - pending,
                "ring_slots_pending": pending, "ring_slots_filled": sum(1 for s in st if s > 0),
                "ring_pinned": self.pinned,
                "ring_pinned_bytes": self.registrations.pinned_bytes() if self.registrations is not None else 0}


def fenced_slots(batch: Any) -> tuple[dict[Ring, set[int]], bool]:
    """The slots of this process's fenced rings that ``batch``'s CPU tensors lie in, and whether
    every CPU tensor of the batch lies in one."""
    rings = [r for r in list(RINGS.values()) if r.fences is not None and r.owner == _Pid.value]
    found: dict[Ring, set[int]] = {}
    covered = True
    for t in iter_tensors(batch):
        if t.device.type != "cpu":
            continue
        ptr = t.untyped_storage().data_ptr()
        for ring in rings:
            base = ring.mem.data_ptr()
            if base <= ptr < base + ring.slots * ring.slot_bytes:
                found.setdefault(ring, set()).add((ptr - base) // ring.slot_bytes)
                break
        else:
            covered = False
    return found, covered


def _worker_ring(state: dict[str, Any]) -> Ring:
    ring = Ring.__new__(Ring)
    ring.__dict__.update(state)
    ring.pin_requested, ring.registrations, ring.fences = False, None, None  # workers never lease
    return RINGS.setdefault(ring.id, ring)


def _same_ring(ring_id: str) -> "Ring | ForeignRing":
    ring = RINGS.get(ring_id)
    return ring if ring is not None else ForeignRing(ring_id)


class ForeignRing:
    """What a ring becomes in a process it was not sent to as a DataLoader worker's (a pickled
    loader or collate_fn): nothing to write into. A RingCollator holding one collates the
    ordinary way, and a loader iterated there makes a ring of its own."""

    def __init__(self, ring_id: str) -> None:
        self.id = ring_id

    def __reduce__(self):
        return (ForeignRing, (self.id,))

    def __repr__(self) -> str:
        return f"ForeignRing({self.id[:8]})"


class _SlotAlloc:
    """The worker's arena allocator for one collate_fn call: a free slot for its first arena
    when the batch fits, else (and for any further arena of the same call) a shared arena."""

    RECLAIM_EVERY_S = 1.0
    _last_reclaim = 0.0

    def __init__(self, ring: Ring) -> None:
        self.ring = ring
        self.slot = -1
        self.nbytes = 0
        self.calls = 0
        self.missed = "shared"  # why the batch is not in a slot, when it is not

    def __call__(self, nbytes: int) -> torch.Tensor:
        self.calls += 1
        if self.calls > 1:  # a collate that collates twice: one slot per batch
            return alloc_shared_for(self.ring, nbytes)
        if nbytes <= self.ring.slot_bytes:
            slot, arena = self.ring.claim_slot(nbytes)
            if slot < 0 and time.monotonic() - _SlotAlloc._last_reclaim > self.RECLAIM_EVERY_S:
                _SlotAlloc._last_reclaim = time.monotonic()  # a full ring may hold a dead worker's slots
                if self.ring.reclaim_dead():
                    slot, arena = self.ring.claim_slot(nbytes)
            if slot >= 0:
                self.slot, self.nbytes = slot, nbytes
                return arena
            self.ring.count("full")
            self.missed = "full"
        else:
            self.ring.count("oversize")
            self.missed = "oversize"
        self.nbytes = nbytes
        return alloc_shared_for(self.ring, nbytes)


def alloc_shared_for(ring: Ring, nbytes: int) -> torch.Tensor:
    """A ring's fallback arena: a batch arena noted with the ring, which the main process polls
    when it arrives (a fenced ring frees the slots whose copies completed)."""
    return batch_arena(nbytes, ring.id if ring.fenced else None)


class RingCollator:
    """The ``collate_fn`` of a ``fastcollate.DataLoader`` with workers: ``inner`` (what you gave
    the loader, ``fastcollate.collate`` by default) everywhere; in a DataLoader worker, the
    fastcollate Collators that run inside ``inner`` -- a Collator subclass's own ``__call__``,
    a collate that wraps or post-processes ours -- write the batch into a ring slot, and
    whatever ``inner`` returns is what the main process receives (fastcollate.loader.wire).
    A complete collate_fn in any loader: a framework that re-creates the loader from its
    attributes keeps the ring.

    >>> import fastcollate
    >>> loader = fastcollate.DataLoader(list(range(8)), batch_size=4, num_workers=2)
    >>> loader.collate_fn.inner is fastcollate.collate
    True
    """

    ring_options: tuple | None = None  # (slot_bytes, max_bytes, pin) of the loader that made the ring

    def __init__(self, inner: Any, ring: Ring | None) -> None:
        self.inner = inner
        self.ring = ring

    def __repr__(self) -> str:
        return f"RingCollator({getattr(self.inner, '__qualname__', None) or self.inner!r}, {self.ring!r})"

    def stats(self) -> dict[str, Any]:
        return self.ring.stats() if self.ring is not None else {"ring": False}

    def __call__(self, batch: Any) -> Any:
        ring = self.ring
        if ring is None:  # no ring (a loader without workers): the inner collate, at no cost
            return self.inner(batch)
        from torch.utils.data import get_worker_info

        if get_worker_info() is None or not isinstance(ring, Ring):
            return self.inner(batch)
        wire.install()
        alloc = _SlotAlloc(ring)
        with worker_arenas(alloc):
            out = self.inner(batch)
        if alloc.calls:
            if _trace.enabled():
                _trace.note_collate("ring" if alloc.slot >= 0 else alloc.missed, alloc.nbytes)
            if alloc.slot >= 0:
                ring.count("hits")
                ring.count("bytes", alloc.nbytes)
        return out


def make_ring(num_workers: int, prefetch_factor: int | None, slot_bytes: int | None, max_bytes: int,
              pin: bool) -> Ring | None:
    """A ring for ``num_workers`` x ``prefetch_factor`` batches in flight and what a consumer and a
    prefetcher hold, within ``max_bytes`` (None where that leaves fewer than 2 slots)."""
    slots = num_workers * (prefetch_factor or 2) + EXTRA_SLOTS
    if slot_bytes:
        slots = min(slots, max_bytes // slot_bytes)
    else:
        slot_bytes = max_bytes // slots
    if slots < 2 or slot_bytes < 1:
        logging.getLogger("fastcollate").info("fastcollate.DataLoader: no ring (ring_max_bytes=%d holds fewer than 2 slots of %d bytes)",
                    max_bytes, slot_bytes)
        return None
    return Ring(slots, slot_bytes, pin=pin and torch.cuda.is_available())


def remake_ring(collate: Any, workers: int, prefetch_factor: int | None) -> None:
    """The ring of a collator that a re-created loader shares with its auto loader, sized for the
    auto mode's next setting (nothing where it has none, or it is another process's)."""
    options = getattr(collate, "ring_options", None)
    if not isinstance(collate, RingCollator) or options is None:
        return
    old = collate.ring
    if not workers or not isinstance(old, Ring) or old.owner != os.getpid():
        return  # with no workers the collator calls its inner in this process, ring or not
    ring = make_ring(workers, prefetch_factor, *options)
    if ring is not None:
        collate.ring = ring
