"""StallMonitor: where a training loop's time goes -- waiting for data, copying it, computing --
and, with ``trace=True``, which stage of the data pipeline the loop waits for: the per-batch
trace across worker processes (fastcollate.core.trace), metrics per stage and worker, a diagnosis
that names the stage (training/diagnosis.py), and pictures (training/trace_export.py). Host
times from perf_counter; GPU compute from CUDA events read lagged (query(), never a sync); H2D
times from an attached CudaPrefetcher."""
from __future__ import annotations

import contextlib
import os
import time
import weakref
from typing import Any, Iterable, Iterator

import torch

from ..core import trace as _trace
from ..tuning import node
from . import trace_export
from ..doctor import diagnosis
from ..doctor.diagnosis import DATA_BOUND_FRACTION

class StallMonitor:
    """Measure a loop; ``report()`` says data-bound, copy-bound or compute-bound, with numbers,
    and -- with ``trace=True`` -- names the stage: ``report()["bottleneck"]``.

    Args:
        prefetcher: a CudaPrefetcher to take H2D copy times from (or ``attach()`` it later).
        trace: record every batch's stages (sampler, fetch, collate, queue, rebuild, transfer,
            wait, compute) across DataLoader worker processes; off by default (then nothing of
            torch's is wrapped and nothing is paid).
        trace_capacity: how many recent batches the trace keeps (aggregates cover all batches).
        log_every: with tracing, one INFO line on the ``fastcollate`` logger every N batches.

    >>> import time, fastcollate
    >>> mon = fastcollate.StallMonitor()
    >>> for batch in mon.wrap(range(3)):
    ...     with mon.compute():
    ...         pass
    >>> mon.report()["steps"]
    3
    """

    def __init__(self, prefetcher: Any = None, *, trace: bool = False, trace_capacity: int = 4096,
                 log_every: int = 0) -> None:
        self.prefetcher = prefetcher
        self.trace = trace
        self._batch_info: dict[str, Any] | None = None  # of the first batch wrap() saw (for advice)
        # its own view of the trace (another monitor's reset() or creation leaves it alone);
        # tracing stays on while a tracing monitor lives (or until close()): then torch's classes are unwrapped
        self.tracer = _trace.acquire(trace_capacity, log_every) if trace else None
        self._release = weakref.finalize(self, _trace.release, self.tracer) if trace else None
        self._loader: Any = None
        self.reset()

    def close(self) -> None:
        """Stop tracing (when no other tracing monitor is alive); what was recorded stays readable."""
        if self._release is not None:
            self._release()

    def reset(self) -> None:
        self.steps = 0
        self.wait_s = 0.0
        self.host_compute_s = 0.0
        self.gpu_compute_s = 0.0
        self._pending: list = []
        self._t0: float | None = None
        self._wall = 0.0
        self._current: Any = None
        self._h2d0 = self._h2d_ms() if self.prefetcher is not None else 0.0
        if self.tracer is not None:
            self.tracer.reset()

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

    def record_wait(self, seconds: float, batch_id: Any = None) -> None:
        self.wait_s += seconds
        self._current = batch_id
        if self.tracer is not None and batch_id is not None:
            end = time.perf_counter()
            self.tracer.span(self.tracer.record(*batch_id), "wait", end - seconds, end)

    def record_compute(self, seconds: float, events: tuple | None = None, batch_id: Any = None) -> None:
        self.steps += 1
        self.host_compute_s += seconds
        batch_id = batch_id if batch_id is not None else self._current
        if self.tracer is not None and batch_id is not None:
            end = time.perf_counter()
            self.tracer.span(self.tracer.record(*batch_id), "compute", end - seconds, end)
        if events is not None:
            self._pending.append((*events, batch_id))
            if len(self._pending) > 8:
                self._drain()

    def wrap(self, loader: Iterable) -> Iterator[Any]:
        """Iterate loader, timing each wait for the next batch."""
        self._loader = weakref.ref(loader) if _weakrefable(loader) else None
        self.start()
        it = iter(loader)
        while True:
            t0 = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                self.stop()
                return
            self.record_wait(time.perf_counter() - t0, _trace.last_id() if self.tracer is not None else None)
            if self._batch_info is None:
                self._batch_info = batch_info(batch)
            yield batch

    @contextlib.contextmanager
    def compute(self) -> Iterator[None]:
        """Time one step's compute (CUDA events when CUDA is initialized; an NVTX range when tracing)."""
        ev = None
        cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        if cuda:
            ev = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            ev[0].record()
        nvtx = cuda and self.tracer is not None and _nvtx_push(f"compute {self._current}")
        t0 = time.perf_counter()
        try:
            yield
        finally:
            if ev is not None:
                ev[1].record()
            if nvtx:
                torch.cuda.nvtx.range_pop()
            self.record_compute(time.perf_counter() - t0, ev)

    # -- reading it
    def _drain(self) -> None:
        keep = []
        for a, b, batch_id in self._pending:
            if b.query():
                ms = a.elapsed_time(b)
                self.gpu_compute_s += ms / 1e3
                if self.tracer is not None and batch_id is not None:
                    self.tracer.record(*batch_id).gpu_ms = ms
            else:
                keep.append((a, b, batch_id))
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
            "advice": _advice(verdict, self._loader, self._batch_info),
        }
        if self.tracer is not None:
            found = diagnosis.diagnose(self.tracer, wall, self.wait_s, compute, self._batch_info)
            out.update(bottleneck=found["bottleneck"], stages=found["stages"], workers=found["workers"],
                       queue=found["queue"], findings=found["advice"], errors=dict(self.tracer.errors),
                       batches_traced=len(self.tracer.records), fetch_parts=_fetch_parts(self.tracer))
            if found["bottleneck"] is not None:
                # the trace's advice is computed from the numbers; a fixed hint beside it could
                # contradict it (it once said "raise num_workers" after "every core already runs a worker")
                out["advice"] = found["advice"]
        else:
            out.update(bottleneck=_untraced_bottleneck(verdict), stages={}, workers=[], queue={}, findings=[],
                       errors={})
        out["ring"] = _ring_stats(self._loader)
        label = node.rank_label()
        if label is not None:  # under a launcher every rank writes a report: which one this is
            out["measured_by"] = label
        if distributed:
            out.update(_gather_ranks(self.wait_s, wall))
        return out

    # -- pictures
    def _traced(self) -> Any:
        if self.tracer is None:
            raise RuntimeError("fastcollate: this StallMonitor does not trace; make it with StallMonitor(trace=True)")
        return self.tracer

    def save_trace(self, path: str) -> str:
        """Chrome trace-event JSON (open it in https://ui.perfetto.dev or chrome://tracing): a track
        per worker process, the main thread, the prefetch thread and the device stream."""
        tracer = self._traced()
        events = trace_export.chrome_events(list(tracer.records.values()), os.getpid(), tracer.t0,
                                            node.rank_label())
        return trace_export.save_chrome(path, events, self.report())

    def plot(self, path: str, title: str = "fastcollate trace") -> str:
        """A PNG: the timeline of the recent batches, and p50/p95 per stage (needs matplotlib)."""
        tracer = self._traced()
        return trace_export.plot(path, list(tracer.records.values()), self.report(), os.getpid(), tracer.t0, title)

    def to_tensorboard(self, writer: Any, step: int) -> None:
        """Scalars per stage, worker and queue on a ``torch.utils.tensorboard.SummaryWriter``."""
        trace_export.tensorboard(writer, step, self.report())

    def summary(self, distributed: bool = False) -> str:
        """report() as text (with distributed=True a collective: call it on every rank)."""
        return self.format(self.report(distributed))

    @staticmethod
    def format(r: dict[str, Any]) -> str:
        """A report() dict as text."""
        lines = [("" if not r.get("measured_by") else f"{r['measured_by']}: ") +
                 f"{r['verdict']}: {r['steps']} steps in {r['wall_s']:.2f}s; waiting for data "
                 f"{100 * r['data_wait_fraction']:.0f}%, H2D {100 * r['h2d_fraction']:.0f}%, compute "
                 f"{r['compute_s']:.2f}s ({r['compute_source']}), device idle {100 * r['gpu_idle_fraction']:.0f}%"]
        if r.get("bottleneck"):
            lines.append(f"bottleneck: {r['bottleneck']}")
        if r.get("stages"):
            lines.append(format_stages(r["stages"]))
        for w in r.get("workers", []):
            lines.append(f"  worker {w['id']} (pid {w['pid']}): {w['batches']} batches, busy {w['busy_fraction']:.0%}, "
                         f"{w['mean_batch_ms']:.2f} ms a batch")
        q = r.get("queue") or {}
        if q.get("steps"):
            lines.append(f"  ready batches when the step asked: mean {q['mean_ready']:.1f}, min {q['min_ready']}, "
                         f"max {q['max_ready']} ({q['ready_fraction']:.0%} of steps found one ready)")
        if r.get("errors"):
            lines.append("  errors: " + ", ".join(f"{k} {v}" for k, v in r["errors"].items()))
        fp = r.get("fetch_parts") or {}
        if fp.get("batches"):
            line = "  inside the fetch, a batch: " + ", ".join(f"{k} {v:.2f} ms" for k, v in fp["wall_ms"].items())
            if "decode_cpu_ms" in fp:
                line += (f" (the engine's CPU over its threads: decode {fp['decode_cpu_ms']:.2f} ms, resize "
                         f"{fp['resize_cpu_ms']:.2f} ms)")
            if "images" in fp:
                line += f"; {fp['fallbacks']} of {fp['images']} images decoded by Pillow"
            lines.append(line)
        ring = r.get("ring") or {}
        if ring.get("ring"):
            lines.append(f"  ring: {ring.get('ring_hits', 0)} hits, {ring.get('ring_full', 0)} full, "
                         f"{ring.get('ring_oversize', 0)} oversize")
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


