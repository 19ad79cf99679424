"""CudaPrefetcher: wraps a loader; a background thread fetches, pins and copies batches to the
GPU on a side stream, `depth` batches ahead, while the training step computes."""
from __future__ import annotations

import collections
import os
import threading
import warnings
import weakref
from typing import Any, Iterable, Iterator

import torch

from ..core import trace as _trace
from ..core.collator import usable_cores
from .pipeline import Producer, PipelineStats
from .transport import CpuTransport, CudaTransport, Delivered, Transform

_warned_pin = False
_warn_lock = threading.Lock()


def resolve_device(device: str | torch.device | None) -> torch.device:
    """None: ``cuda:LOCAL_RANK`` under torchrun, else ``cuda`` when available, else ``cpu``."""
    if device is None:
        if not torch.cuda.is_available():
            return torch.device("cpu")
        return torch.device("cuda", _local_ordinal())
    device = torch.device(device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(f"CudaPrefetcher: device {device} requested but CUDA is not available")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
    return device


def _local_ordinal() -> int:
    """LOCAL_RANK when it names a visible GPU; else the current device (each rank sees one GPU
    when the launcher sets CUDA_VISIBLE_DEVICES per rank)."""
    try:
        rank = int(os.environ.get("LOCAL_RANK", ""))
    except ValueError:
        rank = -1
    return rank if 0 <= rank < torch.cuda.device_count() else torch.cuda.current_device()


class _Iterator:
    """One epoch as seen by the consumer: waits on each batch's event, never on the host."""

    def __init__(self, owner: "CudaPrefetcher", epoch: Producer) -> None:
        self._owner = owner
        self._epoch = epoch

    def __iter__(self) -> "_Iterator":
        return self

    def __next__(self) -> Any:
        d: Delivered = next(self._epoch)
        if d.trace_id is not None:
            _trace.set_last_id(d.trace_id)  # what the consumer's monitor attributes its wait and step to
        return self._owner._receive(d)

    def close(self) -> None:
        self._epoch.close()


class CudaPrefetcher:
    """Iterate a loader with batches already on ``device``, ``depth`` batches ahead.

    A batch whose tensor leaves share one storage (every fastcollate batch) is copied in one
    host-to-device copy and rebuilt as views; other batches go leaf by leaf. ``transform`` runs
    on the side stream. The consumer's stream waits on an event (no host sync); device tensors
    get ``record_stream`` on the consumer's stream, so the caching allocator does not reuse them
    while the consumer's kernels may still read them. Without CUDA the batches stay on the CPU,
    transformed there, with the same iteration semantics.

    ``timeout``: seconds the consumer waits for the next batch before a TimeoutError (None: as
    long as the prefetch thread is alive; a thread that ended without a batch or an error is an
    error at once). Host memory of page-locked ring slots waits for the side stream's event of
    its copy, not for the consumer's stream.

    Leave the DataLoader's own ``pin_memory=False``: its pin thread pins leaf by leaf, which
    breaks the single arena (a wrapped pin_memory loader still works, leaf by leaf, with a warning).

    >>> import torch, fastcollate
    >>> from torch.utils.data import DataLoader
    >>> loader = DataLoader(list(range(10)), batch_size=4, collate_fn=fastcollate.collate)
    >>> [b.tolist() for b in fastcollate.CudaPrefetcher(loader, device="cpu")]
    [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    """

    def __init__(self, loader: Iterable, device: str | torch.device | None = None, depth: int = 2,
                 transform: Transform | None = None, *, copy_threads: int | None = None,
                 join_timeout: float = 10.0, timeout: float | None = None) -> None:
        if not isinstance(depth, int) or depth < 1:
            raise ValueError(f"CudaPrefetcher: depth must be a positive int, got {depth!r}")
        self.loader = loader
        self.device = resolve_device(device)
        self.depth = depth
        self.transform = transform
        self.join_timeout = join_timeout
        self.timeout = timeout
        self._stats = PipelineStats()
        self._lock = threading.Lock()
        self._bytes = self._single = self._leafwise = 0
        self._h2d_ms = 0.0
        self._pending: list = []
        self._holds: collections.deque = collections.deque()  # transport.HostHold, in copy order
        self._current: weakref.ref | None = None
        if self.device.type == "cuda":
            self._transport: Any = CudaTransport(self.device, transform, copy_threads or min(4, usable_cores()))
        else:
            self._transport = CpuTransport(transform)
        if getattr(loader, "pin_memory", False):
            global _warned_pin
            with _warn_lock:
                if not _warned_pin:
                    _warned_pin = True
                    warnings.warn("CudaPrefetcher: the wrapped DataLoader has pin_memory=True; its pin thread pins "
                                  "leaf by leaf and breaks fastcollate's single arena, so batches move leaf by "
                                  "leaf. Use pin_memory=False and let the prefetcher pin.", stacklevel=2)

    # -- the loader's face
    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    @property
    def dataset(self) -> Any:
        return self.loader.dataset  # type: ignore[attr-defined]

    @property
    def sampler(self) -> Any:
        return self.loader.sampler  # type: ignore[attr-defined]

    @property
    def batch_size(self) -> Any:
        return self.loader.batch_size  # type: ignore[attr-defined]

    def set_epoch(self, epoch: int) -> None:
        """Forwarded to the loader, or to its (batch) sampler, e.g. a DistributedSampler."""
        for target in (self.loader, getattr(self.loader, "sampler", None),
                       getattr(getattr(self.loader, "batch_sampler", None), "sampler", None)):
            if target is not None and hasattr(target, "set_epoch"):
                target.set_epoch(epoch)
                return

    # -- iteration
    def __iter__(self) -> Iterator[Any]:
        self.close()  # re-iterating starts a new epoch; the old thread is joined first
        on_start = (lambda: torch.cuda.set_device(self.device)) if self.device.type == "cuda" else None
        stage = self._traced_transport if _trace.enabled() else self._transport
        epoch = Producer(self.loader, stage, self.depth, self._stats, on_start=on_start,
                      join_timeout=self.join_timeout, get_timeout=self.timeout)
        it = _Iterator(self, epoch)
        self._current = weakref.ref(it)
        return it

    def _traced_transport(self, batch: Any) -> Delivered:
        # on the prefetch thread, right after the loader handed this thread the batch
        batch_id = _trace.last_id()
        t0 = _trace.now()
        d = self._transport(batch)
        if batch_id is not None:
            _trace.span(batch_id, "transfer", t0, _trace.now())
            d.trace_id = batch_id
        return d

    def _receive(self, d: Delivered) -> Any:
        with self._lock:
            self._bytes += d.nbytes
            if d.single_copy:
                self._single += 1
            elif d.ready is not None:
                self._leafwise += 1
        if d.ready is not None:
            stream = torch.cuda.current_stream(self.device)
            stream.wait_event(d.ready)
            for t in d.owners:
                t.record_stream(stream)
            with self._lock:
                self._pending.append((*d.timing, d.trace_id))
                self._drain_timings()
                if d.hold is not None:
                    self._holds.append(d.hold)
                while self._holds and self._holds[0].done():  # one side stream: copies complete in order
                    self._holds.popleft().release()
        return d.batch

    def _drain_timings(self) -> None:
        # lagged: only copies whose end event has completed are read (query() never blocks)
        keep = []
        for start, end, batch_id in self._pending:
            if end.query():
                ms = start.elapsed_time(end)
                self._h2d_ms += ms
                if batch_id is not None:
                    _trace.note(batch_id, "h2d_ms", ms)
            else:
                keep.append((start, end, batch_id))
        self._pending = keep

    def close(self) -> None:
        """Stop the current epoch's thread and join it."""
        it = self._current() if self._current is not None else None
        if it is not None:
            it.close()
        self._current = None
        with self._lock:
            while self._holds:  # ring slots wait for the side stream's events; other memory is waited for
                self._holds.popleft().release()

    def __enter__(self) -> "CudaPrefetcher":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def stats(self) -> dict[str, Any]:
        """batches, bytes, single_copy / leafwise batches, h2d_ms (completed copies, read lagged),
        h2d_pending, wait_s (consumer waiting on the host), queue_high_water, pinned_bytes."""
        with self._lock:
            if self._pending:
                self._drain_timings()
            out = {"batches": self._stats.items, "bytes": self._bytes, "single_copy_batches": self._single,
                   "leafwise_batches": self._leafwise, "h2d_ms": self._h2d_ms, "h2d_pending": len(self._pending)}
        with self._stats.lock:
            out.update(wait_s=self._stats.wait_s, queue_high_water=self._stats.high_water, epochs=self._stats.epochs)
        out["pinned_bytes"] = _pinned_bytes() if self.device.type == "cuda" else 0
        return out


def _pinned_bytes() -> int:
    """Bytes of pinned blocks torch's caching host allocator owns (-1 where torch has no such stat).
    The flattened key is ``allocated_bytes.current`` (torch 2.13); older releases nest a pool name."""
    stats = getattr(torch.cuda, "host_memory_stats", None)
    if stats is None:
        return -1
    try:
        flat = stats()
    except RuntimeError:
        return -1
    for key in ("allocated_bytes.current", "allocated_bytes.all.current"):
        if key in flat:
            return int(flat[key])
    return -1
