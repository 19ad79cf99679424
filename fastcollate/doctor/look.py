"""The doctor's looking: a traced run of a loader, whole epochs (or a short probe), turned into
what the model needs -- each batch's time in its worker, every station's CPU per batch, the
workers' start-up and memory -- plus the checks a cache needs (is the dataset deterministic,
how big are its samples) and the ceiling (the step with data free)."""
from __future__ import annotations

import dataclasses
import gc
import itertools
import statistics
import time
from typing import Any, Callable

import numpy as np
import torch

from ..core import trace as _trace
from ..tuning import model
from ..tuning.measure import batch_len
from ..tuning.memory import WorkerMemory, cpu_seconds, worker_pids
from ..training.monitor import StallMonitor, batch_info


@dataclasses.dataclass
class Look:
    profile: model.Profile
    spikes_s: list[float]       # each batch's time beyond the typical batch's (its rare slow samples)
    step_s: float               # the user's step, wall seconds per batch
    samples_per_s: float        # of the traced run (tracing included: not a measurement to compare)
    batch_bytes: int            # tensor bytes of a batch
    memory: dict[str, Any]      # WorkerMemory.report()
    report: dict[str, Any]      # the StallMonitor report of the run
    batch: Any = None           # a copy of one batch (the ceiling replays it)
    batches: int = 0
    wall_s: float = 0.0
    worker_busy: float = 0.0    # mean fraction of the run the workers spent on CPU
    main_busy: float = 0.0
    samples: int = 0            # samples delivered in the look
    waiting: float = 0.0        # the share of a sample's fetch spent waiting, not computing (I/O)
    epoch_batches: int | None = None  # batches of a whole epoch, as the loader delivered them (None: cut short)
    whole: bool = True          # every epoch ran to its end (a budget may cut the look short)


def _clone(batch: Any) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.clone()
    if isinstance(batch, dict):
        return {k: _clone(v) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)) and not hasattr(batch, "_fields"):
        return type(batch)(_clone(v) for v in batch) if isinstance(batch, tuple) else [_clone(v) for v in batch]
    return batch


def _tensor_bytes(x: Any) -> int:
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, np.ndarray):
        return int(x.nbytes)
    if isinstance(x, dict):
        return sum(_tensor_bytes(v) for v in x.values())
    if isinstance(x, (list, tuple)):
        return sum(_tensor_bytes(v) for v in x)
    return 0


