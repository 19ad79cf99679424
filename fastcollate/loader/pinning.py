"""Page-locked memory that torch's caching host allocator did not hand out (the worker ring's
slots), and the fences that keep such memory from being rewritten while a copy may read it.

torch records an event on a pinned block after a ``non_blocking`` copy only for blocks its
caching host allocator owns; for a range page-locked with ``cudaHostRegister`` it records
nothing, so ``batch.to("cuda", non_blocking=True)`` returns while the DMA still reads the host
bytes. Whoever hands such memory back for reuse therefore records a fence on the current stream
first (the stream the copy was issued on, in the usual loop; ``fastcollate.release_after`` adds
the others) and reuses the memory only once the fence has completed, polled without blocking.
``Fences`` does that bookkeeping for any fence type with ``query()`` (a ``torch.cuda.Event``;
tests use a double).
"""
from __future__ import annotations

import collections
import logging
import threading
from typing import Any, Callable

import torch

from .. import _ext
from ..core.guards import LEAKED, wait_for

logger = logging.getLogger("fastcollate")
FenceFactory = Callable[..., Any]  # factory(stream=None) -> a fence recorded on `stream` (None: the current one)


def cuda_fence(stream: Any = None) -> Any:
    """An event recorded on ``stream`` (the current CUDA stream when None): complete once the work
    queued there before it is."""
    event = torch.cuda.Event()
    event.record(stream)
    return event


class Fences:
    """Slots freed only after the fences recorded for them have completed.

    ``release(slot)`` is the ring lease's hook (called when a batch's last view dies, on any
    thread, with the GIL, possibly from inside a garbage collection that interrupted ``poll()``
    on the same thread): it records a fence and queues the slot without taking a lock, so it
    cannot deadlock on re-entry. ``poll()`` frees what has completed and never blocks (a caller
    that finds another poll under way, or re-enters one, returns 0 and leaves the work to the next
    poll); ``drain()`` waits, bounded (close and garbage collection only). Whatever is kept in
    ``keep`` (the page-locking registrations) outlives every pending fence.

    ``add(slot, fence)`` attaches a fence to a slot still held (``release_after``); with
    ``instead=True`` the fence replaces the one ``release`` would record, for a release that
    happens on this thread before ``settle()`` (the prefetcher dropping a batch it alone copied).
    """

    def __init__(self, factory: FenceFactory, free: Callable[[int], None], keep: Any = None) -> None:
        self.factory = factory
        self.free = free
        self.keep = keep
        self.lock = threading.Lock()  # held by poll/drain only; never by release
        self.incoming: collections.deque = collections.deque()  # (fences, slot): appends are atomic
        self.pending: list[tuple[list[Any], int]] = []  # owned by the lock's holder
        self.extra: dict[int, list[Any]] = {}  # slot -> fences added while its views live
        self.instead: dict[int, tuple[int, list[Any]]] = {}  # slot -> (thread, fences replacing release's)
        self.released = 0

    def add(self, slot: int, fence: Any, *, instead: bool = False) -> None:
        if instead:
            tid = threading.get_ident()
            prior = self.instead.get(slot)
            fences = prior[1] if prior is not None and prior[0] == tid else []
            if fence is not None:
                fences.append(fence)
            self.instead[slot] = (tid, fences)
        elif fence is not None:
            self.extra.setdefault(slot, []).append(fence)

    def settle(self, slot: int) -> None:
        """The replacement of ``add(instead=True)`` was not used (other views outlived the drop):
        its fences still guard the slot, and the last view's release records its own as usual."""
        item = self.instead.get(slot)
        if item is not None and item[0] == threading.get_ident():
            del self.instead[slot]
            if item[1]:
                self.extra.setdefault(slot, []).extend(item[1])

    def release(self, slot: int) -> None:
        fences = self.extra.pop(slot, [])
        item = self.instead.get(slot)
        if item is not None and item[0] == threading.get_ident():
            del self.instead[slot]
            fences.extend(item[1])
        else:
            fences.append(self.factory())
        self.incoming.append((fences, slot))
        self.poll()

    def _take_incoming(self) -> None:
        while True:
            try:
                self.pending.append(self.incoming.popleft())
            except IndexError:
                return

    def poll(self) -> int:
        if not self.lock.acquire(blocking=False):
            return 0
        try:
            self._take_incoming()
            if not self.pending:
                return 0
            keep: list[tuple[list[Any], int]] = []
            freed = 0
            for item in self.pending:  # fences on different streams may complete out of order
                if all(f.query() for f in item[0]):
                    self.free(item[1])
                    freed += 1
                else:
                    keep.append(item)
            self.pending = keep
            self.released += freed
            return freed
        finally:
            self.lock.release()

    def drain(self, timeout: float | None = None) -> None:
        """Wait for every pending fence (at most ``timeout`` s each, WAIT_TIMEOUT_S by default) and
        free the slots. On a timeout the slot stays held and ``keep`` is never let go of: a copy
        that may still read page-locked memory must not see it unregistered."""
        with self.lock:
            while True:
                self._take_incoming()
                if not self.pending:
                    return
                fences, slot = self.pending[0]
                try:
                    for f in fences:
                        wait_for(f, f"the copies out of ring slot {slot} (a pending fence)", timeout)
                except TimeoutError:
                    LEAKED.append(self.keep)
                    raise
                self.pending.pop(0)
                self.free(slot)
                self.released += 1

    def __len__(self) -> int:
        return len(self.pending) + len(self.incoming)

    def __del__(self) -> None:
        try:
            self.drain()  # before `keep` (the registrations) is released
        except TimeoutError as exc:
            logger.error("%s; its page-locked memory stays registered until the process exits", exc)
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
