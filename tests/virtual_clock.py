"""A clock that moves only when a test says so, for the logic that reads clocks (StallMonitor's
verdicts, the trace's diagnosis, tune_loader's budget, measure's repeated runs): a test that
decides "data-bound" from real sleeps against real compute fails on a busy machine, one that
decides it from injected seconds cannot.

    clock = VirtualClock()
    clock.install(monkeypatch, monitor, loop)   # their time.perf_counter / monotonic read it
    clock.sleep(0.003)                          # 3 ms pass, at once

Modules that bind ``now = time.perf_counter`` at import (fastcollate.core.trace) are patched by
``install_now``. Only the main process's clock moves: use it where the measured work runs in
the main process (no DataLoader workers)."""
from __future__ import annotations

import time
from typing import Any


class VirtualClock:
    def __init__(self, start: float = 1000.0) -> None:
        self.t = start

    def __call__(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds

    def install(self, monkeypatch: Any, *modules: Any) -> "VirtualClock":
        """Each module's ``time`` becomes the real one but for perf_counter, monotonic and sleep."""
        for module in modules:
            monkeypatch.setattr(module, "time", _Time(self))
        return self

    def install_now(self, monkeypatch: Any, module: Any) -> "VirtualClock":
        monkeypatch.setattr(module, "now", self)
        return self


class _Time:
    def __init__(self, clock: VirtualClock) -> None:
        self.perf_counter = self.monotonic = clock
        self.sleep = clock.sleep

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)
