"""`fastcollate doctor --dataset`: the user's dataset through torch's DataLoader and through
fastcollate's, each traced, side by side -- the stage table, the bottleneck, what to change, and
what fastcollate changed."""
from __future__ import annotations

import os
import time
from typing import Any, Callable

import torch
from torch.utils.data import DataLoader, default_collate

from ..training.monitor import StallMonitor, format_stages
from ..loader.dataloader import DataLoader as FastLoader

_COLUMNS = ("sampler", "fetch", "collate", "queue", "rebuild", "transfer", "wait", "compute")


def traced_run(make_loader: Callable[[], Any], batches: int) -> tuple[dict[str, Any], StallMonitor]:
    """A new loader, `batches` batches through a trivial step, traced: the report, samples/s,
    and the time to the first batch (a new loader's worker start included)."""
    mon = StallMonitor(trace=True)
    loader = make_loader()
    samples, first = 0, None
    t0 = time.perf_counter()
    for i, batch in enumerate(mon.wrap(loader)):
        if first is None:
            first = time.perf_counter() - t0
        with mon.compute():
            samples += _batch_len(batch)
        if i + 1 >= batches:
            break
    wall = time.perf_counter() - t0
    report = mon.report()
    report.update(samples_per_s=samples / wall if wall > 0 else 0.0, first_batch_s=first or 0.0, samples=samples)
    del loader
    return report, mon


def _batch_len(batch: Any) -> int:
    for leaf in (batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else [batch]):
        if isinstance(leaf, torch.Tensor) and leaf.dim() > 0:
            return int(leaf.shape[0])
    return 1


def compare(dataset: Any, batch_size: int, workers: int, batches: int, trace: str | None = None,
            plot: str | None = None, progress: Callable[[str], None] = print) -> str:
    kw = dict(batch_size=batch_size, num_workers=workers, shuffle=False)
    if hasattr(dataset, "__len__"):  # an epoch shorter than asked: say how many batches really ran
        batches = min(batches, max(1, -(-len(dataset) // batch_size)))
    progress(f"doctor: {batches} batches of {batch_size} through torch's DataLoader ({workers} workers), traced ...")
    theirs, mon_t = traced_run(lambda: DataLoader(dataset, collate_fn=default_collate, **kw), batches)
    mon_t.close()
    progress(f"doctor: the same through fastcollate.DataLoader ({workers} workers), traced ...")
    ours, mon = traced_run(lambda: FastLoader(dataset, **kw), batches)
    try:
        if trace:
            mon.save_trace(trace)
        if plot:
            mon.plot(plot, title="fastcollate.DataLoader")
    finally:
        mon.close()
    return format_comparison(theirs, ours, trace, plot)


def format_comparison(theirs: dict[str, Any], ours: dict[str, Any], trace: str | None, plot: str | None) -> str:
    lines = ["stage (p50 ms per batch)   torch DataLoader   fastcollate.DataLoader"]
    for stage in _COLUMNS:
        a, b = theirs["stages"].get(stage), ours["stages"].get(stage)
        if a or b:
            fa = f"{a['p50_ms']:.2f}" if a else "-"
            fb = f"{b['p50_ms']:.2f}" if b else "-"
            lines.append(f"  {stage:<24} {fa:>16} {fb:>24}")
    lines.append(f"  {'samples/s':<24} {theirs['samples_per_s']:>16.0f} {ours['samples_per_s']:>24.0f}")
    lines.append(f"  {'first batch (s)':<24} {theirs['first_batch_s']:>16.3f} {ours['first_batch_s']:>24.3f}")
    lines.append(f"  {'bottleneck':<24} {str(theirs['bottleneck']):>16} {str(ours['bottleneck']):>24}")
    lines.append("")
    lines.append(f"with fastcollate.DataLoader the loop is {ours['bottleneck']}-bound:" if ours["bottleneck"] not in
                 (None, "compute") else f"with fastcollate.DataLoader: {ours['bottleneck']}")
    lines += [f"  - {a}" for a in ours["findings"]]
    lines.append("what fastcollate changed:")
    lines += ["  - " + c for c in _changes(theirs, ours)]
    if ours.get("workers"):
        lines.append("fastcollate.DataLoader's workers:")
        lines += [f"  worker {w['id']} (pid {w['pid']}): {w['batches']} batches, busy {w['busy_fraction']:.0%}, "
                  f"{w['mean_batch_ms']:.2f} ms a batch" for w in ours["workers"]]
    lines.append("fastcollate.DataLoader's stages:")
    lines.append(format_stages(ours["stages"]))
    if trace:
        lines.append(f"trace: {trace} (open it in https://ui.perfetto.dev or chrome://tracing)")
    if plot:
        lines.append(f"plot: {plot}")
    return "\n".join(lines)


def _changes(theirs: dict[str, Any], ours: dict[str, Any]) -> list[str]:
    out = []
    for stage, what in (("collate", "the collate"), ("rebuild", "the main process's rebuild (unpickling)"),
                        ("queue", "time in the result queue")):
        a, b = theirs["stages"].get(stage), ours["stages"].get(stage)
        if a and b and b["p50_ms"] > 0:
            out.append(f"{what}: {a['p50_ms']:.2f} -> {b['p50_ms']:.2f} ms a batch ({a['p50_ms'] / b['p50_ms']:.1f}x)")
    if theirs["samples_per_s"] > 0:
        ratio = ours["samples_per_s"] / theirs["samples_per_s"]
        out.append(f"throughput {ratio:.2f}x torch's ({ours['samples_per_s']:.0f} vs {theirs['samples_per_s']:.0f} "
                   "samples/s)")
        if ours["bottleneck"] == "dataset" and ratio < 1.2:
            fetch = ours["stages"].get("fetch", {}).get("total_s", 0.0)
            made = fetch + ours["stages"].get("collate", {}).get("total_s", 0.0)
            share = fetch / made if made else 0.0
            out.append(f"the dataset is {share:.0%} of making a batch: that is why the loaders tie; only a cheaper "
                       "dataset or more workers move it")
    return out


def shm_line(workers: int) -> str:
    """How much /dev/shm there is, and whether the loaders will need it."""
    try:
        st = os.statvfs("/dev/shm")
    except OSError:
        return "/dev/shm: none (torch's DataLoader workers cannot send batches; fastcollate.DataLoader's ring can)"
    total, free = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
    need = ("torch's DataLoader puts every worker batch there; fastcollate's worker batches never do (memfds)"
            if workers > 0 else "no workers: neither loader needs it")
    small = "  (small: a container default; pass --shm-size or use fastcollate.DataLoader)" if total < 1 << 30 else ""
    return f"{free / 2**30:.2f} GiB free of {total / 2**30:.2f} GiB; {need}{small}"
