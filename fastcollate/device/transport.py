"""Moving a batch to where it is consumed (runs on the prefetch thread).

CUDA: a batch whose tensor leaves all share one storage -- every fastcollate batch -- goes in
ONE host-to-device copy of that arena (pinned first, by the C++ copy engine with the GIL
released, unless it already is) and is rebuilt as views on the device; other batches go leaf by
leaf. Everything runs on a side stream; an event recorded after the transforms is what the
consumer waits on. CPU: the transforms run, nothing moves.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable

import torch

from .. import _ext
from ..core.guards import LEAKED, hand_over, wait_for
from ..core.tree import iter_tensors, map_tensors

Transform = Callable[[Any], Any]


class HostHold:
    """Host memory kept alive until a copy out of it has completed. Memory that torch's caching
    host allocator did not hand out (a page-locked ring slot) is not guarded by torch. ``release()``
    -- the consumer once ``done()``, ``close()``, garbage collection, a queued batch discarded at
    shutdown -- hands a ring slot over to wait for ``ready``, the side stream's event (not for the
    consumer's stream, where it would wait for the consumer's compute too), and for other memory
    waits for ``ready`` first, bounded, so nothing is released while read."""

    __slots__ = ("ready", "host")

    def __init__(self, ready: Any, host: Any) -> None:
        self.ready, self.host = ready, host

    def done(self) -> bool:
        return self.ready is None or bool(self.ready.query())

    def release(self, timeout: float | None = None) -> None:
        ready, box = self.ready, [self.host]
        self.ready = self.host = None
        if ready is not None and ready.query():
            ready = None
        if not hand_over(box, ready) and ready is not None:
            try:
                wait_for(ready, "the host-to-device copy of a prefetched batch (its side-stream event)", timeout)
            except TimeoutError:
                LEAKED.append(box)  # the copy may still read it: kept for the process's life
                raise
        box.clear()

    def __del__(self) -> None:
        try:
            if self.host is not None:
                self.release()
        except TimeoutError as exc:
            logging.getLogger("fastcollate").error("%s; its host memory is kept until the process exits", exc)
        except Exception:  # pragma: no cover - interpreter shutdown: the process is going away
            pass


@dataclasses.dataclass
class Delivered:
    batch: Any
    ready: Any = None                 # torch.cuda.Event recorded on the side stream
    owners: list = dataclasses.field(default_factory=list)  # device tensors to record_stream
    timing: Any = None                # (start, end) events around the H2D copy
    nbytes: int = 0
    single_copy: bool = False
    hold: HostHold | None = None          # host memory kept alive until `ready` has completed
    trace_id: Any = None              # the batch's id in the trace (fastcollate.core.trace), when tracing


def find_arena(batch: Any) -> tuple[torch.UntypedStorage, int] | None:
    """(storage, bytes used) when every tensor leaf is a contiguous CPU view of one storage."""
    leaves = list(iter_tensors(batch))
    if not leaves:
        return None
    storage = leaves[0].untyped_storage()
    base = storage.data_ptr()
    span = 0
    for t in leaves:
        # dense views (contiguous, or channels_last as torch.stack gives them): their bytes are
        # [offset, offset + numel) of the storage, whatever the order of the strides
        if t.device.type != "cpu" or t.untyped_storage().data_ptr() != base or not _dense(t) \
                or t.requires_grad or t.is_conj() or t.is_neg():
            return None
        span = max(span, (t.storage_offset() + t.numel()) * t.element_size())
    return storage, span


def _dense(t: torch.Tensor) -> bool:
    """A permuted contiguous block (no gaps, no overlap): contiguous, channels_last..."""
    if t.is_contiguous():
        return True
    expect = 1
    for st, n in sorted((st, n) for st, n in zip(t.stride(), t.shape) if n > 1):
        if st != expect:
            return False
        expect *= n
    return True


def _bytes_view(storage: torch.UntypedStorage, span: int) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8).set_(storage, 0, (span,), (1,))


def _view_like(arena: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    # same element offset: the arena keeps the host arena's byte layout
    return torch.empty(0, dtype=t.dtype, device=arena.device).set_(
        arena.untyped_storage(), t.storage_offset(), t.shape, t.stride())


class CpuTransport:
    def __init__(self, transform: Transform | None) -> None:
        self.transform = transform

    def __call__(self, batch: Any) -> Delivered:
        return Delivered(self.transform(batch) if self.transform is not None else batch)


class CudaTransport:
    def __init__(self, device: torch.device, transform: Transform | None, copy_threads: int) -> None:
        self.device = device
        self.transform = transform
        self.copy_threads = copy_threads
        self.stream = torch.cuda.Stream(device=device)  # one side stream for the prefetcher's life

    def pin(self, host: torch.Tensor) -> torch.Tensor:
        # torch's caching host allocator: the non_blocking copy below records an event on the
        # block, so it is not handed out again before the copy out of it has completed
        pinned = torch.empty(host.numel(), dtype=torch.uint8, pin_memory=True)
        if _ext._C is not None:
            _ext._C.copy_bytes(pinned, host, self.copy_threads, 4 << 20)
        else:
            pinned.copy_(host)
        return pinned

    def __call__(self, batch: Any) -> Delivered:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(self.stream):
            arena = find_arena(batch)
            if arena is not None:
                storage, span = arena
                host = _bytes_view(storage, span)
                src = host if host.is_pinned() else self.pin(host)
                dev = torch.empty(span, dtype=torch.uint8, device=self.device)
                start.record(self.stream)
                dev.copy_(src, non_blocking=True)  # the one cudaMemcpyAsync of the batch
                end.record(self.stream)
                out = map_tensors(batch, lambda t: _view_like(dev, t))
                nbytes = span
            else:
                leaves = list(iter_tensors(batch))
                nbytes = sum(t.numel() * t.element_size() for t in leaves)
                start.record(self.stream)
                out = map_tensors(batch, lambda t: t.to(self.device, non_blocking=True) if t.is_cuda else
                                  (t if t.is_pinned() else t.pin_memory()).to(self.device, non_blocking=True))
                end.record(self.stream)
            if self.transform is not None:
                out = self.transform(out)
            ready = torch.cuda.Event()
            ready.record(self.stream)
        # one record_stream per device storage (views share it)
        owners = {t.untyped_storage().data_ptr(): t for t in iter_tensors(out) if t.is_cuda}
        return Delivered(out, ready, list(owners.values()), (start, end), nbytes, arena is not None,
                         hold=HostHold(ready, batch))