def format_stages(stages: dict[str, dict[str, float]]) -> str:
    head = "  stage        p50 ms     p95 ms     max ms    total s   batches"
    rows = [head] + [f"  {name:<10} {st['p50_ms']:>8.2f} {st['p95_ms']:>10.2f} {st['max_ms']:>10.2f} "
                     f"{st['total_s']:>10.3f} {st['count']:>9}" for name, st in stages.items()]
    return "\n".join(rows)


def _advice(verdict: str, loader_ref: Any, batch_info: dict[str, Any] | None) -> list[str]:
    """The untraced verdict's next steps, without what the loop already does: fastcollate's
    collate or loader, workers on every core, persistent workers, a prefetcher, uint8 batches."""
    from ..core.collator import Collator, collate as fast_collate

    loader = loader_ref() if loader_ref is not None else None
    inner = getattr(loader, "loader", loader)  # through a CudaPrefetcher
    collate = getattr(inner, "collate_fn", None)
    collate = getattr(collate, "inner", collate)  # a RingCollator
    ours = collate is fast_collate or isinstance(collate, Collator)
    workers = getattr(inner, "num_workers", None)
    out = []
    for line in ADVICE[verdict]:
        if "fastcollate.collate" in line and ours:
            continue
        if line.startswith("raise DataLoader num_workers") and workers is not None and workers >= node.share().cores:
            continue
        if "persistent_workers" in line and getattr(inner, "persistent_workers", False):
            continue
        if "CudaPrefetcher" in line and inner is not loader:
            continue
        if "ship uint8" in line and batch_info is not None and not batch_info.get("float_images"):
            continue
        out.append(line)
    return out


