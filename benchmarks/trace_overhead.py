"""What tracing costs: the same loader epoch with StallMonitor(trace=False) and (trace=True),
interleaved, medians of the rounds, on the small-batch workload where a per-batch cost shows
most (1024 x 17-field samples, 12 batches an epoch, 2 workers, persistent).

    python benchmarks/trace_overhead.py [--rounds 9] [--workers 2]
"""
from __future__ import annotations

import argparse
import statistics
import time

import fastcollate
from fastcollate._bench.workloads import LOADER_WORKLOADS


def epoch_seconds(loader, trace: bool) -> float:
    mon = fastcollate.StallMonitor(trace=trace)
    try:
        t0 = time.perf_counter()
        for _ in mon.wrap(loader):
            with mon.compute():
                pass
        return time.perf_counter() - t0
    finally:
        mon.close()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--workload", default="loader_fields", choices=sorted(LOADER_WORKLOADS))
    args = p.parse_args()
    ds, batch = LOADER_WORKLOADS[args.workload][1]()
    # one persistent loader per mode, its workers started in that mode (a worker's side of the
    # trace is installed when it starts: forked while tracing is on, or not)
    loaders = {}
    for trace in (False, True):
        loaders[trace] = fastcollate.DataLoader(ds, batch_size=batch, num_workers=args.workers,
                                                persistent_workers=args.workers > 0)
        mon = fastcollate.StallMonitor(trace=trace)
        for _ in mon.wrap(loaders[trace]):  # warm: workers started, ring slots faulted
            pass
        if trace:
            assert mon.report()["stages"]["fetch"]["count"] > 0, "the traced workers recorded nothing"
        mon.close()
    off, on = [], []
    for r in range(args.rounds):
        for trace in ((False, True) if r % 2 == 0 else (True, False)):
            (on if trace else off).append(epoch_seconds(loaders[trace], trace))
        print(f"round {r + 1}/{args.rounds}: off {1e3 * off[-1]:.1f} ms, on {1e3 * on[-1]:.1f} ms", flush=True)
    a, b = statistics.median(off), statistics.median(on)
    print(f"{LOADER_WORKLOADS[args.workload][0]}, {args.workers} workers, {len(ds) // batch} batches an epoch: "
          f"trace off {1e3 * a:.1f} ms, on {1e3 * b:.1f} ms an epoch (medians of {args.rounds}): "
          f"{100 * (b / a - 1):+.1f}%")


if __name__ == "__main__":
    main()
