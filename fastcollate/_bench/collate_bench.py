"""The collate benchmark: fastcollate vs default_collate vs a memcpy ceiling, side by side.

Each round times the three in turn (interleaved, so machine noise hits all of them), holding
the previous batch alive as a training loop does; the table reports medians over rounds, and each
ratio's median over rounds with its min-max (``noise``: the rules that flag a row as untrusted).
Every row keeps its rounds (``rounds_ms``, ``rounds_per_s``, ``spread``) for ``--json``.
"""
from __future__ import annotations

import os
import platform
import statistics
import time
from typing import Any, Callable, Iterable

import torch
from torch.utils.data import default_collate

from . import noise, workloads
from .._text import table_rule
from ..core.collator import Collator

# the engine's threshold for streaming stores (csrc/engine/copy.cpp, FASTCOLLATE_STREAM_BYTES; 0: never)
_STREAM_ENV = os.environ.get("FASTCOLLATE_STREAM_BYTES", "")
STREAM_MIN_BYTES = (1 << 62 if _STREAM_ENV.strip() == "0" else int(_STREAM_ENV)) if _STREAM_ENV.strip() else 8 << 20


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
    speedup = noise.spread(noise.ratio_rounds(t_default, t_fast))
    # the engine writes large main-process batches with streaming stores (csrc/engine/copy.cpp),
    # which may beat the ordinary copy by up to 1.5x (see noise)
    streamed = nbytes >= STREAM_MIN_BYTES and platform.machine() in ("x86_64", "AMD64")
    judge = ("streamed_ceiling" if streamed else "ceiling") if nbytes >= workloads.MEMCPY_MEANINGFUL_BYTES else None
    of_memcpy = noise.spread(noise.ratio_rounds(t_ceiling, t_fast), judge)
    return {
        "workload": name,
        "description": label,
        "batch_bytes": nbytes,
        "default_ms": d * 1e3,
        "fastcollate_ms": f * 1e3,
        "memcpy_ms": c * 1e3,
        "speedup": speedup["median"],
        "of_memcpy": of_memcpy["median"],
        "rounds": rounds,
        "rounds_ms": {"default": _ms(t_default), "fastcollate": _ms(t_fast), "memcpy": _ms(t_ceiling)},
        "spread": {"speedup": speedup, "of memcpy": of_memcpy},
    }


def _ms(seconds: list[float]) -> list[float]:
    return [t * 1e3 for t in seconds]


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
    speedup = noise.spread(noise.ratio_rounds(t_usual, t_fast))
    return {"workload": name, "description": label, "usual_ms": u * 1e3, "fastcollate_ms": f * 1e3,
            "speedup": speedup["median"], "rounds": rounds,
            "rounds_ms": {"usual": _ms(t_usual), "fastcollate": _ms(t_fast)}, "spread": {"speedup": speedup}}