def look(make_loader: Callable[[], Any], epochs: int, step: Callable[[Any], Any] | None, workers: int,
         max_batches: int | None = None, kind: str = "torch", trace: str | None = None,
         plot: str | None = None, deadline: float | None = None) -> Look:
    """``epochs`` epochs of a new loader (at most ``max_batches`` batches in all, and none begun
    after ``deadline`` -- a time.perf_counter() -- once a few have run), traced, with ``step``; what
    each station spent per batch. ``trace`` / ``plot``: paths for the run's Chrome trace and
    picture."""
    mon = StallMonitor(trace=True)
    mem = WorkerMemory()
    worker_cpu0: dict[int, float] = {}  # each worker's CPU clock at its first batch (start-up is not per batch)
    worker_cpu: dict[int, float] = {}
    main_cpu = 0.0  # from each epoch's first batch on: loader creation and worker start-up are not per batch
    counted = 0     # the batches that main_cpu covers
    ours = [0.0]    # CPU the looking itself spends in the main process (reading /proc): not the loop's

    def sample_memory(pids: list[int]) -> None:
        c = time.process_time()
        mem.sample(pids)
        ours[0] += time.process_time() - c

    def read_cpu(pids: list[int], into: dict[int, float], first: bool = False) -> None:
        c = time.process_time()
        for pid in pids:
            v = cpu_seconds(pid)
            if v is not None:
                if first:
                    into.setdefault(pid, v)
                else:
                    into[pid] = v  # CPU clocks only grow: keep each worker's latest
        ours[0] += time.process_time() - c
    step_times: list[float] = []
    step_cpu = 0.0
    batches = samples = 0
    # as measure.run_epochs does before each measured run: a full collection now, so that one
    # that was already due in a large process (and in the workers it forks) does not land in the
    # traced run and read as the dataset's slow samples
    gc.collect()
    copy = None
    first_latency: list[float] = []
    epoch_batches: int | None = None
    whole = True
    try:
        t0 = time.perf_counter()
        loader = make_loader()
        per_epoch = len(loader) if hasattr(loader, "__len__") else None
        mon.start()
        stop = False
        for epoch in range(epochs):
            e0 = time.perf_counter()
            it = iter(loader)
            pids = worker_pids(it)
            sample_memory(pids)  # just started: what a worker holds before it has read the dataset
            i = 0
            while True:
                w0 = time.perf_counter()
                try:
                    batch = next(it)
                except StopIteration:
                    break
                waited = time.perf_counter() - w0
                mon.record_wait(waited, _trace.last_id())
                if i == 0:
                    first_latency.append(time.perf_counter() - e0)
                    pids = worker_pids(it)
                    sample_memory(pids)
                    read_cpu(pids, worker_cpu0, first=True)
                    epoch_cpu0, ours_at0 = time.process_time(), ours[0]
                else:
                    counted += 1
                s0, c0 = time.perf_counter(), time.thread_time()
                if step is not None:
                    step(batch)
                step_cpu += time.thread_time() - c0
                step_times.append(time.perf_counter() - s0)
                mon.record_compute(step_times[-1])
                if copy is None:
                    copy = _clone(batch)
                    mon._batch_info = batch_info(batch)
                samples += batch_len(batch)
                batches += 1
                i += 1
                last = per_epoch is not None and i == per_epoch
                stop = (max_batches is not None and batches >= max_batches) or (
                    deadline is not None and batches >= 4 and time.perf_counter() > deadline)
                if pids and (last or i % 16 == 0 or stop):
                    read_cpu(pids, worker_cpu)
                    if last:
                        sample_memory(pids)
                del batch
                if stop:
                    whole = per_epoch is not None and i == per_epoch and epoch == epochs - 1
                    break
            if not stop and epoch_batches is None:
                epoch_batches = i  # the epoch ran to its end: what the loader really delivers
            if i:
                main_cpu += time.process_time() - epoch_cpu0 - (ours[0] - ours_at0)
            if pids:
                sample_memory(pids)
            del it
            if stop:
                break
        mon.stop()
        wall = time.perf_counter() - t0
        del loader
        report = mon.report()
        records = [r for r in mon.tracer.records.values() if "fetch" in r.spans and "collate" in r.spans]
        if trace:
            mon.save_trace(trace)
        if plot:
            mon.plot(plot, title="your settings")
    finally:
        mon.close()
    fetch = [r.spans["fetch"][1] - r.spans["fetch"][0] for r in records]
    make = [f + (r.spans["collate"][1] - r.spans["collate"][0]) for f, r in zip(fetch, records)]
    batches = max(1, batches)
    counted = max(1, counted)
    total_worker_cpu = sum(worker_cpu[p] - worker_cpu0.get(p, worker_cpu[p]) for p in worker_cpu)
    mean_make = statistics.fmean(make) if make else 0.0
    step_per = step_cpu / batches
    if workers:
        worker_cpu_s = total_worker_cpu / counted
        main_cpu_s = max(0.0, main_cpu / counted - step_per)
    else:
        # everything ran on the main thread: the loop's own cost is what fetch + collate leave
        worker_cpu_s = mean_make
        main_cpu_s = max(0.0, main_cpu / counted - step_per - mean_make)
    worker_busy = total_worker_cpu / wall if wall > 0 else 0.0
    main_busy = main_cpu / wall if wall > 0 else 0.0
    cores = max(1, _cores())
    contention = max(1.0, (worker_busy + main_busy) / cores) if workers else 1.0
    start = max(0.0, (statistics.median(first_latency) if first_latency else 0.0) - mean_make) if workers else 0.0
    profile = model.Profile(kind=kind, workers=workers, make_s=make or [0.0], fetch_s=fetch or [0.0],
                            worker_cpu_s=worker_cpu_s, main_cpu_s=main_cpu_s, start_s=start,
                            start_workers=max(1, workers), contention=contention)
    spikes = _spikes(records, make, contention)
    # the median: a busy machine preempts the loop now and then, and a mean would charge the step
    step_s = statistics.median(step_times) if step is not None and step_times else 0.0
    return Look(profile=profile, spikes_s=spikes, step_s=step_s, samples_per_s=samples / wall if wall > 0 else 0.0,
                batch_bytes=_tensor_bytes(copy), memory=mem.report(), report=report, batch=copy, batches=batches,
                wall_s=wall, worker_busy=worker_busy / max(1, workers) if workers else 0.0, main_busy=main_busy,
                waiting=_waiting(records), epoch_batches=epoch_batches, whole=whole, samples=samples)


