"""The per-batch trace: when each batch went through each stage, across processes.

A batch's id is (loader, epoch, index). Where it is made -- a DataLoader worker, or the main
process -- its sampler, fetch (the dataset's ``__getitem__`` / ``__getitems__``) and collate
(whatever collate_fn: fastcollate's, with its ring slot or fallback, or the user's own) are
timed; a worker's times travel with the batch it sends (a small tuple beside it in the same
pickle: no extra round trip, no lock per batch) and are read when the main process unpickles
it, which also gives the time spent in the result queue and the rebuild. The main process adds
what happens next: delivery by the loader's iterator, the prefetcher's pin/H2D/transforms, the
consumer's wait and the step's compute (StallMonitor).

How it sees inside torch's DataLoader without changing what it does: while tracing is on,
torch's dataset fetchers and its loader iterators' ``_next_index`` / ``__next__`` / ``_reset``
are wrapped (process-wide, in every worker too: inherited under fork, installed again under
spawn from ``FASTCOLLATE_TRACE``). Off -- the default -- nothing is wrapped and nothing is paid.
Clocks: ``time.perf_counter()``, CLOCK_MONOTONIC on Linux, one clock for every process.

Memory is bounded: the last ``capacity`` batches' records, and running totals per stage.
"""
from __future__ import annotations

import collections
import logging
import os
import sys
import threading
import time
from typing import Any

from torch.utils.data import dataloader as _tdl
from torch.utils.data._utils import fetch as _tfetch

logger = logging.getLogger("fastcollate")
now = time.perf_counter
ENV = "FASTCOLLATE_TRACE"
# the stages, in the order a batch meets them
STAGES = ("sampler", "fetch", "collate", "queue", "rebuild", "transfer", "wait", "compute")


class Record:
    """One batch's life. ``spans``: stage -> (start, end), perf_counter seconds."""

    __slots__ = ("loader", "epoch", "index", "worker", "pid", "tid", "spans", "samples", "slowest",
                 "ring", "nbytes", "h2d_ms", "gpu_ms")

    def __init__(self, loader: int, epoch: int, index: int) -> None:
        self.loader, self.epoch, self.index = loader, epoch, index
        self.worker, self.pid, self.tid = -1, os.getpid(), threading.get_ident()
        self.spans: dict[str, tuple[float, float]] = {}
        self.samples = 0
        self.slowest: tuple[Any, float] | None = None  # (sample index, seconds)
        self.ring: str | None = None  # ring / full / oversize / shared / custom / main
        self.nbytes = 0
        self.h2d_ms: float | None = None
        self.gpu_ms: float | None = None

    @property
    def id(self) -> tuple[int, int]:
        return self.epoch, self.index


class _Stage:
    __slots__ = ("total", "count", "max", "recent")

    def __init__(self, window: int) -> None:
        self.total, self.count, self.max = 0.0, 0, 0.0
        self.recent: collections.deque = collections.deque(maxlen=window)

    def add(self, seconds: float) -> None:
        self.total += seconds
        self.count += 1
        if seconds > self.max:
            self.max = seconds
        self.recent.append(seconds)


class Tracer:
    """The process's trace: the recent records and the running aggregates (main process)."""

    def __init__(self, capacity: int = 4096) -> None:
        self.capacity = capacity
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self.lock:
            self.records: collections.OrderedDict = collections.OrderedDict()
            self.stages = {s: _Stage(self.capacity) for s in STAGES}
            self.errors: collections.Counter = collections.Counter()
            self.workers: dict[int, dict[str, Any]] = {}   # pid -> id, batches, busy_s, first, last
            self.arrived: dict[tuple[int, int], tuple] = {}  # (worker pid, idx) -> worker span, not yet delivered
            self.loaders: dict[int, int] = {}                # loader id -> epochs begun
            self.t0 = now()
            self.delivered = 0

    def record(self, loader: int, epoch: int, index: int) -> Record:
        key = (loader, epoch, index)
        with self.lock:
            rec = self.records.get(key)
            if rec is None:
                rec = self.records[key] = Record(loader, epoch, index)
                while len(self.records) > self.capacity:
                    self.records.popitem(last=False)
        return rec

    def span(self, rec: Record, stage: str, t0: float, t1: float) -> None:
        rec.spans[stage] = (t0, t1)
        self.stages[stage].add(max(0.0, t1 - t0))

    def worker_busy(self, pid: int, worker: int, t0: float, t1: float) -> None:
        w = self.workers.get(pid)
        if w is None:
            w = self.workers[pid] = {"id": worker, "pid": pid, "batches": 0, "busy_s": 0.0, "first": t0, "last": t1}
        w["batches"] += 1
        w["busy_s"] += t1 - t0
        w["first"], w["last"] = min(w["first"], t0), max(w["last"], t1)


