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
are wrapped (process-wide, and in the workers of loaders iterated meanwhile: inherited under
fork; under spawn and forkserver a ``worker_init_fn`` wrapper installs the fetcher's side in
those workers only -- no environment variable reaches other subprocesses). A fetch made inside
another (a loader iterated in a dataset's ``__getitem__``) is timed but never wrapped: what a
loader yields is never changed. Off -- the default -- nothing is wrapped and nothing is paid.
Clocks: ``time.perf_counter()``, CLOCK_MONOTONIC on Linux, one clock for every process. Beside
the wall clock, each fetch records its thread's CPU time and the time it spent blocked of its
own accord (a read, a sleep: voluntary context switches), so that the time a busy machine's
scheduler took from it is not mistaken for the dataset's own slowness.

Each tracing StallMonitor has a Tracer of its own -- its view of the trace, which its reset()
clears without touching another's; events reach every live Tracer. Memory is bounded: the last
``capacity`` batches' records, and running totals per stage.
"""
from __future__ import annotations

import collections
import itertools
import logging
import os
import sys
import threading
import time
import weakref
from typing import Any

from torch.utils.data import dataloader as _tdl
from torch.utils.data._utils import fetch as _tfetch

logger = logging.getLogger("fastcollate")
now = time.perf_counter
cpu_now = time.thread_time


try:
    import resource
    _RUSAGE = getattr(resource, "RUSAGE_THREAD", None)
except ImportError:  # not a POSIX system
    _RUSAGE = None


def _voluntary_switches() -> tuple[int, int]:
    """This thread's (voluntary, involuntary) context switches so far; (-1, -1) where the system
    does not say (then every off-CPU moment of a fetch counts as blocking)."""
    if _RUSAGE is None:
        return -1, -1
    r = resource.getrusage(_RUSAGE)
    return r.ru_nvcsw, r.ru_nivcsw


def _blocked(off_cpu: float, at0: tuple[int, int], at1: tuple[int, int]) -> float:
    """Of a fetch's time off the CPU, the part it blocked of its own accord (I/O, sleeps, a lock):
    apportioned by its voluntary against its involuntary switches -- a preempted thread switches
    involuntarily, and that wait is the machine's, not the dataset's."""
    if at0[0] < 0 or at1[0] < 0:
        return off_cpu
    voluntary, preempted = at1[0] - at0[0], at1[1] - at0[1]
    return off_cpu * voluntary / (voluntary + preempted) if voluntary > 0 else 0.0


# the same clocks, for the loader's auto mode (fastcollate.loader.autotune), which times its fetches
# without the trace
voluntary_switches = _voluntary_switches
blocked_time = _blocked


# the stages, in the order a batch meets them
STAGES = ("sampler", "fetch", "collate", "queue", "rebuild", "transfer", "wait", "compute")


class Record:
    """One batch's life. ``spans``: stage -> (start, end), perf_counter seconds."""

    __slots__ = ("loader", "epoch", "index", "worker", "pid", "tid", "spans", "samples", "slowest",
                 "ring", "nbytes", "h2d_ms", "gpu_ms", "fetch_cpu_s", "fetch_blocked_s", "parts")

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
        # of the fetch: the thread's CPU seconds, and the seconds it was blocked on its own (I/O,
        # sleeps) -- the rest of its wall time is the scheduler's (other processes ran)
        self.fetch_cpu_s: float | None = None
        self.fetch_blocked_s: float | None = None
        # the fetch's own stages, where the dataset reports them (fastcollate.images: reading the
        # files, then decode + resize in the engine): {"spans": [(name, t0, t1)], "<count>": n}
        self.parts: dict[str, Any] | None = None

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
    """One view of the trace: the recent records and the running aggregates (main process)."""

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
            # the fetches' own stages, summed: "<name>_s" wall seconds, and the counts reported
            self.parts: collections.Counter = collections.Counter()
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

    def add_parts(self, rec: Record, parts: dict[str, Any]) -> None:
        rec.parts = parts
        with self.lock:
            self.parts["batches"] += 1
            for name, t0, t1 in parts.get("spans", ()):
                self.parts[f"{name}_s"] += max(0.0, t1 - t0)
            for key, value in parts.items():
                if key != "spans":
                    self.parts[key] += value

    def worker_busy(self, pid: int, worker: int, t0: float, t1: float) -> None:
        w = self.workers.get(pid)
        if w is None:
            w = self.workers[pid] = {"id": worker, "pid": pid, "batches": 0, "busy_s": 0.0, "first": t0, "last": t1}
        w["batches"] += 1
        w["busy_s"] += t1 - t0
        w["first"], w["last"] = min(w["first"], t0), max(w["last"], t1)


TRACERS: list[Tracer] = []  # the live tracers (one per tracing StallMonitor): every event reaches each
_ARRIVED: dict[tuple[int, int], tuple] = {}  # (worker pid, idx) -> worker span, not yet delivered
# loader -> [its number in the trace, epochs begun]; weak, so that a later loader that reuses a
# collected one's id() starts at epoch 0 under a number of its own
_LOADERS: "weakref.WeakKeyDictionary[Any, list[int]]" = weakref.WeakKeyDictionary()
_BY_ID: dict[int, list[int]] = {}  # loaders that take no weak reference: by id(), as before
_serial = itertools.count(1)
_delivered_count = [0]
_state = threading.local()  # per thread: the iterator being advanced, the last batch id it delivered
# what the collate of this process's current batch said: (kind, nbytes, seconds of the dataset's
# own work it did: an image batch decoded inside the collate, into its arena)
_collate_info: list = [None, 0, 0.0, None]  # ... and the fetch's parts (note_fetch_part)
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


def note_dataset_work(seconds: float) -> None:
    """The collate did ``seconds`` of the dataset's work (fastcollate.images decodes a batch
    inside the collate, straight into its arena): the trace counts them as the fetch's."""
    _collate_info[2] += seconds


def note_fetch_part(name: str, t0: float, t1: float, **counts: float) -> None:
    """A stage inside this process's current fetch -- ``name`` ran from t0 to t1 -- and counts to
    add up (CPU seconds over a pool's threads, images, fallbacks): the trace shows it nested in
    the fetch, and the monitor's report sums it. Free when tracing is off."""
    if not _enabled:
        return
    parts = _collate_info[3]
    if parts is None:
        parts = _collate_info[3] = {"spans": []}
    parts["spans"].append((name, t0, t1))
    for key, value in counts.items():
        parts[key] = parts.get(key, 0) + value


def span(batch_id: tuple[int, int, int], stage: str, t0: float, t1: float) -> None:
    """Stage ``stage`` of batch ``batch_id`` (loader, epoch, index) ran from t0 to t1: in every live view."""
    for tracer in list(TRACERS):
        tracer.span(tracer.record(*batch_id), stage, t0, t1)


def note(batch_id: tuple[int, int, int], name: str, value: Any) -> None:
    """Sets a record field (h2d_ms, gpu_ms...) of batch ``batch_id`` in every live view."""
    for tracer in list(TRACERS):
        setattr(tracer.record(*batch_id), name, value)


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
    batch leaves with its times beside it -- only the worker loop's own fetch: one made inside
    it (a loader iterated by the dataset) returns exactly what it fetched."""
    depth = getattr(_state, "fetch_depth", 0)
    _state.fetch_depth = depth + 1
    try:
        return _timed_fetch_at(self, possibly_batched_index, orig_fetch, depth)
    finally:
        _state.fetch_depth = depth


INDEX_NOTE = "fastcollate: raised by the dataset at index "


def dataset_index(exc: BaseException, dataset: Any) -> tuple[bool, Any]:
    """(found, index): whether ``exc`` came out of ``dataset.__getitem__`` (its frame is in the
    traceback: the innermost one, a subclass may call its base's) and the index it was given."""
    found, index = False, None
    tb = exc.__traceback__
    while tb is not None:
        frame, code = tb.tb_frame, tb.tb_frame.f_code
        if code.co_name == "__getitem__" and frame.f_locals.get("self") is dataset:
            found = True
            if code.co_argcount >= 2:
                index = frame.f_locals.get(code.co_varnames[1])
        tb = tb.tb_next
    return found, index


def _note_index(exc: BaseException, dataset: Any) -> None:
    """Name the failing index on the dataset's exception: from a worker it reaches the main process
    as torch's text of its traceback (notes included), where no frame can be read any more."""
    found, index = dataset_index(exc, dataset)
    note = f"{INDEX_NOTE}{index!r}"
    if found and index is not None and hasattr(exc, "add_note") and note not in getattr(exc, "__notes__", ()):
        exc.add_note(note)


def _timed_fetch_at(self: Any, possibly_batched_index: Any, orig_fetch: Any, depth: int) -> Any:
    t0, cpu0, vol0 = now(), cpu_now(), _voluntary_switches()
    marks: list[Any] = [0.0, 0.0, 0.0, (0, 0)]  # collate start, end; the fetch's CPU clock and switches at its end
    collate_fn = self.collate_fn
    _collate_info[0], _collate_info[2], _collate_info[3] = None, 0.0, None

    def timed_collate(data: Any) -> Any:
        marks[2], marks[3] = cpu_now(), _voluntary_switches()
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
    except Exception as exc:  # the same exception, on its way: with the index where the dataset raised
        _note_index(exc, self.dataset)
        raise
    finally:
        self.collate_fn = collate_fn
    t1 = now()
    c0, c1 = (marks[0], marks[1]) if marks[1] else (t1, t1)
    cpu1, vol = (marks[2], marks[3]) if marks[1] else (cpu_now(), _voluntary_switches())
    moved = min(_collate_info[2], c1 - c0)  # the dataset's work done in the collate: the fetch's
    c0, cpu1 = c0 + moved, cpu1 + moved
    # the fetch's off-CPU time counts as blocking only if it blocked (a voluntary switch): a
    # preempted thread switches involuntarily, and that wait is the machine's, not the dataset's
    blocked = _blocked(max(0.0, (c0 - t0) - (cpu1 - cpu0)), vol0, vol)
    if samples:
        _per_sample[0] = (c0 - t0) / samples >= _PER_SAMPLE_MIN_S
    kind = _collate_info[0] or ("main" if not marks[1] else "custom")
    worker_span = (os.getpid(), _worker_id(), _caller_idx(), t0, c0, c0, c1, samples, slowest, kind, _collate_info[1],
                   cpu1 - cpu0, blocked, _collate_info[3])
    if depth == 0 and _in_worker():
        return _Traced(worker_span, out)
    _state.fetched = worker_span  # main-process loading: picked up by the iterator's __next__
    return out


def _worker_id() -> int:
    from torch.utils.data import get_worker_info

    info = get_worker_info()
    return -1 if info is None else info.id


def _caller_idx() -> int | None:
    # torch's worker loop holds the batch's index as the local `idx` of the frame that calls
    # fetch(); the collate never sees it. Main-process loading takes it from the iterator.
    try:
        # _caller_idx <- _timed_fetch_at <- _timed_fetch <- fetch <- the worker loop
        idx = sys._getframe(4).f_locals.get("idx")
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
    _ARRIVED[(span[0], span[2])] = span + (rebuilt,)
    if len(_ARRIVED) > 4 * _CAPACITY[0]:  # spans nobody delivered (an abandoned epoch): the oldest go
        for key in list(_ARRIVED)[: len(_ARRIVED) // 2]:
            _ARRIVED.pop(key, None)
    return batch


_CAPACITY = [4096]  # the largest live view's


# ---- main side: the loader's iterators ---------------------------------------------------------

def _loader_of(it: Any) -> int:
    return getattr(it, "_fc_loader", id(it))


_epoch_lock = threading.Lock()


def _entry(loader: Any) -> list[int]:
    # under _epoch_lock
    try:
        e = _LOADERS.get(loader)
        if e is None:
            e = _LOADERS[loader] = [next(_serial), 0]
    except TypeError:  # no weak reference to it
        e = _BY_ID.setdefault(id(loader), [next(_serial), 0])
    return e


def _new_epoch(loader: Any) -> tuple[int, int]:
    """The loader's number in the trace and the epoch it begins now."""
    with _epoch_lock:
        e = _entry(loader)
        epoch, e[1] = e[1], e[1] + 1
    return e[0], epoch


def _wrap_iter_init(orig: Any) -> Any:
    def __init__(self: Any, loader: Any, *args: Any, **kwargs: Any) -> None:
        # set first: the multiprocessing iterator sends its first indices from inside __init__
        self._fc_loader, self._fc_epoch = _new_epoch(loader)
        orig(self, loader, *args, **kwargs)
    return __init__


def _wrap_mp_iter_init(orig: Any) -> Any:
    def __init__(self: Any, loader: Any, *args: Any, **kwargs: Any) -> None:
        # the workers this iterator starts (spawned ones import nothing of the trace by
        # themselves) turn its fetcher side on first: through the loader's worker_init_fn,
        # for the time they are started -- only this loader's workers, no environment variable
        init = loader.worker_init_fn
        if isinstance(init, WorkerInit):
            return orig(self, loader, *args, **kwargs)
        loader.worker_init_fn = WorkerInit(init)
        try:
            orig(self, loader, *args, **kwargs)
        finally:
            loader.worker_init_fn = init
    return __init__


def _wrap_loader_iter(orig: Any) -> Any:
    def __iter__(self: Any) -> Any:
        it = self.__dict__.get("_iterator")
        if it is not None and self.persistent_workers and self.num_workers > 0 and hasattr(it, "_fc_epoch"):
            # the same iterator, a new epoch: numbered before _reset sends its indices
            it._fc_loader, it._fc_epoch = _new_epoch(self)
        return orig(self)
    return __iter__


def _wrap_next_index(orig: Any) -> Any:
    def _next_index(self: Any) -> Any:
        t0 = now()
        out = orig(self)
        # the batch this index becomes: what the multiprocessing iterator sends it as, else the next yielded
        idx = getattr(self, "_send_idx", None)
        idx = self._num_yielded if idx is None else idx
        span((_loader_of(self), getattr(self, "_fc_epoch", 0), idx), "sampler", t0, now())
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
        for tracer in list(TRACERS):
            with tracer.lock:
                tracer.errors[type(exc).__name__] += 1
                if "timed out" in str(exc):
                    tracer.errors["worker_timeout"] += 1
        raise
    t1 = now()
    index = self._num_yielded - 1
    batch_id = (_loader_of(self), getattr(self, "_fc_epoch", 0), index)
    worker_span = getattr(_state, "fetched", None)
    if worker_span is None:
        workers = getattr(self, "_workers", None) or ()
        for w in workers:
            worker_span = _ARRIVED.pop((w.pid, index), None)
            if worker_span is not None:
                break
    rec = None
    for tracer in list(TRACERS):
        rec = tracer.record(*batch_id)
        if worker_span is not None:
            _fill(tracer, rec, worker_span, t1)
        rec.spans["deliver"] = (t0, t1)
        tracer.delivered += 1
    set_last_id(batch_id)
    _delivered_count[0] += 1
    if (rec is not None and logger.isEnabledFor(logging.INFO) and _LOG_EVERY[0]
            and _delivered_count[0] % _LOG_EVERY[0] == 0):
        logger.info("batch %s: %s", rec.id, ", ".join(f"{s} {1e3 * (b - a):.2f} ms" for s, (a, b) in rec.spans.items()))
    return batch


_LOG_EVERY = [0]
_SPAN_FIELDS = 14  # what _timed_fetch_at puts in a worker span; the arrival and rebuild times follow


def _fill(tracer: Tracer, rec: Record, span: tuple, delivered: float) -> None:
    pid, worker, _idx, f0, f1, c0, c1, samples, slowest, kind, nbytes, fetch_cpu, blocked, parts = span[:_SPAN_FIELDS]
    rec.pid, rec.worker, rec.samples, rec.slowest, rec.ring, rec.nbytes = pid, worker, samples, slowest, kind, nbytes
    rec.fetch_cpu_s, rec.fetch_blocked_s = fetch_cpu, blocked
    if parts:
        tracer.add_parts(rec, parts)
    tracer.span(rec, "fetch", f0, f1)
    tracer.span(rec, "collate", c0, c1)
    if len(span) >= _SPAN_FIELDS + 2:  # from a worker: queue, then the rebuild
        arrived, rebuilt = span[_SPAN_FIELDS], span[_SPAN_FIELDS + 1]
        tracer.span(rec, "queue", c1, arrived)
        tracer.span(rec, "rebuild", arrived, rebuilt)
    tracer.worker_busy(pid, worker, f0, c1)


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
    (_tdl._MultiProcessingDataLoaderIter, "__init__", _wrap_mp_iter_init),
    (_tdl._BaseDataLoaderIter, "_next_index", _wrap_next_index),
    (_tdl._BaseDataLoaderIter, "__next__", _wrap_iter_next),
    (_tdl.DataLoader, "__iter__", _wrap_loader_iter),
]


def _install(patches: list) -> None:
    for cls, name, wrap in patches:
        if (cls, name) not in _originals:
            _originals[(cls, name)] = cls.__dict__[name]
            setattr(cls, name, wrap(cls.__dict__[name]))


def acquire(capacity: int | None = None, log_every: int = 0) -> Tracer:
    """A new view of the trace (a tracing StallMonitor's own), tracing on while any is held."""
    tracer = Tracer(capacity or 4096)
    TRACERS.append(tracer)
    _CAPACITY[0] = max(t.capacity for t in TRACERS)
    enable(log_every=log_every)
    return tracer


def release(tracer: Tracer | None = None) -> None:
    """Drops a view; the last one to go turns tracing off (what it recorded stays readable)."""
    if tracer is not None and tracer in TRACERS:
        TRACERS.remove(tracer)
    if not TRACERS:
        disable()


def enable(capacity: int | None = None, log_every: int = 0) -> Tracer:
    """Turn tracing on for this process and the DataLoader workers it starts from now on; returns
    a view (the first live one, or a new one)."""
    global _enabled
    if not TRACERS or capacity is not None:
        tracer = Tracer(capacity or 4096)
        TRACERS.append(tracer)
    _LOG_EVERY[0] = log_every
    _install(_WORKER_PATCHES + _MAIN_PATCHES)
    _enabled = True
    return TRACERS[0] if capacity is None else TRACERS[-1]


def disable() -> None:
    """Unwrap torch's classes again; the trace collected so far stays readable."""
    global _enabled
    for (cls, name), fn in list(_originals.items()):
        setattr(cls, name, fn)
        del _originals[(cls, name)]
    TRACERS.clear()
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