def batch_info(batch: Any) -> dict[str, Any]:
    """What advice needs to know of a batch: whether it carries float images (>= 3-D floating tensors)."""
    from ..core.tree import iter_tensors

    floats = False
    try:
        for t in iter_tensors(batch):
            if t.dim() >= 3 and t.is_floating_point():
                floats = True
                break
    except Exception:
        pass
    return {"float_images": floats}


def _untraced_bottleneck(verdict: str) -> str | None:
    # without the trace only the consumer's side is known: which data stage cannot be said
    return {"compute-bound": "compute", "copy-bound": "transfer"}.get(verdict)


def _weakrefable(obj: Any) -> bool:
    try:
        weakref.ref(obj)
        return True
    except TypeError:
        return False


def _fetch_parts(tracer: Any) -> dict[str, Any]:
    """The stages a dataset reported inside its fetches (fastcollate.images: reading the files,
    decode + resize), per batch that reported them: wall ms by stage, the engine's CPU ms, and
    the images and fallbacks counted."""
    with tracer.lock:
        parts = dict(tracer.parts)
    n = parts.pop("batches", 0)
    if not n:
        return {}
    out: dict[str, Any] = {"batches": n, "wall_ms": {}}
    for key, value in parts.items():
        if key.endswith("_cpu_s"):
            out[key[:-2] + "_ms"] = 1e3 * value / n
        elif key.endswith("_s"):
            out["wall_ms"][key[:-2]] = 1e3 * value / n
        else:
            out[key] = int(value)
    return out


def _ring_stats(ref: Any) -> dict[str, Any]:
    loader = ref() if ref is not None else None
    loader = getattr(loader, "loader", loader)  # through a CudaPrefetcher
    stats = getattr(loader, "stats", None)
    if stats is None:
        return {}
    try:
        out = stats()
    except Exception:  # a loader's own stats() that needs arguments, or fails: not ours to report
        return {}
    if out.get("ring") and (out.get("ring_hits", 0) + out.get("ring_full", 0) + out.get("ring_oversize", 0)):
        total = out.get("ring_hits", 0) + out.get("ring_full", 0) + out.get("ring_oversize", 0)
        out["ring_fallback_rate"] = (out.get("ring_full", 0) + out.get("ring_oversize", 0)) / total
    return out


def _nvtx_push(name: str) -> bool:
    try:
        torch.cuda.nvtx.range_push(name)
        return True
    except Exception:  # a CPU build of torch has no NVTX
        return False


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
    return {"rank_wait_s": waits, "slowest_rank": slowest, "rank": dist.get_rank(),
            "straggler_cost_s": waits[slowest] - min(waits)}
