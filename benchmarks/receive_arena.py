"""How the main process should take a worker's arena that arrives as a file descriptor (a ring
fallback, fastcollate.loader.wire): read it into its own pooled memory (one copy in the kernel,
no mapping, no page faults on warm pooled memory) or map it (no copy, one mapping and a fault per
page as it is read, an munmap when the batch dies). Both are timed side by side, interleaved,
through the whole life of a batch: receive, read every byte once (a consumer's first touch),
drop. The smallest size where mapping wins is where FASTCOLLATE_MAP_BYTES belongs.

    python benchmarks/receive_arena.py [--rounds 7]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from fastcollate import _ext

SIZES = [16 << 10, 64 << 10, 256 << 10, 1 << 20, 2 << 20, 4 << 20, 16 << 20]


def segment(nbytes: int) -> int:
    fd = os.memfd_create("bench", os.MFD_CLOEXEC)
    os.ftruncate(fd, nbytes)
    os.pwrite(fd, os.urandom(4096) * (nbytes // 4096), 0)  # pages present, as a worker leaves them
    return fd


def life(fd: int, nbytes: int, how: str) -> float:
    t0 = time.perf_counter()
    if how == "read":
        arena = _ext._C.pool_allocate(nbytes)
        _ext._C.read_fd(fd, nbytes, arena)
    else:
        arena = _ext._C.map_fd(fd, nbytes)
    arena.view(torch.int64).sum()  # the consumer reads every byte once
    del arena
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=200, help="batches per timing")
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"{'bytes':>10} {'read (us)':>10} {'map (us)':>10} {'map/read':>9}   spread of the ratio")
    for nbytes in SIZES:
        fd = segment(nbytes)
        ratios, reads, maps = [], [], []
        calls = max(10, args.calls * (64 << 10) // max(nbytes, 64 << 10))
        for _ in range(args.rounds):
            r = statistics.median(life(fd, nbytes, "read") for _ in range(calls))
            m = statistics.median(life(fd, nbytes, "map") for _ in range(calls))
            reads.append(r)
            maps.append(m)
            ratios.append(m / r)
        os.close(fd)
        print(f"{nbytes:>10} {1e6 * statistics.median(reads):>10.1f} {1e6 * statistics.median(maps):>10.1f} "
              f"{statistics.median(ratios):>9.2f}   {min(ratios):.2f}-{max(ratios):.2f}")
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
