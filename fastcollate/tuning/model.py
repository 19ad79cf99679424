"""The doctor's model of a DataLoader pipeline: from what one run measured, the samples/s of any
setting (workers, prefetch, persistence, loader, cache), before running it.

Operational analysis, as Plumber does for tf.data (Kuchnik et al., MLSys 2022): each station's
*demand* is the CPU time it spends per batch, measured with the kernel's per-process CPU
clocks -- the main process (rebuild, sampler, the loop, the step), the workers (fetch + collate
+ sending) -- and what a batch waits for without a CPU (I/O, sleeps) is the rest of a worker's
time per batch. A setting's throughput is then bounded by each station (one main thread; W
workers; the cores the process may use, which main and workers share), and the order batches
are delivered in (in order, each worker with at most ``prefetch_factor`` batches outstanding) is
played out batch by batch over the measured per-batch times, so that a rare slow sample costs
what it costs in-order (and prefetching hides it when it can). Worker start-up is paid each
epoch, or once with persistent workers; with a cache, the first epoch also pays each sample's
insertion (its measured write cost) and the epochs after it fetch each sample at the cache's
measured read cost.
"""
from __future__ import annotations

import dataclasses
import statistics
from typing import Sequence


@dataclasses.dataclass
class Profile:
    """What one loader kind costs per batch, measured (see doctor.profile_run).

    ``make_s``: each batch's time in its worker (or in the main process with 0 workers): fetch
    + collate, as measured, with ``contention`` (>= 1) the factor by which the CPU part was
    slowed by other processes when it was measured. ``fetch_s``: the fetch part of each batch.
    ``worker_cpu_s``: worker CPU seconds per batch (fetch, collate, sending). ``main_cpu_s``:
    main-process CPU per batch without the user's step (the loop, the rebuild, the sampler; with
    0 workers also fetch and collate). ``start_s``: a new epoch's worker start-up, measured with
    ``start_workers`` workers."""

    kind: str
    workers: int
    make_s: list[float]
    fetch_s: list[float]
    worker_cpu_s: float
    main_cpu_s: float
    start_s: float = 0.0
    start_workers: int = 1
    contention: float = 1.0
    first_s: float = 0.0  # a new loader's first batch beyond the others (cold memory, first calls)
    epoch_s: float = 0.0  # with 0 workers, each epoch's own cost: a new iterator, the next() that stops it
    cpu_s: float | None = None  # of make_s, the CPU part (the rest is each batch's waiting: I/O, sleeps)

    @property
    def mean_make(self) -> float:
        return statistics.fmean(self.make_s) if self.make_s else 0.0


@dataclasses.dataclass
class Setting:
    """A candidate: the DataLoader settings and the loader kind ("torch" with default_collate,
    "torch+fastcollate" with fastcollate.collate, "fastcollate" the ring loader)."""

    kind: str
    num_workers: int
    prefetch_factor: int = 2
    persistent_workers: bool = False
    cache: bool = False

    def key(self) -> tuple:
        return (self.kind, self.num_workers, self.prefetch_factor if self.num_workers else 0,
                self.persistent_workers if self.num_workers else False, self.cache)


@dataclasses.dataclass
class Workload:
    batches: int          # per epoch
    batch_size: int
    epochs: int
    cores: int
    step_s: float = 0.0   # the user's step per batch (0: data-only loop)
    step_cpu: bool = True  # the step runs on the host CPU (no GPU)
    cached_fetch_s: float | None = None  # a batch's fetch from the cache (None: no cache measured)
    cached_write_s: float = 0.0  # a batch's insertion into the cache, paid on top of the fetch in epoch 1


def simulate(make: Sequence[float], workers: int, prefetch: int, main_s: float, batches: int,
             start_s: float = 0.0) -> float:
    """Seconds for ``batches`` batches delivered in order by ``workers`` workers (torch's
    round-robin, at most ``prefetch`` outstanding each), a batch taking ``make[i % len]`` in its
    worker and ``main_s`` in the consumer after it arrives; workers start after ``start_s``."""
    if batches <= 0:
        return start_s
    n = len(make)
    if workers == 0:
        return sum(make[i % n] for i in range(batches)) + batches * main_s
    outstanding = workers * max(1, prefetch)
    free = [start_s] * workers       # when each worker is next free
    consumed: list[float] = []       # when the consumer finished each batch
    done_at = start_s
    # a hot loop (the auto mode plays out up to 1,024 batches for each setting it weighs, between
    # two epochs): conditional expressions rather than max(), no container that is not needed
    for i in range(batches):
        # batch i is sent when batch i - outstanding was consumed (the first ones at once)
        sent = start_s if i < outstanding else consumed[i - outstanding]
        w = i % workers
        begin = free[w]
        if sent > begin:
            begin = sent
        ready = free[w] = begin + make[i % n]
        done_at = (done_at if done_at > ready else ready) + main_s
        consumed.append(done_at)
    return done_at


