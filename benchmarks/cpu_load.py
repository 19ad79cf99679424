"""Run a command beside CPU-heavy jobs: the busy laptop or 2-core CI VM the unit tests must pass on.

    python benchmarks/cpu_load.py -- python -m pytest -q tests/test_trace.py
    python benchmarks/cpu_load.py --procs 4 --repeat 2 -- python -m pytest -q tests/test_monitor_tune.py

Starts ``--procs`` busy-loop processes (default: one per usable core), runs the command
``--repeat`` times beside them, stops them, and exits with the first failing run's status.
A unit test that fails here depends on the machine's speed: test its logic on injected
measurements, and move the speed to a benchmark (benchmarks/README.md).
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import signal
import subprocess
import sys


def _spin(parent: int) -> None:
    x = 0
    while os.getppid() == parent:  # ends with its parent, however that ends
        for _ in range(1_000_000):  # pure Python: one core's worth of load, little memory traffic
            x = (x * 1103515245 + 12345) & 0xFFFFFFFF


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--procs", type=int, default=len(os.sched_getaffinity(0)), help="busy processes")
    ap.add_argument("--repeat", type=int, default=1, help="runs of the command")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = ap.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("no command: put it after --")
    ctx = mp.get_context("spawn")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the load on kill as well
    load = [ctx.Process(target=_spin, args=(os.getpid(),), daemon=True) for _ in range(args.procs)]
    for p in load:
        p.start()
    status = 0
    try:
        for i in range(args.repeat):
            print(f"cpu_load: run {i + 1}/{args.repeat} beside {args.procs} busy processes: {' '.join(command)}",
                  file=sys.stderr, flush=True)
            rc = subprocess.call(command)
            status = status or rc
    finally:
        for p in load:
            p.terminate()
        for p in load:
            p.join()
    return status


if __name__ == "__main__":
    sys.exit(main())
