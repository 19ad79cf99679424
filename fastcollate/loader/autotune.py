"""``fastcollate.DataLoader(num_workers="auto")``: the loader's side of the auto mode -- the cheap,
always-on measurements of each epoch and the changes made between epochs. The decision itself is
fastcollate.tuning.decide's (pure, on measurements in hand).

What is measured, and what it costs:

- in the consuming thread (torch's iterator's ``_next_data``, timed in place: ``iter(loader)``
  stays torch's own iterator): every batch's time inside ``next()`` (waiting for it) and so the
  time between batches (the loop's own step) -- two reads of a clock that needs no system call;
  on a sample of the batches (every one when batches take more than ~0.5 ms, fewer as they get
  quicker, so that this stays under 1%) the thread's CPU and the batch's samples. With no
  workers each ``next()`` is the fetch: the same call counts the slow batches and, on the
  sampled ones, times the collate apart and the time the fetch blocked of its own accord (I/O,
  sleeps; told from preemption by voluntary against involuntary context switches).
- in each worker: every batch's wall time and the slow batches; on a sample, the collate apart,
  the fetching thread's CPU and blocking, the worker's process CPU; its private memory a second
  after its first batch and every 5 s (reading it takes ~2 ms). A worker adds them to its own
  row of a small shared float64 table (no lock, no message); the main process reads the rows
  once an epoch. Workers install this timing from their ``worker_init_fn`` (the user's runs
  after it; ``loader.worker_init_fn`` stays the user's), in their own process only.
- once an epoch: the kernel's busy time (/proc/stat) less this loop's own CPU, which is what
  other processes kept busy (while there is something left to decide).

Changes happen only at an epoch boundary (``__iter__``): ``num_workers`` and ``prefetch_factor``
are set on the loader, the ring is remade for the new number of slots, and persistent workers
are restarted (a new pool of the new size; torch's pool cannot grow or shrink in place). A
restarted persistent pool draws its base seed from a private generator seeded from the first
pool's, so the main process's random stream -- which a shuffling sampler draws its epoch's order
from -- sees exactly what a fixed loader's does.
"""
from __future__ import annotations

import logging
import os
import time
import warnings
import weakref
from typing import Any, Callable

import numpy as np
import torch
from torch.utils.data import IterableDataset
from torch.utils.data._utils import fetch as _tfetch

from ..core import trace as _trace
from . import follow
from ..tuning import load, node, spikes
from ..tuning import decide as plan
from ..tuning.measure import batch_len
from ..tuning.memory import private_mb

logger = logging.getLogger("fastcollate")
AUTO = "auto"
# a row of counters: one per worker (and one in the main process with no workers), each a double.
# Every batch: BATCHES counts it, WALL sums its wall time (the row's first batch, cold -- imports,
# first calls, page faults -- goes to FIRST_WALL instead, WALLED counts the others) and adds it to
# the histogram at HIST (the rare slow batches are told apart from it: fastcollate.tuning.spikes).
# A sample of them (TIMED; TIMED_WALL their wall time):
# COLLATE, CPU (the fetching thread's) and BLOCKED (the time it blocked of its own accord) --
# scaled to the others by wall time. PROC_NOW, PROC_FIRST: the worker's process CPU at its latest
# timed batch and before its first; MB: its private memory, the largest read.
(BATCHES, WALLED, WALL, FIRST_WALL, TIMED, TIMED_WALL, COLLATE, CPU, BLOCKED, PROC_NOW, PROC_FIRST, MB,
 HIST) = range(13)
