"""The collate benchmark: fastcollate vs default_collate vs a memcpy ceiling, side by side.

Each round times the three in turn (interleaved, so machine noise hits all of them), holding
the previous batch alive as a training loop does; the table reports medians over rounds.
"""
from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Iterable

import torch
from torch.utils.data import default_collate

from . import workloads
from .._text import table_rule
from ..core.collator import Collator


def time_per_call(fn: Callable[[], Any], min_time: float) -> float:
    """Seconds per call: repeat fn until min_time has passed (at least 3 calls)."""
    held = fn()  # warm (and keep one result alive, like the loop's previous batch)
    calls, start = 0, time.perf_counter()
    while True:
        out = fn()
        held = out
        calls += 1
        elapsed = time.perf_counter() - start
        if calls >= 3 and elapsed >= min_time:
            del held, out
            return elapsed / calls


def measure(name: str, rounds: int = 5, min_time: float = 0.2, collator: Collator | None = None) -> dict[str, Any]:
    label, make = workloads.WORKLOADS[name]
    batch = make()
    fast = collator or Collator()
    nbytes = sum(workloads.tensor_bytes(s) for s in batch)
    src = torch.empty(nbytes, dtype=torch.uint8).random_(0, 255)
    dst = torch.empty(nbytes, dtype=torch.uint8)
    t_default, t_fast, t_ceiling = [], [], []
    for _ in range(rounds):
        t_default.append(time_per_call(lambda: default_collate(batch), min_time))
        t_fast.append(time_per_call(lambda: fast(batch), min_time))
        t_ceiling.append(time_per_call(lambda: dst.copy_(src), min_time))
    d, f, c = (statistics.median(x) for x in (t_default, t_fast, t_ceiling))
    return {
        "workload": name,
        "description": label,
        "batch_bytes": nbytes,
        "default_ms": d * 1e3,
        "fastcollate_ms": f * 1e3,
        "memcpy_ms": c * 1e3,
        "speedup": d / f,
        "of_memcpy": c / f,
        "rounds": rounds,
    }


def measure_pad(name: str, rounds: int = 5, min_time: float = 0.2) -> dict[str, Any]:
    """Padding collate vs the usual as_tensor + pad_sequence + mask pattern."""
    label, make = workloads.PAD_WORKLOADS[name]
    batch = make()
    fast = Collator(pad={"input_ids": 0, "labels": -100})
    t_usual, t_fast = [], []
    for _ in range(rounds):
        t_usual.append(time_per_call(lambda: workloads.usual_padding(batch), min_time))
        t_fast.append(time_per_call(lambda: fast(batch), min_time))
    u, f = statistics.median(t_usual), statistics.median(t_fast)
    return {"workload": name, "description": label, "usual_ms": u * 1e3, "fastcollate_ms": f * 1e3,
            "speedup": u / f, "rounds": rounds}


