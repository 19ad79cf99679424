"""Memory as a resource: what a process may use, what a DataLoader worker holds privately, and the
copy-on-write growth that makes "memory grows with workers".

A forked worker shares its parent's pages until it writes one. Python writes an object's
reference count every time it touches the object, so a dataset held as millions of Python
objects (a list of dicts, of strings, of ints) has every page of it copied into every worker
that reads it: each worker's private memory grows to the dataset's size. Numpy-backed storage
(one buffer, no per-item objects: fastcollate.ArrayDataset) is read without being written.
"""
from __future__ import annotations

import os
from typing import Iterable

_MB = 1 << 20
# A worker's private memory grows by a few MB over an epoch of its own work (its batches, Python's
# heap; measured: 2-8 MB on numpy-backed and small-sample datasets); beyond this it has copied pages
# it shares with its parent -- each of N workers holding its own copy is N times that, which a
# fixed 64 MB threshold let pass unnamed at 8 workers x 40 MB
COW_MB = 16.0


def private_mb(pid: int) -> float | None:
    """The pages a process holds on its own (private clean + dirty, swap too), in MB; None when
    the process is gone or the kernel does not say."""
    sizes = _rollup(pid)
    return None if sizes is None else sizes[0]


def _rollup(pid: int) -> tuple[float, float] | None:
    """(private MB, shared MB) of a process from smaps_rollup."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            text = f.read()
    except OSError:
        return None
    private = shared = 0
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in ("Private_Clean", "Private_Dirty", "Swap"):
            private += int(rest.split()[0])  # kB
        elif key in ("Shared_Clean", "Shared_Dirty"):
            shared += int(rest.split()[0])
    return private / 1024, shared / 1024


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds a process has used so far (None when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks  # utime, stime (fields 14, 15 of stat)


def available_bytes() -> int:
    """Memory this process may still use: MemAvailable, capped by a cgroup (container) limit (the
    sample cache's own measure of it)."""
    from ..cache.cached import memory_available

    return memory_available()


def worker_pids(iterator: object) -> list[int]:
    """The worker processes of a DataLoader iterator (empty for main-process loading)."""
    return [w.pid for w in getattr(iterator, "_workers", None) or () if getattr(w, "pid", None)]


class WorkerMemory:
    """Private memory of a loader's workers, sampled at their first batch and at their last batch
    of each epoch: the growth is what copy-on-write (or a leak) costs per worker."""

    def __init__(self) -> None:
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}
        # the pages each worker shares with its parent, first and last: copy-on-write turns shared
        # pages private, so they drop as private memory grows; a worker's own allocations (a JPEG
        # decoder's buffers, its batches) grow private memory and leave the shared pages alone
        self.shared_first: dict[int, float] = {}
        self.shared_last: dict[int, float] = {}

    def sample(self, pids: Iterable[int]) -> None:
        for pid in pids:
            sizes = _rollup(pid)
            if sizes is None:
                continue
            self.first.setdefault(pid, sizes[0])
            self.last[pid] = sizes[0]
            self.shared_first.setdefault(pid, sizes[1])
            self.shared_last[pid] = sizes[1]

    def _copied(self, pid: int) -> float:
        """MB worker ``pid`` copied from its parent: its private growth, at most what it stopped
        sharing (where that was measured)."""
        growth = self.last[pid] - self.first[pid]
        if pid in self.shared_first and pid in self.shared_last:
            growth = min(growth, self.shared_first[pid] - self.shared_last[pid])
        return growth

    def report(self, threshold_mb: float = COW_MB) -> dict[str, object]:
        """``{"workers_private_mb": [...], "growth_mb": float, "finding": "copy_on_write" | None}``:
        the last private size of each worker, their mean growth by copying their parent's pages,
        and "copy_on_write" when a worker copied more than ``threshold_mb``."""
        pids = sorted(self.last)
        growth = [self._copied(p) for p in pids]
        mean = sum(growth) / len(growth) if growth else 0.0
        return {"workers_private_mb": [round(self.last[p], 1) for p in pids], "growth_mb": round(mean, 1),
                "finding": "copy_on_write" if growth and max(growth) > threshold_mb else None}