COLUMNS = -(-(HIST + spikes.COLUMNS) // 8) * 8  # whole 64-byte lines: two workers never write the same one
# what timing one batch in full costs (measured on 2 cores, in the loader: batches of 2 cheap samples
# with no workers, every one timed in full, took 8 us more each than untimed -- the CPU clocks and
# getrusage are system calls); batches are timed in full one in as many as keep that under 1% of them
FETCH_TIMING_S = 8e-6
CONSUMER_TIMING_S = 2e-6
MAX_SKIP = 63
BUDGET_EVERY_S = 30.0  # the rank's share is read again after this long
MEMORY_FIRST_S = 1.0   # a worker reads its private memory (/proc/self/smaps_rollup: ~2 ms) a second
MEMORY_EVERY_S = 5.0   # after its first batch, then every 5 s
now = time.perf_counter
thread_cpu = time.thread_time


# ---- resolving the arguments ------------------------------------------------------------------

def check_value(name: str, value: Any) -> None:
    if isinstance(value, str) and value != AUTO:
        raise ValueError(f"fastcollate.DataLoader: {name} must be an int or \"auto\", got {value!r}")


def _timed(collate_fn: Any, marks: list[float]) -> Any:
    """``collate_fn`` that writes its start and end into ``marks`` (the fetch's collate apart)."""
    def timed_collate(data: Any) -> Any:
        marks[0] = now()
        try:
            return collate_fn(data)
        finally:
            marks[1] = now()
    return timed_collate


def resolve(arguments: dict[str, Any]) -> "AutoTuner | None":
    """torch's DataLoader arguments (bound, defaults applied) with ``num_workers`` and
    ``prefetch_factor`` possibly "auto": replaced there by where the climb starts; returns the
    tuner (None when nothing is "auto", or nothing can be tuned)."""
    nw, pf = arguments.get("num_workers", 0), arguments.get("prefetch_factor")
    check_value("num_workers", nw)
    check_value("prefetch_factor", pf)
    tune_w = nw == AUTO
    tune_pf = pf == AUTO or (tune_w and pf is None)
    if not (tune_w or tune_pf):
        return None
    if tune_w and isinstance(arguments.get("dataset"), IterableDataset):
        raise ValueError("fastcollate.DataLoader: num_workers=\"auto\" is refused for an IterableDataset: each worker "
                         "iterates its own copy of the stream, so another number of workers splits it differently and "
                         "changes the batches. Pass num_workers=N; prefetch_factor=\"auto\" still tunes the prefetching, "
                         "which changes no batch")
    if not tune_w and not nw:
        arguments["prefetch_factor"] = None
        logger.info("fastcollate auto: prefetch_factor=\"auto\" with num_workers=0: no worker prefetches, nothing to "
                    "tune")
        return None
    limits = plan.Limits(workers=tune_w, prefetch=tune_pf,
                         min_workers=1 if arguments.get("worker_init_fn") is not None else 0,
                         persistent=bool(arguments.get("persistent_workers")),
                         prefetch_value=pf if isinstance(pf, int) else 2)
    share = node.share()
    start = plan.start_choice(share.cores, limits, workers=None if tune_w else int(nw),
                              prefetch=None if tune_pf else limits.prefetch_value)
    arguments["prefetch_factor"] = start.prefetch_factor
    why = (f"nothing measured yet: min(2, this rank's {plan.cores_in_words(share.cores)})" if tune_w else
           f"num_workers {start.workers} is yours")
    if limits.min_workers and tune_w:
        why += "; never 0 workers: your worker_init_fn prepares each worker"
    tuned = " and ".join(n for n, on in (("num_workers", tune_w), ("prefetch_factor", tune_pf)) if on)
    tuner = AutoTuner(limits, start, f"{why}; {tuned} tuned at epoch boundaries within {plan.Budget.of(share).words}")
    # an int that carries the tuner: a loader re-created from this one's attributes goes on tuning
    arguments["num_workers"] = follow.AutoWorkers(start.workers, tuner)
    follow.install()
    return tuner


# ---- measuring --------------------------------------------------------------------------------

class EpochClock:
    """The consumer's side of one epoch (filled by timed_next). Every batch: its wait (two
    wall-clock reads); a sample of them (every one when batches are slow): the thread's CPU in
    ``next()`` and the batch's samples. With no workers (``fetcher``: the epoch's dataset fetcher)
    each ``next()`` is the fetch itself, so the same call also counts the slow batches, and on the
    sampled ones times the collate apart and the time the fetch blocked of its own accord."""

    __slots__ = ("t0", "proc0", "busy0", "batches", "samples", "wait", "cpu", "cpu_n", "size", "first", "end",
                 "proc_end", "busy_end", "whole", "batch_bytes", "countdown", "full_t", "full_n", "started",
                 "choice", "first_wait", "fetcher", "timed_wait", "collate", "blocked", "hist")

    def __init__(self, choice: plan.Choice, machine: bool = True) -> None:
        self.choice = choice
        # the machine's busy time (what other processes take): only while there is something to decide
        self.t0, self.proc0, self.busy0 = now(), time.process_time(), load.busy_seconds() if machine else None
        self.batches = self.samples = self.batch_bytes = self.cpu_n = self.size = self.countdown = self.full_n = 0
        self.hist = [0.0] * spikes.COLUMNS  # of the batches after the first, with no workers
        self.wait = self.cpu = self.first = self.first_wait = self.end = self.proc_end = self.full_t = 0.0
        self.timed_wait = self.collate = self.blocked = 0.0
        self.busy_end: float | None = None
        self.whole = self.started = False
        self.fetcher: Any = None

    @property
    def step(self) -> float:
        """The time between batches: from the first ``next()`` on, what was not spent in one."""
        return max(0.0, self.end - (self.t0 + self.first - self.first_wait) - self.wait) if self.batches else 0.0


def timed_next(tuner: "AutoTuner", it: Any) -> Callable[[], Any]:
    """torch's iterator ``it``'s ``_next_data`` (what its ``__next__`` calls for each batch), timed
    into the tuner's clock of the epoch: installed on the iterator itself (an instance attribute), so
    that ``iter(loader)`` is torch's own iterator, nothing around it. It holds the iterator weakly:
    a reference back to it would keep it (and its workers) alive until a garbage collection, and a
    worker forked meanwhile would inherit it."""
    next_data, ref = type(it)._next_data, weakref.ref(it)
    inv_floor, last = spikes.INV_FLOOR, spikes.LAST

    def _next_data() -> Any:
        c = tuner._clock
        if c is None:
            return next_data(ref())
        if c.countdown <= 0:
            return _timed_in_full(c)
        # the batches between two timed in full: as few operations as can be, they are the whole
        # cost of measuring on tiny batches (2 cheap samples take ~17 us with no workers on 2 cores)
        c.countdown -= 1
        t0 = now()
        try:
            batch = next_data(ref())
        except StopIteration:
            _ended(c, t0)
            raise
        t1 = now()
        w = t1 - t0
        if c.fetcher is not None:  # spikes.add, inline (never the epoch's first batch: that one is timed in full)
            k = min(2 * int(w * inv_floor).bit_length(), last)
            hist = c.hist
            hist[k] += 1
            hist[k + 1] += w
        c.wait += w
        c.batches += 1
        c.end = t1
        c.samples += c.size
        return batch

    def _timed_in_full(c: EpochClock) -> Any:
        cpu0 = thread_cpu()
        fetcher = c.fetcher
        if fetcher is not None:  # no workers: the fetch runs in this call; its collate timed apart
            sw0, marks, collate_fn = _trace.voluntary_switches(), [0.0, 0.0], fetcher.collate_fn
            fetcher.collate_fn = _timed(collate_fn, marks)
        t0 = now()
        try:
            batch = next_data(ref())
        except StopIteration:
            _ended(c, t0)
            raise
        finally:
            if fetcher is not None:
                fetcher.collate_fn = collate_fn
        t1 = now()
        w = t1 - t0
        n = c.batches
        if fetcher is not None and n:
            spikes.add(c.hist, 0, w)
        c.wait += w
        c.batches = n + 1
        c.end = t1
        cpu = thread_cpu() - cpu0
        c.cpu += cpu
        c.cpu_n += 1
        if fetcher is not None:
            c.timed_wait += w
            c.collate += marks[1] - marks[0] if marks[1] else 0.0
            c.blocked += _trace.blocked_time(max(0.0, w - cpu), sw0, _trace.voluntary_switches())
        c.size = batch_len(batch)  # the batches between two timed ones count as the same size
        if n == 0:
            c.first, c.first_wait = t1 - c.t0, w
            c.batch_bytes = tensor_bytes(batch)
        # the next timed batch: soon enough to follow the epoch, rarely enough that the CPU clock
        # reads (system calls) stay under 1% of a batch
        per = (t1 - c.full_t) / max(1, n + 1 - c.full_n) if c.full_n else w
        cost = FETCH_TIMING_S if fetcher is not None else CONSUMER_TIMING_S
        c.countdown = min(MAX_SKIP, int(cost / max(per, 1e-9) / 0.01))
        c.full_t, c.full_n = t1, n + 1
        c.samples += c.size
        return batch

    _next_data.fastcollate_auto = True  # type: ignore[attr-defined]
    return _next_data


def _ended(c: EpochClock, t0: float) -> None:
    """The call that ended the epoch (StopIteration; workers joined): the loader's, not a step."""
    c.end, c.proc_end, c.whole = now(), time.process_time(), True
    c.busy_end = load.busy_seconds() if c.busy0 is not None else None
    c.wait += c.end - t0


def tensor_bytes(x: Any) -> int:
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, dict):
        return sum(tensor_bytes(v) for v in x.values())
    if isinstance(x, (list, tuple)):
        return sum(tensor_bytes(v) for v in x)
    return 0