def run_pad(names: Iterable[str] | None = None, rounds: int = 5, min_time: float = 0.2,
            progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    return _each(names or workloads.PAD_WORKLOADS, "pad", progress,
                 lambda n: measure_pad(n, rounds=rounds, min_time=min_time))


def format_pad_table(rows: list[dict[str, Any]]) -> str:
    head = f"| {'workload':<40} | {'as_tensor+pad_sequence+mask':>27} | {'fastcollate':>11} | {'speedup':>7} |"
    lines = [head, table_rule(head)]
    for r in rows:
        lines.append(f"| {r['description']:<40} | {r['usual_ms']:24.3f} ms | {r['fastcollate_ms']:8.3f} ms | "
                     f"{r['speedup']:6.2f}x |")
    return "\n".join(lines)


def _samples_per_s(loader: Any, epochs: int) -> float:
    best = 0.0
    it = iter(loader)
    next(it)  # workers started and warm
    del it
    for _ in range(epochs):
        t0, n = time.perf_counter(), 0
        for batch in loader:
            n += len(batch["label"])
            del batch
        best = max(best, n / (time.perf_counter() - t0))
    return best


def measure_loaders(name: str, epochs: int = 2, num_workers: int = 2) -> dict[str, Any]:
    """torch's DataLoader (workers, and none) vs fastcollate.DataLoader's worker ring."""
    from torch.utils.data import DataLoader as TorchLoader

    from ..loader.dataloader import DataLoader as FastLoader

    label, make = workloads.LOADER_WORKLOADS[name]
    ds, bs = make()
    pw = dict(num_workers=num_workers, persistent_workers=True)
    rates = {
        "torch_workers": _samples_per_s(TorchLoader(ds, batch_size=bs, **pw), epochs),
        "torch_main": _samples_per_s(TorchLoader(ds, batch_size=bs), epochs),
        "ring_workers": _samples_per_s(FastLoader(ds, batch_size=bs, **pw), epochs),
    }
    return {"workload": name, "description": label, "num_workers": num_workers, **rates,
            "vs_torch_workers": rates["ring_workers"] / rates["torch_workers"],
            "vs_torch_main": rates["ring_workers"] / rates["torch_main"]}


def run_loaders(epochs: int = 2, progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    return _each(workloads.LOADER_WORKLOADS, "loader", progress, lambda n: measure_loaders(n, epochs=epochs))


def format_loader_table(rows: list[dict[str, Any]]) -> str:
    head = (f"| {'workload':<30} | {'torch, 2 workers':>16} | {'torch, main':>11} | {'ring, 2 workers':>15} | "
            f"{'vs torch workers':>16} | {'vs torch main':>13} |")
    lines = [head, table_rule(head)]
    for r in rows:
        lines.append(f"| {r['description']:<30} | {r['torch_workers']:14.0f}/s | {r['torch_main']:9.0f}/s | "
                     f"{r['ring_workers']:13.0f}/s | {r['vs_torch_workers']:15.2f}x | {r['vs_torch_main']:12.2f}x |")
    return "\n".join(lines)


def _two_epochs(make_loader: Callable[[], Any]) -> tuple[float, float, float]:
    """(time to first batch, first epoch, second epoch) of a NEW loader with the default
    persistent_workers=False: its workers, ring and faults in the first; the second starts new
    workers again (what every epoch of such a loader pays) over a ring already made."""
    loader = make_loader()
    t0 = time.perf_counter()
    it = iter(loader)
    next(it)
    first = time.perf_counter() - t0
    for _ in it:
        pass
    epoch1 = time.perf_counter() - t0
    t1 = time.perf_counter()
    for _ in loader:
        pass
    return first, epoch1, time.perf_counter() - t1


def measure_startup(rounds: int = 3, num_workers: int = 2, batches: int = 12, batch_size: int = 192) -> dict[str, Any]:
    """A new loader's first and second epoch, torch's DataLoader vs fastcollate.DataLoader (same
    arguments, not persistent), interleaved rounds, medians: what a user meets first, not the
    steady state."""
    from torch.utils.data import DataLoader as TorchLoader

    from ..loader.dataloader import DataLoader as FastLoader

    g = torch.Generator().manual_seed(9)
    ds = workloads.CachedSamples([{"image": torch.randint(0, 256, (3, 256, 256), dtype=torch.uint8, generator=g),
                                   "label": i} for i in range(16)], batches * batch_size)
    kw = dict(batch_size=batch_size, num_workers=num_workers)
    torch_t, ours_t = [], []
    for _ in range(rounds):
        torch_t.append(_two_epochs(lambda: TorchLoader(ds, **kw)))
        ours_t.append(_two_epochs(lambda: FastLoader(ds, **kw)))
    tf, te, te2 = (statistics.median(x[i] for x in torch_t) for i in (0, 1, 2))
    of, oe, oe2 = (statistics.median(x[i] for x in ours_t) for i in (0, 1, 2))
    return {"description": f"new loader: {batches} x {batch_size} x uint8 3x256x256, {num_workers} workers",
            "torch_first_s": tf, "torch_epoch_s": te, "ours_first_s": of, "ours_epoch_s": oe,
            "torch_epoch2_s": te2, "ours_epoch2_s": oe2,
            "epoch_speedup": te / oe, "epoch2_speedup": te2 / oe2, "first_batch_ratio": of / tf, "rounds": rounds}


def format_startup(r: dict[str, Any]) -> str:
    head = (f"| {'workload':<52} | {'torch first batch / epoch 1 / epoch 2':>37} | "
            f"{'ring first batch / epoch 1 / epoch 2':>36} | {'epoch 1':>7} | {'epoch 2':>7} | {'1st batch':>9} |")
    sep = table_rule(head)
    row = (f"| {r['description']:<52} | {r['torch_first_s'] * 1e3:9.0f} / {r['torch_epoch_s'] * 1e3:9.0f} / "
           f"{r['torch_epoch2_s'] * 1e3:9.0f} ms | {r['ours_first_s'] * 1e3:8.0f} / {r['ours_epoch_s'] * 1e3:9.0f} / "
           f"{r['ours_epoch2_s'] * 1e3:9.0f} ms | {r['epoch_speedup']:6.2f}x | {r['epoch2_speedup']:6.2f}x | "
           f"{r['first_batch_ratio']:8.2f}x |")
    return "\n".join([head, sep, row])


def run(names: Iterable[str] | None = None, rounds: int = 5, min_time: float = 0.2,
        progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    return _each(names or workloads.WORKLOADS, "collate", progress,
                 lambda n: measure(n, rounds=rounds, min_time=min_time))


def _each(names: Iterable[str], tag: str, progress: Callable[[str], None] | None,
          measure_one: Callable[[str], dict[str, Any]]) -> list[dict[str, Any]]:
    names = list(names)
    rows = []
    for i, name in enumerate(names):
        if progress:
            progress(f"[{tag} {i + 1}/{len(names)}] {name}")
        rows.append(measure_one(name))
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    head = f"| {'workload':<46} | {'MB':>6} | {'default_collate':>15} | {'fastcollate':>11} | {'speedup':>7} | {'of memcpy':>9} |"
    lines = [head, table_rule(head)]
    for r in rows:
        of = f"{100 * r['of_memcpy']:8.0f}%" if r["batch_bytes"] >= workloads.MEMCPY_MEANINGFUL_BYTES else f"{'—':>9}"
        lines.append(
            f"| {r['description']:<46} | {r['batch_bytes'] / 1e6:6.2f} | {r['default_ms']:12.3f} ms | "
            f"{r['fastcollate_ms']:8.3f} ms | {r['speedup']:6.2f}x | {of} |"
        )
    return "\n".join(lines)