def start_cost(start_s: float, measured_with: int, workers: int, cores: int) -> float:
    """An epoch's worker start-up with ``workers`` workers, from ``start_s`` measured with
    ``measured_with``: up to the cores the workers start side by side (their imports and first
    fetches overlap: it grows as the square root of the count), beyond them they queue for the
    cores and it grows in proportion (a smaller pool than the one measured: likewise, shrinking).
    Measured on 2 quiet cores: the first batch 21.8/40.6/80.6 ms
    after the start with 2/4/8 forked workers; the doctor's I/O row (3 ms waits, 16 workers
    proposed) predicted 31% fast with a 3/4 power, and the rare-slow row 23% fast."""
    if not workers:
        return 0.0
    cores = max(1, cores)

    def pool(n: int) -> float:  # a pool of n's start-up, in some unit
        return min(n, cores) ** 0.5 * max(1.0, n / cores)

    return start_s * pool(workers) / pool(max(1, measured_with))


def predict(setting: Setting, profile: Profile, work: Workload) -> dict[str, float]:
    """Predicted samples/s (and its parts) of ``setting`` over the workload's epochs, from the
    ``profile`` measured for its loader kind."""
    cores = max(1, work.cores)
    W = setting.num_workers
    step = work.step_s
    base_make = list(profile.make_s) or [0.0]
    total = 0.0
    parts = {"start_s": 0.0}
    for epoch in range(work.epochs):
        make = base_make
        extra_cpu = 0.0  # the cache's own CPU work per batch this epoch (a worker's, or the main's)
        if setting.cache and epoch == 0 and work.cached_write_s:
            # each sample fetched, then serialized into the cache: on a cheap dataset the first
            # epoch's insertions cost more than the later epochs' reads save
            extra_cpu = work.cached_write_s
            make = [m + extra_cpu for m in base_make]
        elif setting.cache and epoch > 0 and work.cached_fetch_s is not None:
            # the fetch part of each batch replaced by the cache's read cost
            make = [max(0.0, m - f + work.cached_fetch_s) for m, f in zip(base_make, profile.fetch_s or base_make)]
        if W == 0:
            # everything in the main thread, one after the other: no contention, no start-up
            total += simulate(make, 0, 1, step + profile.main_cpu_s, work.batches)
            total += profile.epoch_s + (profile.first_s if epoch == 0 else 0.0)
            continue
        # uncontended per-batch times, then slowed by what W workers and the main thread ask of
        # the cores (a fixed point: the utilizations depend on the throughput they give); only
        # the CPU part of a batch slows, its waiting does not
        cpu = (profile.cpu_s if profile.cpu_s is not None else profile.worker_cpu_s) + extra_cpu
        uncontended = [max(0.0, m - cpu * (1.0 - 1.0 / max(1.0, profile.contention))) for m in make]
        main_s = profile.main_cpu_s + step
        start = 0.0
        if epoch == 0 or not setting.persistent_workers:
            start = start_cost(profile.start_s, profile.start_workers, W, cores)
        factor = 1.0
        t = 0.0
        for _ in range(4):
            slowed = [m + cpu * (factor - 1.0) for m in uncontended]
            t = simulate(slowed, W, setting.prefetch_factor, main_s, work.batches, start)
            busy = max(t - start, 1e-9)
            worker_util = min(float(W), (profile.worker_cpu_s + extra_cpu) * work.batches / busy)
            main_util = min(1.0, (profile.main_cpu_s + (step if work.step_cpu else 0.0)) * work.batches / busy)
            before, factor = factor, max(1.0, (worker_util + main_util) / cores)
            if factor == before:  # the same slowing again would play out the same: t is final
                break
        total += t
        parts["start_s"] += start
    samples = work.batches * work.batch_size * work.epochs
    return {"samples_per_s": samples / total if total > 0 else 0.0, "seconds": total, **parts}