def row_view(table: np.ndarray, k: int) -> memoryview:
    """Row ``k`` of a counters table as a memoryview of doubles: a scalar read or write is a few
    tens of nanoseconds (a numpy scalar's, a few hundred)."""
    return memoryview(table).cast("B").cast("d")[k * COLUMNS:(k + 1) * COLUMNS]


class FetchTimer:
    """In a worker: times torch's dataset fetcher's ``fetch`` into ``row``: every batch's wall time (two reads of
    a clock that costs no system call); a sample of them (every one when batches take long) also
    the collate apart, the thread's CPU and the time it blocked of its own accord, the process's
    CPU -- system calls of ~0.5 us each, sampled so that they stay under 1% of a batch.
    ``memory``: in a worker, its private memory now and then (reading it takes milliseconds)."""

    __slots__ = ("row", "memory", "countdown", "memory_at")

    def __init__(self, row: Any, memory: bool) -> None:
        self.row, self.memory, self.countdown, self.memory_at = row, memory, 0, 0.0

    def __call__(self, fetch: Callable[[Any, Any], Any], fetcher: Any, index: Any) -> Any:
        """``fetch(fetcher, index)``, timed."""
        row = self.row
        if self.countdown > 0 and row[BATCHES]:
            self.countdown -= 1
            t0 = now()
            out = fetch(fetcher, index)
            self.add(row, now() - t0)
            return out
        t0, cpu0, sw0 = now(), thread_cpu(), _trace.voluntary_switches()
        memory = self.memory
        if memory and not row[PROC_FIRST]:
            row[PROC_FIRST] = time.process_time()
            self.memory_at = t0 + MEMORY_FIRST_S
        marks = [0.0, 0.0]
        collate_fn = fetcher.collate_fn
        fetcher.collate_fn = _timed(collate_fn, marks)
        try:
            out = fetch(fetcher, index)
        finally:
            fetcher.collate_fn = collate_fn
        t1, cpu1, sw1 = now(), thread_cpu(), _trace.voluntary_switches()
        wall, cpu = t1 - t0, cpu1 - cpu0
        row[TIMED] += 1
        row[TIMED_WALL] += wall
        row[COLLATE] += marks[1] - marks[0] if marks[1] else 0.0
        row[CPU] += cpu
        row[BLOCKED] += _trace.blocked_time(max(0.0, wall - cpu), sw0, sw1)
        self.add(row, wall)
        self.countdown = min(MAX_SKIP, int(FETCH_TIMING_S / max(wall, 1e-9) / 0.01))
        if memory:
            row[PROC_NOW] = time.process_time()
            if t1 >= self.memory_at:
                self.memory_at = t1 + MEMORY_EVERY_S
                mb = private_mb(os.getpid())
                if mb is not None and mb > row[MB]:
                    row[MB] = mb
        return out

    @staticmethod
    def add(row: Any, wall: float) -> None:
        if not row[BATCHES]:
            row[FIRST_WALL] = wall
        else:
            k = HIST + min(2 * int(wall * spikes.INV_FLOOR).bit_length(), spikes.LAST)  # spikes.add, inline
            row[k] += 1
            row[k + 1] += wall
            row[WALL] += wall
            row[WALLED] += 1
        row[BATCHES] += 1


