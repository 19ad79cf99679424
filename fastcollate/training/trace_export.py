"""A trace in the formats people already open: Chrome trace-event JSON (Perfetto,
chrome://tracing), a PNG timeline with the stage breakdown (matplotlib), TensorBoard scalars."""
from __future__ import annotations

import json
import os
from typing import Any

# where each stage is drawn: the process that ran it, and the thread within it
_MAIN_STAGES = ("sampler", "rebuild", "deliver", "wait", "compute")
_WORKER_STAGES = ("fetch", "collate")
_PREFETCH_STAGES = ("transfer",)
GPU_PID = 0  # a pseudo-process for the device stream's lagged CUDA times


def chrome_events(records: list[Any], main_pid: int, t0: float, rank: str | None = None) -> list[dict[str, Any]]:
    """Complete ("X") events, microseconds from the trace's start, one track per worker process,
    the main thread, the prefetch thread and the device stream; args carry the batch id. ``rank``
    (a launcher's rank, in words) prefixes the process names: traces of several ranks opened
    together stay apart."""
    events: list[dict[str, Any]] = []
    names = {(main_pid, 1): "main thread", (main_pid, 2): "prefetch thread", (GPU_PID, 1): "device stream"}

    def add(pid: int, tid: int, name: str, span: tuple[float, float], args: dict[str, Any]) -> None:
        events.append({"name": name, "cat": "fastcollate", "ph": "X", "pid": pid, "tid": tid,
                       "ts": round((span[0] - t0) * 1e6, 3), "dur": round(max(0.0, span[1] - span[0]) * 1e6, 3),
                       "args": args})

    for r in records:
        args = {"epoch": r.epoch, "index": r.index, "worker": r.worker, "pid": r.pid}
        if r.ring:
            args["collate"] = r.ring
        for stage, span in r.spans.items():
            if stage in _WORKER_STAGES:
                pid = r.pid
                names.setdefault((pid, 1), f"worker {r.worker}" if r.worker >= 0 else "main thread")
                add(pid, 1, stage, span, args)
            elif stage in _PREFETCH_STAGES:
                add(main_pid, 2, stage, span, args)
            elif stage == "queue":
                add(main_pid, 3, "in result queue", span, args)
                names[(main_pid, 3)] = "result queue"
            else:
                add(main_pid, 1, stage, span, args)
        fetch = r.spans.get("fetch")
        for name, a, b in (r.parts or {}).get("spans", ()) if fetch else ():
            # nested in the fetch, on its track. Work a collate hook did for the dataset is
            # counted as the fetch's by moving the fetch's end, not its start, so such a part
            # can stick out by the hook's own few microseconds: clipped, or a viewer would not nest it
            extra = {k: v for k, v in r.parts.items() if k != "spans"}
            add(r.pid, 1, name, (max(a, fetch[0]), min(b, fetch[1])), {**args, **extra})
        if r.gpu_ms is not None and "compute" in r.spans:
            add(GPU_PID, 1, "compute (GPU)", (r.spans["compute"][0], r.spans["compute"][0] + r.gpu_ms / 1e3), args)
        if r.h2d_ms is not None and "transfer" in r.spans:
            add(GPU_PID, 2, "H2D copy", (r.spans["transfer"][0], r.spans["transfer"][0] + r.h2d_ms / 1e3), args)
            names[(GPU_PID, 2)] = "copy stream"
    meta = []
    for (pid, tid), name in names.items():
        proc = ("GPU" if pid == GPU_PID else "main process" if pid == main_pid else
                f"worker {name.split()[-1]} (pid {pid})")
        if rank:
            proc = f"{rank}: {proc}"
        meta.append({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": proc}})
        meta.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}})
    return meta + sorted(events, key=lambda e: e["ts"])


