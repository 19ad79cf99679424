"""pytest-benchmark suite: what StallMonitor costs a training loop per step -- 2000 empty steps,
bare and through ``mon.wrap()`` + ``mon.compute()``, side by side in one run. The target: under
100 us a step (against steps of milliseconds, well under 1%); ``per_step_us`` in each row's
extra info. Until #33 this was an assertion in tests/test_monitor_tune.py, which a busy machine
failed; the unit test now counts the steps on a virtual clock.

    pytest benchmarks/bench_monitor.py --benchmark-only --benchmark-group-by=group
"""
import contextlib

import pytest

import fastcollate

STEPS = 2000


def bare() -> None:
    for _ in range(STEPS):
        with contextlib.nullcontext():
            pass


def monitored() -> None:
    mon = fastcollate.StallMonitor()
    for _ in mon.wrap(range(STEPS)):
        with mon.compute():
            pass


@pytest.mark.parametrize("loop", [bare, monitored], ids=["bare loop", "StallMonitor"])
def test_stall_monitor_per_step(benchmark, loop):
    benchmark.group = f"{STEPS} empty loop steps"
    benchmark(loop)
    if benchmark.stats is not None:  # None under --benchmark-disable (a plain run of the loop)
        benchmark.extra_info["per_step_us"] = 1e6 * benchmark.stats.stats.median / STEPS