_TIMER: list[Any] = [None]  # in a worker of an auto loader: the FetchTimer of its row
_DEPTH = [0]


def _worker_fetch(orig: Any) -> Any:
    def fetch(self: Any, possibly_batched_index: Any) -> Any:
        timer = _TIMER[0]
        if timer is None or _DEPTH[0]:  # a fetch inside a fetch (a loader the dataset iterates): not ours
            return orig(self, possibly_batched_index)
        _DEPTH[0] = 1
        try:
            return timer(orig, self, possibly_batched_index)
        finally:
            _DEPTH[0] = 0
    fetch.fastcollate_auto = True  # type: ignore[attr-defined]
    return fetch


def install_worker_timing(row: Any) -> None:
    """In a worker process: its fetches are timed into ``row`` (torch's fetcher classes, in this
    process only)."""
    _TIMER[0] = FetchTimer(row, True)
    for cls in (_tfetch._MapDatasetFetcher, _tfetch._IterableDatasetFetcher):
        if not getattr(cls.__dict__["fetch"], "fastcollate_auto", False):
            cls.fetch = _worker_fetch(cls.__dict__["fetch"])


class WorkerInit:
    """The ``worker_init_fn`` an auto loader's workers start with (only while they are started:
    ``loader.worker_init_fn`` stays yours): the timing, then ``inner``."""

    def __init__(self, inner: Any, table: torch.Tensor) -> None:
        self.inner, self.table = inner, table

    def __call__(self, worker_id: int) -> None:
        install_worker_timing(row_view(self.table.numpy(), worker_id))
        if self.inner is not None:
            self.inner(worker_id)