def candidates(base: Setting, kinds: Sequence[str], workers: Sequence[int], epochs: int, cacheable: bool,
               persistent_ok: bool = True, prefetch: Sequence[int] = (2, 4, 8)) -> list[Setting]:
    """The settings the doctor predicts: every loader kind allowed, each worker count of
    ``workers`` (the doctor bounds them by the cores, the waiting, the memory and what must not
    change a batch), prefetch 2/4/8, persistent workers over several epochs where
    ``persistent_ok`` (else the user's own choice), the cache where it is allowed."""
    out: dict[tuple, Setting] = {}
    for kind in kinds:
        for w in sorted(set(workers)):
            if w == 0 and kind == "fastcollate" and "torch+fastcollate" in kinds:
                # without workers the ring loader is torch's loader with fastcollate.collate: the
                # same loop, proposed as the smaller change (and never measured twice)
                continue
            pers = ((False, True) if persistent_ok and epochs > 1 else (base.persistent_workers,)) if w else (False,)
            for pf in (prefetch if w else (2,)):
                for persistent in pers:
                    for cache in ((False, True) if cacheable else (False,)):
                        s = Setting(kind, w, pf, persistent, cache)
                        out.setdefault(s.key(), s)
    out.setdefault(base.key(), base)
    return list(out.values())


def worker_counts(cores: int, waiting: float, most: int | None = None) -> list[int]:
    """The worker counts worth predicting on ``cores`` cores when a fetch spends ``waiting`` (0-1)
    of its time off the CPU (I/O, sleeps): a worker then keeps only ``1 - waiting`` of a core busy,
    so up to ``cores / (1 - waiting)`` of them fit (never more than 8x the cores: each is a process
    with its own memory). ``most``: a cap (memory). Every count up to the cores, then doublings."""
    top = cores
    if waiting > 0:
        top = max(cores, min(8 * cores, int(cores / max(1.0 - waiting, 1 / (8 * cores)) + 0.5)))
    if most is not None:
        top = max(0, min(top, most))
    out = set(range(0, min(cores, top) + 1))
    w = max(1, cores)
    while w < top:
        w *= 2
        out.add(min(w, top))
    out.add(top)
    return sorted(out)


def fewest_workers(make_s: float, cpu_s: float, main_s: float, step_s: float, cores: int, *,
                   step_cpu: bool = True, prefetch: int = 2, most: int | None = None,
                   batches: int = 256) -> tuple[int, dict[int, float]]:
    """The fewest workers this model predicts within 5% of the best rate, from what a trace
    measured per batch: ``make_s`` a batch's fetch + collate in a worker, ``cpu_s`` of it on the
    CPU (the rest waited: I/O, sleeps), ``main_s`` the main process's own part, ``step_s`` the
    user's step; on ``cores`` (this rank's share). Returns the count and each count's batches/s
    (steady state: the pool already started). What the StallMonitor advises and what the doctor
    and the auto mode choose come from this one model."""
    make_s = max(make_s, 1e-9)
    cpu_s = min(max(cpu_s, 0.0), make_s)
    prof = Profile(kind="fastcollate", workers=1, make_s=[make_s], fetch_s=[make_s], worker_cpu_s=cpu_s,
                   main_cpu_s=main_s, cpu_s=cpu_s)
    work = Workload(batches=batches, batch_size=1, epochs=1, cores=max(1, cores), step_s=step_s, step_cpu=step_cpu)
    rates = {w: predict(Setting("fastcollate", w, prefetch, persistent_workers=True), prof, work)["samples_per_s"]
             for w in worker_counts(max(1, cores), 1.0 - cpu_s / make_s, most) if w}
    best = max(rates.values())
    return min(w for w, r in rates.items() if r >= 0.95 * best), rates


def ceil_div(a: int, b: int) -> int:
    return -(-a // b) if b else 0


def batches_per_epoch(n: int, batch_size: int, drop_last: bool) -> int:
    return n // batch_size if drop_last else ceil_div(n, batch_size)


__all__ = ["Profile", "Setting", "Workload", "simulate", "predict", "candidates", "worker_counts",
           "batches_per_epoch"]