TRACER = Tracer()
_state = threading.local()  # per thread: the iterator being advanced, the last batch id it delivered
_collate_info: list = [None, 0]  # what the collate of this process's current batch said: (kind, nbytes)
_enabled = False
_originals: dict[tuple[type, str], Any] = {}


def enabled() -> bool:
    return _enabled


def last_id() -> tuple[int, int, int] | None:
    """(loader, epoch, index) of the batch most recently handed to this thread."""
    return getattr(_state, "last", None)


def set_last_id(batch_id: tuple[int, int, int] | None) -> None:
    _state.last = batch_id


def note_collate(kind: str, nbytes: int = 0) -> None:
    """The collate says where the batch went (ring slot, fallback...) for the trace."""
    _collate_info[0], _collate_info[1] = kind, nbytes


# ---- worker side (and main-process loading): the fetch -----------------------------------------

def _in_worker() -> bool:
    from torch.utils.data import get_worker_info

    return get_worker_info() is not None


# Samples cheaper than this are fetched without a clock read each (the slowest one does not
# matter, and two reads a sample would be a visible share of the fetch); decided per batch from
# the previous batch's mean.
_PER_SAMPLE_MIN_S = 20e-6
_per_sample = [True]


def _timed_fetch(self: Any, possibly_batched_index: Any, orig_fetch: Any) -> Any:
    """torch's fetch, with the dataset part and the collate_fn timed apart; in a worker the
    batch leaves with its times beside it."""
    t0 = now()
    marks = [0.0, 0.0]
    collate_fn = self.collate_fn
    _collate_info[0] = None

    def timed_collate(data: Any) -> Any:
        marks[0] = now()
        try:
            return collate_fn(data)
        finally:
            marks[1] = now()

    samples, slowest = 0, None
    self.collate_fn = timed_collate
    try:
        getitems = getattr(self.dataset, "__getitems__", None)
        if (isinstance(self, _tfetch._MapDatasetFetcher) and self.auto_collation and not getitems
                and isinstance(possibly_batched_index, (list, tuple)) and _per_sample[0]):
            # per sample, so that the slowest sample can be named -- only while samples cost enough
            # that a clock read each is noise (see _PER_SAMPLE_MIN_S)
            data, worst = [], -1.0
            prev = now()
            for i in possibly_batched_index:
                data.append(self.dataset[i])
                t = now()
                if t - prev > worst:
                    worst, slowest = t - prev, (i, t - prev)
                prev = t
            samples = len(data)
            out = timed_collate(data)
        else:
            out = orig_fetch(self, possibly_batched_index)
            try:
                samples = len(possibly_batched_index)
            except TypeError:
                samples = 1
    finally:
        self.collate_fn = collate_fn
    t1 = now()
    c0, c1 = (marks[0], marks[1]) if marks[1] else (t1, t1)
    if samples:
        _per_sample[0] = (c0 - t0) / samples >= _PER_SAMPLE_MIN_S
    kind = _collate_info[0] or ("main" if not marks[1] else "custom")
    span = (os.getpid(), _worker_id(), _caller_idx(), t0, c0, c0, c1, samples, slowest, kind, _collate_info[1])
    if _in_worker():
        return _Traced(span, out)
    _state.fetched = span  # main-process loading: picked up by the iterator's __next__
    return out


def _worker_id() -> int:
    from torch.utils.data import get_worker_info

    info = get_worker_info()
    return -1 if info is None else info.id