def _waiting(records: list) -> float:
    """The share of the fetches' time spent blocked of their own accord (I/O, sleeps) rather than
    on a CPU, from the trace's per-fetch clocks; 0 where the trace has none. Time the scheduler
    took from a fetch (a busy machine) is neither: it is not counted."""
    cpu = sum(r.fetch_cpu_s or 0.0 for r in records)
    blocked = sum(r.fetch_blocked_s or 0.0 for r in records)
    return blocked / (cpu + blocked) if cpu + blocked > 0 else 0.0


def _spikes(records: list, make: list[float], contention: float) -> list[float]:
    """Each batch's fetch beyond the typical batch's: its rare slow samples (a remote read, a
    sleep, an expensive sample), which more prefetching can hide and more CPU cannot shorten.

    The dataset's part only: the collate's cost is each loader kind's own, measured by its probe.
    A fetch as it would run alone is its CPU time plus the time it blocked on its own; what the
    scheduler of a busy machine took from it (preemption) is the machine's, and counting it would
    charge every candidate with the traced run's contention -- on 2 cores with 2 workers,
    preemption alone made tiny batches look 2-4x slower than they are. Of a worker's first batch
    of an epoch only the blocking counts: its extra CPU is start-up (imports, first calls), which
    the model counts apart."""
    alone, cold, firsts = [], [], set()
    for r in records:
        cold.append((r.epoch, r.pid) not in firsts)
        firsts.add((r.epoch, r.pid))
        if r.fetch_cpu_s is None:
            break
        alone.append(r.fetch_cpu_s + (r.fetch_blocked_s or 0.0))
    if records and len(alone) == len(records) and not all(cold):
        typical = statistics.median(a for a, c in zip(alone, cold) if not c)
        floor = _spike_floor(typical)
        out = []
        for a, c, r in zip(alone, cold, records):
            excess = (r.fetch_blocked_s or 0.0) if c else a - typical
            out.append(excess if excess > floor else 0.0)
        return out
    # a trace without CPU clocks: the wall times, scaled down by the run's contention
    typical = statistics.median(make) if make else 0.0
    return [max(0.0, (m - typical) / contention) for m in make] or [0.0]


def _spike_floor(typical: float) -> float:
    """How far beyond the typical batch a batch must be to count as slow: a rare slow sample is
    a read or a computation many times a typical one; below this, a batch's excess is the
    machine's noise (a GIL hand-off to the worker's queue thread, a cache miss, a page fault),
    which the per-batch level already averages. Measured on 2 cores: cheap fetches of ~100 us
    showed such excesses of up to ~0.5 ms, which -- counted as slow samples over a short epoch
    -- made the predictions of 0-worker loading 1.5-2x too slow."""
    return max(typical, 1e-3)


