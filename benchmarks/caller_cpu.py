"""A threaded copy whose helper thread finds itself on the caller's CPU: the helper must neither
poll nor take a task there (each would wait for the other to be scheduled), so the copy takes
about a single-threaded copy's time. Every thread of the process is pinned to one CPU; a 4 MB
copy_bytes with 2 threads and with 1 thread, interleaved, medians over rounds, the ratio printed
(target: under 1.1x; before the pool's fix it was 338 us against 241, 1.4x).

Until #33 this was a 20 s bound on 200 such copies in tests/test_arena.py, which a busy machine
came within 2x of (6-10 s beside 4 busy processes on 2 cores); the unit test now checks the
copies are exact and that none hangs.

    python benchmarks/caller_cpu.py [--rounds 9] [--copies 200]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from fastcollate import _ext


def pinned_to_one_cpu():
    """Every thread of this process on its lowest CPU; returns the masks to restore."""
    tids = [int(t) for t in os.listdir("/proc/self/task")]
    before = {t: os.sched_getaffinity(t) for t in tids}
    cpu = min(os.sched_getaffinity(0))
    for t in tids:
        os.sched_setaffinity(t, {cpu})
    return before


def restore(before) -> None:
    for t, mask in before.items():
        try:
            os.sched_setaffinity(t, mask)
        except OSError:  # a thread that ended meanwhile
            pass


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--copies", type=int, default=200)
    args = p.parse_args()
    if len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("caller_cpu: needs two CPUs (the helper thread must exist)")
    src = torch.randint(0, 255, (4 << 20,), dtype=torch.uint8)
    dst = torch.zeros_like(src)
    _ext._C.copy_bytes(dst, src, 2, 1 << 20)  # the pool's helper exists from here on
    us = {1: [], 2: []}
    before = pinned_to_one_cpu()
    try:
        for r in range(args.rounds):
            for threads in ((1, 2) if r % 2 == 0 else (2, 1)):
                t0 = time.perf_counter()
                for _ in range(args.copies):
                    _ext._C.copy_bytes(dst, src, threads, 1 << 18)
                us[threads].append(1e6 * (time.perf_counter() - t0) / args.copies)
    finally:
        restore(before)
    ratios = [b / a for a, b in zip(us[1], us[2])]
    print(f"4 MB copy, every thread on one CPU, {args.rounds} rounds of {args.copies}: "
          f"1 thread {statistics.median(us[1]):.0f} us, 2 threads {statistics.median(us[2]):.0f} us; "
          f"2 threads / 1 thread {statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}; target < 1.1x)")


if __name__ == "__main__":
    main()
