"""How fastcollate's batches cross a DataLoader's worker queue: by reference to their arena, and
taken by the main process without keeping a file descriptor.

torch pickles every tensor a worker sends with its multiprocessing reducer: the storage is moved
to shared memory (or is there already), its descriptor is passed, and the main process maps it
and keeps the descriptor open for as long as the storage lives -- an open file per held batch,
so a consumer that keeps its batches (predictions, a replay buffer) runs out of descriptors.

In the DataLoader workers of a loader with fastcollate's ring (fastcollate.DataLoader, with_ring
classes, any loader given a RingCollator), the reducer of ``torch.Tensor`` is wrapped: a tensor that lies in one of fastcollate's arenas goes as (arena, byte offset, dtype,
shape, strides), the arena pickled once per message however many tensors share it --

* a ring slot (fastcollate.loader.ring): the main process leases the slot; no descriptor;
* a ring's fallback arena (fastcollate.core.shm.batch_arena, when no slot was free): its
  descriptor, which the main process reads into its own memory (under ``MAP_MIN_BYTES``) or
  maps (larger), then closes at once;

and every other tensor goes torch's way, unchanged (fastcollate.collate in torch's own
DataLoader included: its batches cross as default_collate's do). This happens when the batch is pickled,
after the whole collate_fn has run: a collate that wraps or post-processes ours (a framework's
loader, a Collator subclass's ``__call__``) works on real tensors, and what it returns is what
the main process receives -- a step of it is never skipped.
"""
from __future__ import annotations

import os
import weakref
from multiprocessing import reduction
from typing import Any

import torch

from .. import _ext
from ..core.shm import remember, sendable

# this process's rings by id (fastcollate.loader.ring adds each): what a message names, the
# receiving side finds here -- kept on this side of the queue so that the wire needs nothing
# of the ring's module
RINGS: "weakref.WeakValueDictionary[str, Any]" = weakref.WeakValueDictionary()

# Received arenas under this size are read into the main process's own (pooled) memory, larger
# ones mapped. A mapping is one entry in the process's map table (vm.max_map_count, 65530 by
# default: a consumer holding more small batches than that could not map them all), its pages
# fault in one by one when first read, and it is unmapped when the batch dies; reading costs one
# copy inside the kernel into warm memory. benchmarks/receive_arena.py times a batch's whole
# life both ways: reading wins by about 2x up to 64 KB and still at 1 MB; the two are even
# (within the spread) at 2-4 MB, and mapping wins from about 16 MB.
MAP_MIN_BYTES = int(os.environ.get("FASTCOLLATE_MAP_BYTES", 4 << 20))

_torch_reduce: Any = None
_installed: list[int] = [0]  # the pid where the reducer is installed


def install() -> None:
    """Send fastcollate's arenas by reference from this process (a DataLoader worker). Idempotent."""
    global _torch_reduce
    if _installed[0] == os.getpid():
        return
    import torch.multiprocessing  # noqa: F401  (torch's reducers are registered on import)

    current = reduction.ForkingPickler._extra_reducers.get(torch.Tensor)
    if current is not _reduce_tensor:
        _torch_reduce = current
        reduction.ForkingPickler.register(torch.Tensor, _reduce_tensor)
    _installed[0] = os.getpid()



def _reduce_tensor(t: torch.Tensor) -> Any:
    if type(t) is torch.Tensor and t.layout == torch.strided and t.device.type == "cpu" and not t.requires_grad:
        arena = _arena_of(t)
        if arena is not None:
            return (_leaf, (arena, t.storage_offset() * t.element_size(), t.dtype, tuple(t.shape), t.stride()))
    return _torch_reduce(t)


def _arena_of(t: torch.Tensor) -> Any:
    """The reference object of the fastcollate arena t lies in (one object per arena, so that a
    message pickles it once), or None."""
    storage = t.untyped_storage()
    entry = sendable(storage)
    if entry is not None:
        if entry[1] is None:
            fd, size = storage._share_fd_cpu_()  # already a shared segment: its descriptor, no copy
            entry[1] = _SentArena(fd, storage.nbytes(), entry[2])
        return entry[1]
    info = _ext._C.ring_claim_send(t) if _ext._C is not None else None
    if info is None:
        return None
    base, slot, tag, nbytes, _offset = info
    ref = _SentSlot(ring_at(base), slot, tag, nbytes)
    remember(storage, ref)  # the claim's other tensors find the same object (the storage is the claim's own)
    return ref


class _SentSlot:
    """A ring slot a worker filled: unpickled in the main process, the slot's lease."""

    __slots__ = ("ring_id", "slot", "tag", "nbytes")

    def __init__(self, ring_id: str, slot: int, tag: int, nbytes: int) -> None:
        self.ring_id, self.slot, self.tag, self.nbytes = ring_id, slot, tag, nbytes

    def __reduce__(self):
        return (receive_slot, (self.ring_id, self.slot, self.tag, self.nbytes))


class _SentArena:
    """A worker's batch arena: unpickled in the main process, the arena's bytes there."""

    __slots__ = ("fd", "nbytes", "ring_id")

    def __init__(self, fd: int, nbytes: int, ring_id: str | None) -> None:
        self.fd, self.nbytes, self.ring_id = fd, nbytes, ring_id

    def __reduce__(self):
        # a new duplicate of the descriptor for each message (each is received once)
        return (receive_arena, (reduction.DupFd(self.fd), self.nbytes, self.ring_id))


def receive_arena(dupfd: Any, nbytes: int, ring_id: str | None = None) -> torch.Tensor:
    """The main process's side of a sent arena: its bytes, read (small) or mapped (large); the
    descriptor is closed before this returns."""
    fd = dupfd.detach()
    try:
        if nbytes < MAP_MIN_BYTES:
            arena = _ext._C.pool_allocate(max(nbytes, 1))
            _ext._C.read_fd(fd, nbytes, arena)
        else:
            arena = _ext._C.map_fd(fd, nbytes)
    finally:
        os.close(fd)
    if ring_id is not None:
        poll_ring(ring_id)  # a fenced ring frees the slots whose copies completed
    return arena


def _leaf(arena: torch.Tensor, offset: int, dtype: torch.dtype, shape: tuple[int, ...],
          stride: tuple[int, ...]) -> torch.Tensor:
    return _ext._C.ring_view(arena, offset, dtype, list(shape), list(stride))


def ring_at(base: int) -> str:
    """The id of this process's ring whose segment starts at address ``base``."""
    for ring in list(RINGS.values()):
        if ring.mem.data_ptr() == base:
            return ring.id
    raise RuntimeError(f"fastcollate ring: no ring of this process (pid {os.getpid()}) is mapped at {base:#x}")


def ring_by_id(ring_id: str) -> Any:
    ring = RINGS.get(ring_id)
    if ring is None:
        raise RuntimeError(f"fastcollate ring: batch for ring {ring_id[:8]} arrived after its loader and every "
                           f"copy of its collate_fn were gone (pid {os.getpid()})")
    return ring


def receive_slot(ring_id: str, slot: int, tag: int, nbytes: int) -> torch.Tensor:
    """The main process's side of a sent ring slot: its lease, a uint8 tensor whose storage
    frees the slot when the batch's last view dies."""
    ring = ring_by_id(ring_id)
    lease = ring.lease(slot, tag, nbytes)
    ring.poll()
    return lease


def poll_ring(ring_id: str) -> None:
    """A fenced ring's fallback batch arrived: free the slots whose fences completed (without
    ring batches arriving, nothing else would)."""
    ring = RINGS.get(ring_id)
    if ring is not None and ring.owner == os.getpid():
        ring.poll()