def run_pad(names: Iterable[str] | None = None, rounds: int = 5, min_time: float = 0.2,
            progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    return _each(names or workloads.PAD_WORKLOADS, "pad", progress,
                 lambda n: measure_pad(n, rounds=rounds, min_time=min_time))


def format_pad_table(rows: list[dict[str, Any]]) -> str:
    head = (f"| {'workload':<40} | {'as_tensor+pad_sequence+mask':>27} | {'fastcollate':>11} | "
            f"{'speedup (min-max)':>17} | {MARK_HEAD} |")
    lines = [head, table_rule(head)]
    for r in rows:
        lines.append(f"| {r['description']:<40} | {r['usual_ms']:24.3f} ms | {r['fastcollate_ms']:8.3f} ms | "
                     f"{noise.ratio_cell(r['spread']['speedup']):>17} | {noise.mark(r):^{len(MARK_HEAD)}} |")
    return "\n".join(lines)


def _warm(loader: Any) -> Any:
    it = iter(loader)
    next(it)  # workers started and warm
    del it
    return loader


def _epoch_rate(loader: Any) -> float:
    t0, n = time.perf_counter(), 0
    for batch in loader:
        n += len(batch["label"])
        del batch
    return n / (time.perf_counter() - t0)


def measure_loaders(name: str, rounds: int = 3, num_workers: int = 2) -> dict[str, Any]:
    """torch's DataLoader (workers, and none) vs fastcollate.DataLoader's worker ring: all three
    made and warmed first (persistent workers), then one epoch of each per round, interleaved."""
    from torch.utils.data import DataLoader as TorchLoader

    from ..loader.dataloader import DataLoader as FastLoader

    label, make = workloads.LOADER_WORKLOADS[name]
    ds, bs = make()
    pw = dict(num_workers=num_workers, persistent_workers=True)
    loaders = {
        "torch_workers": _warm(TorchLoader(ds, batch_size=bs, **pw)),
        "torch_main": _warm(TorchLoader(ds, batch_size=bs)),
        "ring_workers": _warm(FastLoader(ds, batch_size=bs, **pw)),
    }
    per_round: dict[str, list[float]] = {k: [] for k in loaders}
    for _ in range(rounds):
        for k, loader in loaders.items():
            per_round[k].append(_epoch_rate(loader))
    del loaders
    ring = per_round["ring_workers"]
    spread = {"vs torch workers": noise.spread(noise.ratio_rounds(ring, per_round["torch_workers"])),
              "vs torch main": noise.spread(noise.ratio_rounds(ring, per_round["torch_main"]))}
    return {"workload": name, "description": label, "num_workers": num_workers, "rounds": rounds,
            **{k: statistics.median(v) for k, v in per_round.items()},
            "vs_torch_workers": spread["vs torch workers"]["median"],
            "vs_torch_main": spread["vs torch main"]["median"],
            "rounds_per_s": per_round, "spread": spread}


def run_loaders(rounds: int = 3, progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    return _each(workloads.LOADER_WORKLOADS, "loader", progress, lambda n: measure_loaders(n, rounds=rounds))


def format_loader_table(rows: list[dict[str, Any]]) -> str:
    head = (f"| {'workload':<30} | {'torch, 2 workers':>16} | {'torch, main':>11} | {'ring, 2 workers':>15} | "
            f"{'vs torch workers (min-max)':>26} | {'vs torch main (min-max)':>23} | {MARK_HEAD} |")
    lines = [head, table_rule(head)]
    for r in rows:
        s = r["spread"]
        lines.append(f"| {r['description']:<30} | {r['torch_workers']:14.0f}/s | {r['torch_main']:9.0f}/s | "
                     f"{r['ring_workers']:13.0f}/s | {noise.ratio_cell(s['vs torch workers']):>26} | "
                     f"{noise.ratio_cell(s['vs torch main']):>23} | {noise.mark(r):^{len(MARK_HEAD)}} |")
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
    col = lambda runs, i: [x[i] for x in runs]  # noqa: E731 - one figure over rounds
    spread = {"epoch 1": noise.spread(noise.ratio_rounds(col(torch_t, 1), col(ours_t, 1))),
              "epoch 2": noise.spread(noise.ratio_rounds(col(torch_t, 2), col(ours_t, 2))),
              "1st batch": noise.spread(noise.ratio_rounds(col(ours_t, 0), col(torch_t, 0)))}
    return {"description": f"new loader: {batches} x {batch_size} x uint8 3x256x256, {num_workers} workers",
            "num_workers": num_workers,
            "torch_first_s": tf, "torch_epoch_s": te, "ours_first_s": of, "ours_epoch_s": oe,
            "torch_epoch2_s": te2, "ours_epoch2_s": oe2,
            "epoch_speedup": spread["epoch 1"]["median"], "epoch2_speedup": spread["epoch 2"]["median"],
            "first_batch_ratio": spread["1st batch"]["median"], "rounds": rounds,
            "rounds_s": {"torch": [list(x) for x in torch_t], "ours": [list(x) for x in ours_t],
                         "order": ["first batch", "epoch 1", "epoch 2"]},
            "spread": spread}


def format_startup(r: dict[str, Any]) -> str:
    s = r["spread"]
    head = (f"| {'workload':<52} | {'torch first batch / epoch 1 / epoch 2':>37} | "
            f"{'ring first batch / epoch 1 / epoch 2':>36} | {'epoch 1 (min-max)':>18} | {'epoch 2 (min-max)':>18} | "
            f"{'1st batch (min-max)':>19} | {MARK_HEAD} |")
    sep = table_rule(head)
    row = (f"| {r['description']:<52} | {r['torch_first_s'] * 1e3:9.0f} / {r['torch_epoch_s'] * 1e3:9.0f} / "
           f"{r['torch_epoch2_s'] * 1e3:9.0f} ms | {r['ours_first_s'] * 1e3:8.0f} / {r['ours_epoch_s'] * 1e3:9.0f} / "
           f"{r['ours_epoch2_s'] * 1e3:9.0f} ms | {noise.ratio_cell(s['epoch 1']):>18} | "
           f"{noise.ratio_cell(s['epoch 2']):>18} | {noise.ratio_cell(s['1st batch']):>19} | "
           f"{noise.mark(r):^{len(MARK_HEAD)}} |")
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


MARK_HEAD = "noise"  # the last column: noise.MARK where the row cannot be trusted (the reasons follow the table)


def format_table(rows: list[dict[str, Any]]) -> str:
    head = (f"| {'workload':<46} | {'MB':>6} | {'default_collate':>15} | {'fastcollate':>11} | "
            f"{'speedup (min-max)':>17} | {'of memcpy (min-max)':>19} | {MARK_HEAD} |")
    lines = [head, table_rule(head)]
    for r in rows:
        of = (noise.percent_cell(r["spread"]["of memcpy"]) if r["batch_bytes"] >= workloads.MEMCPY_MEANINGFUL_BYTES
              else "—")
        lines.append(
            f"| {r['description']:<46} | {r['batch_bytes'] / 1e6:6.2f} | {r['default_ms']:12.3f} ms | "
            f"{r['fastcollate_ms']:8.3f} ms | {noise.ratio_cell(r['spread']['speedup']):>17} | {of:>19} | "
            f"{noise.mark(r):^{len(MARK_HEAD)}} |"
        )
    return "\n".join(lines)
