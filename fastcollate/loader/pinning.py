"""Page-locked memory that torch's caching host allocator did not hand out (the worker ring's
slots), and the fences that keep such memory from being rewritten while a copy may read it.

torch records an event on a pinned block after a ``non_blocking`` copy only for blocks its
caching host allocator owns; for a range page-locked with ``cudaHostRegister`` it records
nothing, so ``batch.to("cuda", non_blocking=True)`` returns while the DMA still reads the host
bytes. Whoever hands such memory back for reuse therefore records a fence on the current stream
first (the stream the copy was issued on, in the usual loop) and reuses the memory only once the
fence has completed, polled without blocking. ``Fences`` does that bookkeeping for any fence
type with ``query()`` and ``synchronize()`` (a ``torch.cuda.Event``; tests use a double).
"""
from __future__ import annotations

import logging
import threading
from typing import Any, Callable

import torch

from .. import _ext

logger = logging.getLogger("fastcollate")
FenceFactory = Callable[[], Any]


def cuda_fence() -> Any:
    """An event recorded on the current CUDA stream: complete once the work queued before it is."""
    event = torch.cuda.Event()
    event.record()
    return event


class Fences:
    """Slots freed only after a fence recorded at their release has completed.

    ``release(slot)`` is the ring lease's hook (called when a batch's last view dies, on any
    thread, with the GIL); ``poll()`` frees what has completed and never blocks; ``drain()``
    waits (close and garbage collection only). Whatever is kept in ``keep`` (the page-locking
    registrations) outlives every pending fence.
    """

    def __init__(self, factory: FenceFactory, free: Callable[[int], None], keep: Any = None) -> None:
        self.factory = factory
        self.free = free
        self.keep = keep
        self.lock = threading.Lock()
        self.pending: list[tuple[Any, int]] = []
        self.released = 0

    def release(self, slot: int) -> None:
        fence = self.factory()
        with self.lock:
            self.pending.append((fence, slot))
        self.poll()

    def poll(self) -> int:
        with self.lock:
            if not self.pending:
                return 0
            keep: list[tuple[Any, int]] = []
            done: list[tuple[Any, int]] = []
            for item in self.pending:  # fences on different streams may complete out of order
                (done if item[0].query() else keep).append(item)
            self.pending = keep
        for _, slot in done:
            self.free(slot)
        self.released += len(done)
        return len(done)

    def drain(self) -> None:
        with self.lock:
            pending, self.pending = self.pending, []
        for fence, slot in pending:
            fence.synchronize()
            self.free(slot)

    def __len__(self) -> int:
        with self.lock:
            return len(self.pending)

    def __del__(self) -> None:
        try:
            self.drain()  # before `keep` (the registrations) is released
        except Exception:  # pragma: no cover - interpreter shutdown
            pass


def _cuda_registrar() -> tuple[Callable[[int, int], str], Callable[[int], str]] | None:
    if _ext._C is None or not getattr(_ext._C, "with_cuda", False) or not torch.cuda.is_available():
        return None
    return _ext._C.host_register, _ext._C.host_unregister


_warned: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        logger.warning(message)


class Registrations:
    """Page-locked extents of one segment, one per slot, made lazily in the owning process and
    grown when a slot first holds a larger batch (the slot is free of copies then: a worker only
    filled it after its last fence completed). All are unregistered when this object dies, which
    is after the ring, every lease and every pending fence (``Fences.keep``) have let go of it.

    ``registrar`` is ``(register(ptr, nbytes) -> error text or "", unregister(ptr) -> text)``;
    the default is the CUDA extension's, which also clears CUDA's last error on failure. The first
    failure is logged once and turns pinning off for the segment: batches stay pageable, and
    whoever pins (torch's pin thread, CudaPrefetcher) copies them as it would any batch.
    """

    def __init__(self, mem: torch.Tensor, slot_bytes: int,
                 registrar: tuple[Callable[[int, int], str], Callable[[int], str]] | None = None) -> None:
        self.mem = mem  # the mapping outlives its registrations
        self.slot_bytes = slot_bytes
        self.registrar = registrar or _cuda_registrar()
        self.extent: dict[int, int] = {}
        self.lock = threading.Lock()
        self.error = "" if self.registrar is not None else "the extension was built without CUDA"
        if self.error:
            _warn_once(f"fastcollate ring: pin_memory=True but {self.error}; ring batches stay pageable and "
                       "are pinned by copying, as without the ring (rebuild with nvcc for page-locked slots)")

    @property
    def active(self) -> bool:
        return self.registrar is not None and not self.error

    def ensure(self, slot: int, nbytes: int) -> bool:
        """Page-lock slot ``slot``'s first ``nbytes`` (rounded up); False when pinning is off."""
        if not self.active:
            return False
        with self.lock:
            have = self.extent.get(slot, 0)
            if nbytes <= have:
                return True
            want = min(self.slot_bytes, max(nbytes + (nbytes >> 2), 1 << 20))  # room to grow
            want = -(-want // 4096) * 4096
            ptr = self.mem.data_ptr() + slot * self.slot_bytes
            register, unregister = self.registrar  # type: ignore[misc]
            if have:
                unregister(ptr)
                del self.extent[slot]
            err = register(ptr, want)
            if err:
                self.error = err
                _warn_once(f"fastcollate ring: cudaHostRegister failed ({err}); ring batches stay pageable and "
                           "are pinned by copying, as without the ring")
                return False
            self.extent[slot] = want
            return True

    def pinned_bytes(self) -> int:
        with self.lock:
            return sum(self.extent.values())

    def close(self) -> None:
        with self.lock:
            extents, self.extent = self.extent, {}
        if self.registrar is None:
            return
        for slot in extents:
            self.registrar[1](self.mem.data_ptr() + slot * self.slot_bytes)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # pragma: no cover - interpreter shutdown
            pass