# ---- the tuner ----------------------------------------------------------------------------------

class AutoTuner:
    """Held by an auto loader: measures each epoch, asks ``decide`` (fastcollate.tuning.decide.decide;
    tests give their own) for the next epoch's setting at each ``__iter__``, logs every decision
    (``log``: the records) and has the loader apply it."""

    def __init__(self, limits: plan.Limits, start: plan.Choice, why: str) -> None:
        self.state = plan.State(current=start, limits=limits)
        self.log: list[plan.Record] = []
        self.decide: Callable[[plan.State, plan.EpochMeasure, plan.Budget], plan.Record | None] = plan.decide
        self.share: Callable[[], Any] = node.share
        self.frozen = False  # measure only, never change (the overhead benchmark)
        self._why = why
        self._epoch = 0
        self._budget: tuple[float, plan.Budget] | None = None
        self.last: plan.EpochMeasure | None = None  # the latest epoch measured
        self._loader: weakref.ref | None = None  # the loader measured: the auto one, or a copy of it
        self._reset()

    def _reset(self) -> None:
        self._clock: EpochClock | None = None
        self._table: torch.Tensor | None = None  # the pool's shared counters (workers)
        self._rows: np.ndarray | None = None
        self._snap: np.ndarray | None = None
        self._iterators = 0
        self._seed: int | None = None

    def __getstate__(self) -> dict[str, Any]:
        out = dict(self.__dict__)  # a pickled loader's tuner: the climb and its log, no live counters
        for k in ("_clock", "_table", "_rows", "_snap", "_budget", "_loader"):
            out[k] = None
        out["decide"] = plan.decide if self.decide is plan.decide else self.decide
        return out

    def budget(self) -> plan.Budget:
        """This rank's share of the node, read again at most every BUDGET_EVERY_S seconds (reading
        it -- the affinity, /proc/meminfo, the cgroup's limit -- takes a few hundred microseconds,
        a visible share of a short epoch)."""
        t = now()
        if self._budget is None or t - self._budget[0] > BUDGET_EVERY_S:
            self._budget = (t, plan.Budget.of(self.share()))
        return self._budget[1]

    def say(self, record: plan.Record) -> None:
        self.log.append(record)
        logger.info("%s", record)

    # -- the epoch boundary
    def begin_epoch(self, loader: Any) -> None:
        if not self.log:
            self.say(plan.Record(-1, "start", self.state.current, self.state.current, self._why))
        if self._loader is None or self._loader() is not loader:
            if self._loader is not None:  # a copy of the loader iterates now: its pool, its counters
                logger.info("fastcollate auto: now measuring %s, a loader made from the auto loader's attributes "
                            "(the epoch in flight is not judged)", type(loader).__qualname__)
                self._reset()
            self._loader = weakref.ref(loader)
        m = self.finish(loader)
        self.last = m if m is not None else self.last
        # a settled loader decides nothing more: its epochs are measured (``last``), not logged
        if m is not None and not self.frozen and not (self.state.settled and self.state.pending is None):
            if self.state.limits.batches_per_epoch is None:
                try:
                    self.state.limits.batches_per_epoch = len(loader)
                except TypeError:
                    pass
            record = self.decide(self.state, m, self.budget())
            if record is not None:
                self.say(record)
        target = self.state.current
        if target != plan.Choice(loader.num_workers, loader.prefetch_factor or 0):
            loader._auto_apply(target)
        self._clock = EpochClock(target, machine=not (self.frozen or self.state.settled))
        if self._rows is not None and target.workers and loader.__dict__.get("_iterator") is not None:
            self._snap = self._rows.copy()  # persistent workers go on: this epoch is what they add
        # (with no workers the main process's FetchTimer is made with the epoch's iterator)

    def finish(self, loader: Any) -> plan.EpochMeasure | None:
        """The epoch in flight, measured (None if it delivered nothing)."""
        c, self._clock = self._clock, None
        if c is None or c.batches == 0:
            return None
        end, proc_end, busy_end, step = c.end, c.proc_end, c.busy_end, c.step
        if not c.whole:  # left before its end: up to its last batch and a step like the others
            step = step * c.batches / max(1, c.batches - 1)
            end = c.end + step / c.batches
            scale = (end - c.t0) / max(1e-9, now() - c.t0)
            proc_end = c.proc0 + (time.process_time() - c.proc0) * scale
            busy_now = load.busy_seconds() if c.busy0 is not None else None
            busy_end = None if busy_now is None or c.busy0 is None else c.busy0 + (busy_now - c.busy0) * scale
        main_cpu = c.cpu * c.batches / max(1, c.cpu_n)  # the timed batches stand for the others
        m = plan.EpochMeasure(epoch=self._epoch, choice=c.choice, batches=c.batches, samples=c.samples,
                              wall_s=end - c.t0, wait_s=c.wait, step_s=step, main_cpu_s=main_cpu,
                              process_cpu_s=max(0.0, proc_end - c.proc0), first_s=c.first,
                              started=c.started, whole=c.whole, batch_bytes=c.batch_bytes)
        self._epoch += 1
        if self._rows is not None:
            rows = self._rows.copy()
            snap = self._snap if self._snap is not None else np.zeros_like(rows)
            d = rows - snap
            base = np.where(snap[:, PROC_NOW] > 0, snap[:, PROC_NOW], rows[:, PROC_FIRST])
            # each batch's wall time (the first of a new row is its start-up: left out, and the
            # batches it stands for counted at the others' mean); the sampled ones split it
            wall = d[:, WALL] * d[:, BATCHES] / np.maximum(d[:, WALLED], 1)
            share = wall / np.maximum(d[:, TIMED_WALL], 1e-12)
            collate = d[:, COLLATE] * share
            m.worker_batches = int(d[:, BATCHES].sum())
            m.collate_s = float(collate.sum())
            m.fetch_s = float((wall - collate).sum())
            m.fetch_cpu_s, m.fetch_blocked_s = float((d[:, CPU] * share).sum()), float((d[:, BLOCKED] * share).sum())
            m.worker_cpu_s = float(np.clip(rows[:, PROC_NOW] - base, 0, None)[d[:, BATCHES] > 0].sum())
            m.worker_mb = float(rows[:, MB].max()) if len(rows) else 0.0
            m.spikes, m.spike_s = spikes.spikes(d[:, HIST:HIST + spikes.COLUMNS].sum(axis=0))
            if self._snap is None and len(rows):
                m.first_make_s = float(rows[0, FIRST_WALL])  # batch 0 is worker 0's first
        elif c.fetcher is not None:
            # no workers: each next() was the fetch (with the sampler); the sampled ones split it
            share = c.wait / max(c.timed_wait, 1e-12)
            m.worker_batches = c.batches
            m.collate_s = c.collate * share
            m.fetch_s = max(0.0, c.wait - m.collate_s)
            m.fetch_cpu_s = m.worker_cpu_s = main_cpu
            m.fetch_blocked_s = m.main_blocked_s = c.blocked * share
            m.spikes, m.spike_s = spikes.spikes(c.hist)
        if busy_end is not None and c.busy0 is not None and m.wall_s > 0:
            # what other processes kept busy meanwhile: the machine's busy time less this loop's own
            # -- its workers' whole CPU, their start-up included (a new process's clock starts at 0)
            workers = 0.0
            if c.choice.workers and self._rows is not None:
                rows = self._rows
                base = self._snap[:, PROC_NOW] if self._snap is not None else np.zeros(len(rows))
                workers = float(np.clip(rows[:, PROC_NOW] - base, 0, None).sum())
            m.others_busy = max(0.0, (busy_end - c.busy0 - m.process_cpu_s - workers) / m.wall_s)
        return m

    @property
    def clock(self) -> EpochClock | None:
        return self._clock

    def make_iterator(self, loader: Any, make: Callable[[], Any]) -> Any:
        """torch's ``_get_iterator``, with the workers' timing and, for persistent workers after
        the first pool, the base seed from a private generator (see the module's docstring)."""
        workers = loader.num_workers
        self._iterators += 1
        # the user's persistent_workers (the attribute reads False while no workers run: follow.apply_choice)
        private = self.state.limits.persistent and self._iterators > 1 and self._seed is not None
        generator, init = loader.generator, loader.worker_init_fn
        table = None
        if private:
            loader.generator = torch.Generator().manual_seed((self._seed + self._iterators) % (1 << 63))
        if workers:
            table = torch.zeros((workers, COLUMNS), dtype=torch.float64).share_memory_()
            loader.worker_init_fn = WorkerInit(init, table)
        try:
            if workers and self.state.limits.workers:
                with warnings.catch_warnings():  # beyond the cores only where the fetches wait: the log says why
                    warnings.filterwarnings("ignore", message="This DataLoader will create", category=UserWarning)
                    it = make()
            else:
                it = make()
        finally:
            loader.worker_init_fn = init
            if private:
                loader.generator = generator
        if self._seed is None:
            self._seed = int(getattr(it, "_base_seed", 0))
        if hasattr(it, "_next_data"):
            it._next_data = timed_next(self, it)
        if self._clock is not None:
            self._clock.started = bool(workers)
        if table is not None:
            self._table, self._rows = table, table.numpy()
        else:  # no workers: the consumer's clock times the fetch (timed_next), nothing else is wrapped
            self._table = self._rows = None
            if self._clock is not None:
                self._clock.fetcher = getattr(it, "_dataset_fetcher", None)
        self._snap = None
        return it


__all__ = ["AUTO", "AutoTuner", "EpochClock", "FetchTimer", "timed_next", "WorkerInit", "resolve", "check_value",
           "install_worker_timing"]
