"""tune_loader: pick DataLoader settings by measurement, inside a time budget."""
from __future__ import annotations

import dataclasses
import itertools
import os
import sys
import time
from typing import Any, Callable, Sequence

import torch
from torch.utils.data import DataLoader, Dataset, default_collate

from .._text import table_rule
from ..core.collator import usable_cores, collate as fast_collate


@dataclasses.dataclass
class TuneResult:
    best: dict[str, Any]     # DataLoader keyword arguments of the fastest configuration
    table: list[dict[str, Any]]

    def format(self) -> str:
        head = f"| {'workers':>7} | {'prefetch':>8} | {'pin':>5} | {'collate':<11} | {'batches/s':>9} | {'peak RSS MB':>11} | status |"
        lines = [head, table_rule(head)]
        for r in self.table:
            bps = f"{r['batches_per_s']:9.1f}" if r["batches_per_s"] else " " * 9
            rss = f"{r['peak_rss_mb']:11.0f}" if r["peak_rss_mb"] else " " * 11
            lines.append(f"| {r['num_workers']:>7} | {str(r['prefetch_factor']):>8} | {str(r['pin_memory']):>5} | "
                         f"{r['collate']:<11} | {bps} | {rss} | {r['status']} |")
        return "\n".join(lines)


def _rss_mb(pids: Sequence[int]) -> float:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError):
            pass
    return total / 2**20


def _worker_pids(it: Any) -> list[int]:
    return [w.pid for w in getattr(it, "_workers", []) if getattr(w, "pid", None)]


def _candidates(num_workers: Sequence[int] | None) -> list[int]:
    cores = usable_cores()
    if num_workers is None:
        num_workers = sorted({0, 1, 2, 4, 8, 16, cores})
    return [w for w in num_workers if 0 <= w <= cores]  # never more workers than cores


def tune_loader(dataset: Dataset, batch_size: int, *, collate_fn: Callable | None = None,
                budget_s: float = 60.0, num_workers: Sequence[int] | None = None,
                prefetch_factors: Sequence[int] = (2, 4), pin_memory: Sequence[bool] | None = None,
                compare_default: bool = True, warmup_batches: int = 2, progress: bool = True,
                shuffle: bool = False) -> TuneResult:
    """Sweep num_workers x prefetch_factor x pin_memory (x default_collate vs fastcollate) and
    measure batches/s and peak RSS after warm-up, each configuration given an equal slice of
    ``budget_s``. Returns the best settings (DataLoader kwargs) and the full table.

    >>> import torch, fastcollate
    >>> ds = [torch.zeros(4) for _ in range(64)]
    >>> res = fastcollate.tune_loader(ds, 8, budget_s=2, num_workers=[0], progress=False)
    >>> res.best["num_workers"]
    0
    """
    if batch_size < 1:
        raise ValueError(f"tune_loader: batch_size must be >= 1, got {batch_size}")
    if budget_s <= 0:
        raise ValueError(f"tune_loader: budget_s must be > 0, got {budget_s}")
    workers = _candidates(num_workers)
    if not workers:
        raise ValueError(f"tune_loader: no worker count fits the {usable_cores()} cores available")
    pins = list(pin_memory) if pin_memory is not None else ([False, True] if torch.cuda.is_available() else [False])
    collates: list[tuple[str, Callable]] = [("fastcollate", collate_fn or fast_collate)]
    if compare_default and collate_fn is None:
        collates.append(("default", default_collate))
    configs = []
    for w, pf, pin, (cname, cfn) in itertools.product(workers, prefetch_factors, pins, collates):
        if w == 0 and pf != prefetch_factors[0]:
            continue  # prefetch_factor means nothing without workers
        configs.append((w, pf if w > 0 else None, pin, cname, cfn))
    deadline = time.monotonic() + budget_s
    slice_s = budget_s / len(configs)
    table = []
    for i, (w, pf, pin, cname, cfn) in enumerate(configs):
        row = {"num_workers": w, "prefetch_factor": pf, "pin_memory": pin, "collate": cname,
               "batches_per_s": 0.0, "peak_rss_mb": 0.0, "batches": 0, "status": "ok"}
        if progress:
            bar = "#" * int(20 * i / len(configs))
            print(f"\rtune [{bar:<20}] {i}/{len(configs)} workers={w} prefetch={pf} pin={pin} {cname}   ",
                  end="", file=sys.stderr, flush=True)
        remaining = deadline - time.monotonic()
        if remaining <= 0.05:
            row["status"] = "skipped (budget)"
            table.append(row)
            continue
        # leave room for the loader's shutdown (joining workers) inside the budget
        stop_at = time.monotonic() + max(0.05, min(slice_s, remaining) - (0.25 if w > 0 else 0.0))
        kw: dict[str, Any] = {"num_workers": w, "pin_memory": pin, "collate_fn": cfn, "shuffle": shuffle}
        if w > 0:
            kw.update(prefetch_factor=pf, persistent_workers=False)
        try:
            loader = DataLoader(dataset, batch_size=batch_size, **kw)
            it = iter(loader)
            pids = [os.getpid()] + _worker_pids(it)
            n, t0, peak = 0, None, 0.0
            while time.monotonic() < stop_at:
                try:
                    next(it)
                except StopIteration:
                    it = iter(loader)
                    pids = [os.getpid()] + _worker_pids(it)
                    continue
                n += 1
                if n == warmup_batches:
                    t0, n0 = time.perf_counter(), n
                if n % 4 == 0:
                    peak = max(peak, _rss_mb(pids))
            del it
            if t0 is None or n <= warmup_batches:
                row["status"] = "too slow for its time slice"
            else:
                row["batches_per_s"] = (n - n0) / (time.perf_counter() - t0)
                row["batches"] = n - n0
            row["peak_rss_mb"] = peak
        except Exception as exc:  # a config that cannot run is a row, not the end of the sweep
            row["status"] = f"error: {type(exc).__name__}: {exc}"[:120]
        table.append(row)
    if progress:
        print(f"\rtune [{'#' * 20}] {len(configs)}/{len(configs)} done{' ' * 40}", file=sys.stderr, flush=True)
    measured = [r for r in table if r["batches_per_s"] > 0]
    if not measured:
        raise RuntimeError("tune_loader: no configuration produced a measurement within the budget; raise budget_s")
    top = max(measured, key=lambda r: r["batches_per_s"])
    best = {"num_workers": top["num_workers"], "pin_memory": top["pin_memory"],
            "collate_fn": collate_fn or (fast_collate if top["collate"] == "fastcollate" else default_collate)}
    if top["num_workers"] > 0:
        best["prefetch_factor"] = top["prefetch_factor"]
        best["persistent_workers"] = True
    best["batches_per_s"] = top["batches_per_s"]
    best["collate"] = top["collate"]
    return TuneResult(best=best, table=table)