def save_chrome(path: str, events: list[dict[str, Any]], report: dict[str, Any]) -> str:
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"fastcollate: cannot write the trace to {path!r}: {directory} does not exist")
    payload = {"traceEvents": events, "displayTimeUnit": "ms",
               "otherData": {"fastcollate": {k: report[k] for k in ("bottleneck", "verdict", "steps", "measured_by")
                                              if k in report}}}
    try:
        with open(path, "w") as f:
            json.dump(payload, f)
    except OSError as exc:
        raise OSError(exc.errno, f"fastcollate: cannot write the trace to {path!r}: {exc.strerror}") from exc
    return path


_COLORS = {"sampler": "#8c564b", "fetch": "#1f77b4", "collate": "#ff7f0e", "queue": "#c7c7c7",
           "rebuild": "#9467bd", "transfer": "#17becf", "deliver": "#bcbd22", "wait": "#d62728",
           "compute": "#2ca02c"}


def plot(path: str, records: list[Any], report: dict[str, Any], main_pid: int, t0: float,
         title: str = "fastcollate trace") -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ImportError("fastcollate: StallMonitor.plot needs matplotlib: pip install 'fastcollate[plot]' "
                          "(or pip install matplotlib)") from exc
    lanes: dict[str, int] = {}

    def lane(name: str) -> int:
        return lanes.setdefault(name, len(lanes))

    bars: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for r in records:
        for stage, (a, b) in r.spans.items():
            if stage in _WORKER_STAGES:
                name = f"worker {r.worker} (pid {r.pid})" if r.worker >= 0 else "main: loading"
            elif stage in _PREFETCH_STAGES:
                name = "prefetch thread"
            elif stage == "queue":
                continue
            else:
                name = "main thread"
            bars.setdefault((lane(name), stage), []).append((1e3 * (a - t0), max(1e-3, 1e3 * (b - a))))
    fig, (ax, bx) = plt.subplots(2, 1, figsize=(11, 2.2 + 0.45 * max(1, len(lanes)) + 2.6),
                                 gridspec_kw={"height_ratios": [max(1, len(lanes)), 3]})
    for (y, stage), spans in bars.items():
        ax.broken_barh(spans, (y - 0.4, 0.8), facecolors=_COLORS.get(stage, "#7f7f7f"), label=stage)
    ax.set_yticks(range(len(lanes)), list(lanes))
    ax.invert_yaxis()
    ax.set_xlabel("ms since the trace began")
    handles, labels = ax.get_legend_handles_labels()
    uniq = dict(zip(labels, handles))
    ax.legend(uniq.values(), uniq.keys(), loc="upper right", ncol=min(5, len(uniq)), fontsize=8)
    ax.set_title(f"{title}: bottleneck {report.get('bottleneck')}")
    stages = report.get("stages", {})
    names = [s for s in _COLORS if s in stages]
    bx.barh(names, [stages[s]["p50_ms"] for s in names], color=[_COLORS[s] for s in names], label="p50")
    bx.barh(names, [stages[s]["p95_ms"] - stages[s]["p50_ms"] for s in names],
            left=[stages[s]["p50_ms"] for s in names], color="none", edgecolor="black", label="p95")
    bx.invert_yaxis()
    bx.set_xlabel("ms per batch (bar: p50; outline to p95)")
    fig.tight_layout()
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        plt.close(fig)
        raise FileNotFoundError(f"fastcollate: cannot write the plot to {path!r}: {directory} does not exist")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def tensorboard(writer: Any, step: int, report: dict[str, Any], prefix: str = "fastcollate") -> None:
    writer.add_scalar(f"{prefix}/data_wait_fraction", report["data_wait_fraction"], step)
    writer.add_scalar(f"{prefix}/gpu_idle_fraction", report["gpu_idle_fraction"], step)
    for stage, st in report.get("stages", {}).items():
        writer.add_scalar(f"{prefix}/{stage}_p50_ms", st["p50_ms"], step)
        writer.add_scalar(f"{prefix}/{stage}_p95_ms", st["p95_ms"], step)
    for w in report.get("workers", []):
        writer.add_scalar(f"{prefix}/worker_{w['id']}_busy", w["busy_fraction"], step)
    q = report.get("queue", {})
    if q.get("steps"):
        writer.add_scalar(f"{prefix}/queue_mean_ready", q["mean_ready"], step)
