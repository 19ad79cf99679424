"""StallMonitor: where a training loop's time goes -- waiting for data, copying it, computing --
and what to change. Host times from perf_counter; GPU compute from CUDA events read lagged
(query(), never a sync); H2D times from an attached CudaPrefetcher."""
from __future__ import annotations

import contextlib
import time
from typing import Any, Iterable, Iterator

import torch

DATA_BOUND_FRACTION = 0.15  # waiting more than this share of the wall time is a data stall


class StallMonitor:
    """Measure a loop; ``report()`` says data-bound, copy-bound or compute-bound, with numbers.

    >>> import time, fastcollate
    >>> mon = fastcollate.StallMonitor()
    >>> for batch in mon.wrap(range(3)):
    ...     with mon.compute():
    ...         pass
    >>> mon.report()["steps"]
    3
    """

    def __init__(self, prefetcher: Any = None) -> None:
        self.prefetcher = prefetcher
        self.reset()

    def reset(self) -> None:
        self.steps = 0
        self.wait_s = 0.0
        self.host_compute_s = 0.0
        self.gpu_compute_s = 0.0
        self._pending: list = []
        self._t0: float | None = None
        self._wall = 0.0
        self._h2d0 = self._h2d_ms() if self.prefetcher is not None else 0.0

    def attach(self, prefetcher: Any) -> "StallMonitor":
        """Take H2D copy times from a CudaPrefetcher."""
        self.prefetcher = prefetcher
        self._h2d0 = self._h2d_ms()
        return self

    # -- feeding it
    def start(self) -> None:
        if self._t0 is None:
            self._t0 = time.perf_counter()

    def stop(self) -> None:
        if self._t0 is not None:
            self._wall += time.perf_counter() - self._t0
            self._t0 = None

    def record_wait(self, seconds: float) -> None:
        self.wait_s += seconds

    def record_compute(self, seconds: float, events: tuple | None = None) -> None:
        self.steps += 1
        self.host_compute_s += seconds
        if events is not None:
            self._pending.append(events)
            if len(self._pending) > 8:
                self._drain()

    def wrap(self, loader: Iterable) -> Iterator[Any]:
        """Iterate loader, timing each wait for the next batch."""
        self.start()
        it = iter(loader)
        while True:
            t0 = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                self.stop()
                return
            self.record_wait(time.perf_counter() - t0)
            yield batch

    @contextlib.contextmanager
    def compute(self) -> Iterator[None]:
        """Time one step's compute (CUDA events when CUDA is initialized)."""
        ev = None
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            ev = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            ev[0].record()
        t0 = time.perf_counter()
        try:
            yield
        finally:
            if ev is not None:
                ev[1].record()
            self.record_compute(time.perf_counter() - t0, ev)

    # -- reading it
    def _drain(self) -> None:
        keep = []
        for a, b in self._pending:
            if b.query():
                self.gpu_compute_s += a.elapsed_time(b) / 1e3
            else:
                keep.append((a, b))
        self._pending = keep

    def _h2d_ms(self) -> float:
        return float(self.prefetcher.stats().get("h2d_ms", 0.0)) if self.prefetcher is not None else 0.0

    def report(self, distributed: bool = False) -> dict[str, Any]:
        """Numbers, a verdict and next steps. ``distributed=True`` (under torch.distributed):
        every rank's data wait, gathered with one collective, and the slowest rank."""
        self._drain()
        wall = self._wall + (time.perf_counter() - self._t0 if self._t0 is not None else 0.0)
        gpu = self.gpu_compute_s
        compute = gpu if gpu > 0 else self.host_compute_s
        h2d = max(0.0, self._h2d_ms() - self._h2d0) / 1e3
        wait_frac = self.wait_s / wall if wall > 0 else 0.0
        h2d_frac = h2d / wall if wall > 0 else 0.0
        busy = compute / wall if wall > 0 else 0.0
        if wait_frac >= DATA_BOUND_FRACTION and h2d > 0.5 * self.wait_s:
            verdict = "copy-bound"
        elif wait_frac >= DATA_BOUND_FRACTION:
            verdict = "data-bound"
        else:
            verdict = "compute-bound"
        out: dict[str, Any] = {
            "verdict": verdict,
            "steps": self.steps,
            "wall_s": wall,
            "data_wait_s": self.wait_s,
            "data_wait_fraction": wait_frac,
            "h2d_s": h2d,
            "h2d_fraction": h2d_frac,
            "compute_s": compute,
            "compute_source": "cuda events" if gpu > 0 else "host clock",
            "gpu_idle_fraction": max(0.0, 1.0 - busy),
            "pending_events": len(self._pending),
            "advice": ADVICE[verdict],
        }
        if distributed:
            out.update(_gather_ranks(self.wait_s, wall))
        return out

    def summary(self, distributed: bool = False) -> str:
        """report() as text (with distributed=True a collective: call it on every rank)."""
        return self.format(self.report(distributed))

    @staticmethod
    def format(r: dict[str, Any]) -> str:
        """A report() dict as text."""
        lines = [f"{r['verdict']}: {r['steps']} steps in {r['wall_s']:.2f}s; waiting for data "
                 f"{100 * r['data_wait_fraction']:.0f}%, H2D {100 * r['h2d_fraction']:.0f}%, compute "
                 f"{r['compute_s']:.2f}s ({r['compute_source']}), device idle {100 * r['gpu_idle_fraction']:.0f}%"]
        if "slowest_rank" in r:
            lines.append(f"slowest rank {r['slowest_rank']} waited {r['rank_wait_s'][r['slowest_rank']]:.2f}s; it costs "
                         f"every rank about {r['straggler_cost_s']:.2f}s")
        lines += [f"  - {a}" for a in r["advice"]]
        return "\n".join(lines)


ADVICE = {
    "data-bound": [
        "raise DataLoader num_workers (fastcollate tune finds the best setting by measurement)",
        "use collate_fn=fastcollate.collate: one arena per batch, no per-leaf Python cost",
        "raise prefetch_factor and set persistent_workers=True so workers never idle between epochs",
        "move decoding/augmentation work to the GPU (fastcollate.transforms) or cache decoded samples",
    ],
    "copy-bound": [
        "feed the loop through fastcollate.CudaPrefetcher: one pinned copy per batch on a side stream",
        "ship uint8 and normalize on the GPU (transforms.Normalize): 4x fewer bytes than float32",
        "raise the prefetcher depth so copies overlap more compute",
    ],
    "compute-bound": [
        "the data pipeline keeps up; speed comes from the model side now",
        "try a bigger batch, bfloat16 autocast, channels_last, torch.compile",
    ],
}


def _gather_ranks(wait_s: float, wall_s: float) -> dict[str, Any]:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return {}
    backend = dist.get_backend()
    device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
    mine = torch.tensor([wait_s, wall_s], dtype=torch.float64, device=device)
    every = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)  # the one collective of the report
    waits = [float(t[0]) for t in every]
    slowest = max(range(len(waits)), key=waits.__getitem__)
    return {"rank_wait_s": waits, "slowest_rank": slowest,
            "straggler_cost_s": waits[slowest] - min(waits)}