def _level(times: list[float]) -> float:
    """The per-batch level of a run: the mean of its batches that are not slow (see
    _spike_floor), so that the slow ones, which the model adds batch by batch, count once."""
    if not times:
        return 0.0
    typical = statistics.median(times)
    return statistics.fmean(t for t in times if t - typical <= _spike_floor(typical))


def _cores() -> int:
    from ..core.collator import usable_cores

    return usable_cores()


def probe(make_loader: Callable[[], Any], workers: int, kind: str, batches_per_epoch: int, seen: Look,
          memory: WorkerMemory | None = None, max_s: float = 2.0) -> model.Profile:
    """A short untraced run (one epoch, a few batches) of a loader the user does not run now: the
    main process's and the workers' CPU per batch, each batch's wait and the start-up -- untraced,
    because for small batches the trace's own cost is as large as the loader's. The per-batch
    spread of the work (rare slow samples) is the traced run's (``seen``): the dataset is the same.
    ``memory``: the workers' private memory, sampled at their first and last batch. ``max_s``: no
    new batch after this many seconds (the doctor's budget)."""
    n = min(batches_per_epoch, max(12, 6 * max(1, workers)))
    # at least n batches and min_s seconds (more passes over a short epoch), so that a preemption
    # or two, or the previous run's aftermath, do not set the level
    min_s = min(0.25, max_s / 2)
    gc.collect()  # the same conditions as the measured runs (measure.run_epochs)
    waits: list[float] = []
    firsts: list[float] = []  # the loader's creation to its first batch, then each new epoch's to its first
    ends: list[float] = []    # each epoch's last next(), the one that stops it
    whole = 0                 # complete epochs, the first from the loader's creation
    whole_s = 0.0             # ... and the time they took together
    worker_cpu = 0.0
    main_cpu = 0.0
    t0 = time.perf_counter()
    loader = make_loader()
    per_epoch = len(loader) if hasattr(loader, "__len__") else None
    while True:
        e0 = time.perf_counter()
        it = iter(loader)
        cpu0: dict[int, float] = {}
        cpu_end: dict[int, float] = {}  # at an epoch's last batch: the next() that stops it reaps the workers
        i = 0
        c0 = time.process_time()
        while i < n or time.perf_counter() - t0 < min_s:
            w0 = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                ends.append(time.perf_counter() - w0)
                if whole == len(firsts) - 1:  # no epoch before this one was cut short
                    whole += 1
                    whole_s = time.perf_counter() - t0
                break
            if i == 0:
                firsts.append(time.perf_counter() - (t0 if not firsts else e0))
                if memory is not None:
                    memory.sample(worker_pids(it))
                for pid in worker_pids(it):
                    c = cpu_seconds(pid)
                    if c is not None:
                        cpu0[pid] = c
                c0 = time.process_time()
                del batch
            else:
                # the loop's own per-batch work as the measured runs do it (count the samples,
                # drop the batch): on batches of a few microseconds it is a tenth of the total
                batch_len(batch)
                del batch
                waits.append(time.perf_counter() - w0)
            i += 1
            if i == per_epoch and cpu0:
                # a non-persistent loader's workers exit at StopIteration, and their CPU clocks
                # with them: read them now (an epoch read after it would count its batches and
                # none of their work)
                cpu_end = {pid: c for pid in cpu0 if (c := cpu_seconds(pid)) is not None}
                if memory is not None:
                    memory.sample(cpu0)
            if time.perf_counter() - t0 > max_s and i >= 2:
                break
        if memory is not None:
            memory.sample(worker_pids(it))
        if i > 1:
            main_cpu += time.process_time() - c0
            for pid, c_first in cpu0.items():
                c = cpu_seconds(pid)
                if c is None:
                    c = cpu_end.get(pid)
                if c is not None:
                    worker_cpu += c - c_first
        del it
        if (len(waits) >= n and time.perf_counter() - t0 >= min_s) or time.perf_counter() - t0 > max_s or i <= 1:
            break
    del loader
    first = statistics.median(firsts) if firsts else 0.0
    counted = max(1, len(waits))
    spikes = seen.spikes_s or [0.0]
    fetch_share = [f / m if m > 0 else 1.0 for f, m in zip(seen.profile.fetch_s, seen.profile.make_s)] or [1.0]

    def per_batch(typical: float) -> list[float]:
        # this loader's typical batch, plus each batch's own slow samples as the traced run saw
        # them: the dataset, and so its slow samples, is the same whatever the loader
        return [typical + s for s in spikes]

    if workers == 0 and whole >= 2:
        # whole epochs ran inside the probe (a cheap dataset): what they cost together, the
        # loader's creation, the first batch, the dataset's slow samples and each epoch's start
        # and end included, is the measurement itself -- as the measured runs take it (a run of a
        # few milliseconds: its start is a share of it, and so is the noise of any one epoch)
        level = whole_s / (whole * max(1, batches_per_epoch))
        make = [level] * max(1, batches_per_epoch)
        return model.Profile(kind=kind, workers=0, make_s=make,
                             fetch_s=[m * f for m, f in zip(make, itertools.cycle(fetch_share))],
                             worker_cpu_s=level, main_cpu_s=0.0, cpu_s=level)
    if workers == 0:
        # each next() is the whole of it: sampler, fetch, collate, the loop; its level leaves
        # out the slow batches (the traced run's spikes add them) and a preemption now and then
        level = _level(waits)
        make = per_batch(level)
        # an epoch's own cost beyond its batches: a new iterator before its first batch, and the
        # next() that stops it -- on a cheap dataset a visible share of a short epoch
        # (an epoch's first batch is make[0]: its slow samples are the batch's, not the start's)
        restart = max(0.0, statistics.median(firsts[1:]) - make[0]) if len(firsts) > 1 else 0.0
        epoch = restart + (statistics.median(ends) if ends else 0.0)
        created = max(0.0, firsts[0] - make[0] - restart) if firsts else 0.0
        return model.Profile(kind=kind, workers=0, make_s=make,
                             fetch_s=[m * f for m, f in zip(make, itertools.cycle(fetch_share))],
                             worker_cpu_s=level, main_cpu_s=0.0, first_s=created, epoch_s=epoch, cpu_s=level)
    w_cpu = worker_cpu / counted
    m_cpu = main_cpu / counted
    # a worker's typical batch: its CPU, plus the waiting a typical sample does (measured in the
    # main process: wall against CPU clock) -- a CPU clock does not see a read or a sleep
    fetch_typical = statistics.median(seen.profile.fetch_s) if seen.profile.fetch_s else 0.0
    typical = w_cpu + seen.waiting * fetch_typical / max(1.0, seen.profile.contention)
    make = per_batch(typical)
    return model.Profile(kind=kind, workers=workers, make_s=make,
                         fetch_s=[m * f for m, f in zip(make, itertools.cycle(fetch_share))],
                         worker_cpu_s=w_cpu, main_cpu_s=m_cpu, start_s=max(0.0, first - make[0]),
                         start_workers=workers, contention=1.0, cpu_s=w_cpu)


def replay_ceiling(seen: Look, step: Callable[[Any], Any] | None, work: model.Workload,
                   max_s: float | None = None) -> float | None:
    """The loop with data free: one batch replayed through the step, an epoch's worth (at most
    ``max_s`` seconds of it); None for a data-only loop: without a step there is nothing but the
    data."""
    if seen.batch is None or step is None:
        return None
    n = max(1, min(work.batches, 256))
    t0 = time.perf_counter()
    done = 0
    for _ in range(n):
        step(seen.batch)
        done += 1
        if max_s is not None and done >= 2 and time.perf_counter() - t0 > max_s:
            break
    dt = time.perf_counter() - t0
    samples = done * batch_len(seen.batch)
    return samples / dt if dt > 0 else float("inf")