def _caller_idx() -> int | None:
    # torch's worker loop holds the batch's index as the local `idx` of the frame that calls
    # fetch(); the collate never sees it. Main-process loading takes it from the iterator.
    try:
        idx = sys._getframe(3).f_locals.get("idx")  # _caller_idx <- _timed_fetch <- fetch <- the worker loop
    except (ValueError, AttributeError):
        return None
    return idx if isinstance(idx, int) else None


class _Stamp:
    """A worker span that stamps its arrival time when unpickled in the main process."""

    __slots__ = ("span",)

    def __init__(self, span: tuple) -> None:
        self.span = span

    def __reduce__(self):
        return (_stamped, (self.span,))


def _stamped(span: tuple) -> tuple:
    return span + (now(),)


class _Traced:
    """A worker's batch with its times: unpickled in the main process, it is the batch."""

    __slots__ = ("span", "batch")

    def __init__(self, span: tuple, batch: Any) -> None:
        self.span, self.batch = span, batch

    def __reduce__(self):
        # the stamp is unpickled before the batch: arrival, then the batch's own rebuild
        return (_arrive, (_Stamp(self.span), self.batch))


def _arrive(span: tuple, batch: Any) -> Any:
    rebuilt = now()
    arrived = TRACER.arrived
    arrived[(span[0], span[2])] = span + (rebuilt,)
    if len(arrived) > 4 * TRACER.capacity:  # spans nobody delivered (an abandoned epoch): the oldest go
        for key in list(arrived)[: len(arrived) // 2]:
            arrived.pop(key, None)
    return batch


# ---- main side: the loader's iterators ---------------------------------------------------------

def _loader_of(it: Any) -> int:
    return getattr(it, "_fc_loader", id(it))


def _new_epoch(loader: Any) -> int:
    with TRACER.lock:
        epoch = TRACER.loaders.get(id(loader), 0)
        TRACER.loaders[id(loader)] = epoch + 1
    return epoch


def _wrap_iter_init(orig: Any) -> Any:
    def __init__(self: Any, loader: Any, *args: Any, **kwargs: Any) -> None:
        # set first: the multiprocessing iterator sends its first indices from inside __init__
        self._fc_loader, self._fc_epoch = id(loader), _new_epoch(loader)
        orig(self, loader, *args, **kwargs)
    return __init__


def _wrap_loader_iter(orig: Any) -> Any:
    def __iter__(self: Any) -> Any:
        it = self.__dict__.get("_iterator")
        if it is not None and self.persistent_workers and self.num_workers > 0 and hasattr(it, "_fc_epoch"):
            it._fc_epoch = _new_epoch(self)  # the same iterator, a new epoch: before _reset sends its indices
        return orig(self)
    return __iter__


def _wrap_next_index(orig: Any) -> Any:
    def _next_index(self: Any) -> Any:
        t0 = now()
        out = orig(self)
        # the batch this index becomes: what the multiprocessing iterator sends it as, else the next yielded
        idx = getattr(self, "_send_idx", None)
        idx = self._num_yielded if idx is None else idx
        rec = TRACER.record(_loader_of(self), getattr(self, "_fc_epoch", 0), idx)
        TRACER.span(rec, "sampler", t0, now())
        return out
    return _next_index


def _wrap_iter_next(orig: Any) -> Any:
    def __next__(self: Any) -> Any:
        return _delivered(self, orig)
    return __next__


def _delivered(self: Any, orig: Any) -> Any:
    t0 = now()
    _state.fetched = None
    try:
        batch = orig(self)
    except StopIteration:
        raise
    except Exception as exc:
        with TRACER.lock:
            TRACER.errors[type(exc).__name__] += 1
            if "timed out" in str(exc):
                TRACER.errors["worker_timeout"] += 1
        raise
    t1 = now()
    index = self._num_yielded - 1
    rec = TRACER.record(_loader_of(self), getattr(self, "_fc_epoch", 0), index)
    span = getattr(_state, "fetched", None)
    if span is None:
        workers = getattr(self, "_workers", None) or ()
        for w in workers:
            span = TRACER.arrived.pop((w.pid, index), None)
            if span is not None:
                break
    if span is not None:
        _fill(rec, span, t1)
    rec.spans["deliver"] = (t0, t1)
    set_last_id((rec.loader, rec.epoch, rec.index))
    TRACER.delivered += 1
    if logger.isEnabledFor(logging.INFO) and _LOG_EVERY[0] and TRACER.delivered % _LOG_EVERY[0] == 0:
        logger.info("batch %s: %s", rec.id, ", ".join(f"{s} {1e3 * (b - a):.2f} ms" for s, (a, b) in rec.spans.items()))
    return batch


_LOG_EVERY = [0]


def _fill(rec: Record, span: tuple, delivered: float) -> None:
    pid, worker, _idx, f0, f1, c0, c1, samples, slowest, kind, nbytes = span[:11]
    rec.pid, rec.worker, rec.samples, rec.slowest, rec.ring, rec.nbytes = pid, worker, samples, slowest, kind, nbytes
    TRACER.span(rec, "fetch", f0, f1)
    TRACER.span(rec, "collate", c0, c1)
    if len(span) >= 13:  # from a worker: queue, then the rebuild
        arrived, rebuilt = span[11], span[12]
        TRACER.span(rec, "queue", c1, arrived)
        TRACER.span(rec, "rebuild", arrived, rebuilt)
    TRACER.worker_busy(pid, worker, f0, c1)


# ---- on and off -----------------------------------------------------------------------------------

def _wrap_fetch(orig: Any) -> Any:
    def fetch(self: Any, possibly_batched_index: Any) -> Any:
        return _timed_fetch(self, possibly_batched_index, orig)
    return fetch


_WORKER_PATCHES = [
    (_tfetch._MapDatasetFetcher, "fetch", _wrap_fetch),
    (_tfetch._IterableDatasetFetcher, "fetch", _wrap_fetch),
]
_MAIN_PATCHES = [
    (_tdl._BaseDataLoaderIter, "__init__", _wrap_iter_init),
    (_tdl._BaseDataLoaderIter, "_next_index", _wrap_next_index),
    (_tdl._BaseDataLoaderIter, "__next__", _wrap_iter_next),
    (_tdl.DataLoader, "__iter__", _wrap_loader_iter),
]


def _install(patches: list) -> None:
    for cls, name, wrap in patches:
        if (cls, name) not in _originals:
            _originals[(cls, name)] = cls.__dict__[name]
            setattr(cls, name, wrap(cls.__dict__[name]))


_users = [0]  # tracing StallMonitors alive: the last one to go turns tracing off


def acquire(capacity: int | None = None, log_every: int = 0) -> Tracer:
    _users[0] += 1
    return enable(capacity, log_every)


def release() -> None:
    _users[0] = max(0, _users[0] - 1)
    if _users[0] == 0:
        disable()


def enable(capacity: int | None = None, log_every: int = 0) -> Tracer:
    """Turn tracing on for this process and the DataLoader workers it starts from now on."""
    global _enabled
    if capacity is not None and capacity != TRACER.capacity:
        TRACER.capacity = capacity
        TRACER.reset()
    _LOG_EVERY[0] = log_every
    _install(_WORKER_PATCHES + _MAIN_PATCHES)
    os.environ[ENV] = "1"
    _enabled = True
    return TRACER


def disable() -> None:
    """Unwrap torch's classes again; the trace collected so far stays readable."""
    global _enabled
    for (cls, name), fn in list(_originals.items()):
        setattr(cls, name, fn)
        del _originals[(cls, name)]
    os.environ.pop(ENV, None)
    _enabled = False


class WorkerInit:
    """A DataLoader's worker_init_fn that turns the worker-side trace on, then calls ``inner``."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __call__(self, worker_id: int) -> None:
        enable_in_worker()
        if self.inner is not None:
            self.inner(worker_id)


def enable_in_worker() -> None:
    """A spawned worker (fastcollate imported there with FASTCOLLATE_TRACE set): the fetch only."""
    global _enabled
    _install(_WORKER_PATCHES)
    _enabled = True
