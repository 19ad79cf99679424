"""The machine's load while something is measured: the load average, and the cores that other
processes kept busy -- read from the kernel's counters (/proc/stat against this process's own CPU
time), so that a measurement taken on a busy machine says so, and a plan counts only the cores
left to it."""
from __future__ import annotations

import os
import time


def load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # pragma: no cover - not Unix
        return None


def busy_seconds() -> float | None:
    """Seconds all CPUs have spent busy since boot (None where the kernel does not say): read at
    two moments, the difference less a process's own CPU time is what the others kept busy."""
    ticks = _busy_ticks()
    return None if ticks is None else ticks / os.sysconf("SC_CLK_TCK")


def _busy_ticks() -> int | None:
    """Ticks all CPUs spent busy since boot (user, nice, system, irq, softirq, steal)."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:  # pragma: no cover - not Linux
        return None
    v = [int(x) for x in fields[1:]]
    return v[0] + v[1] + v[2] + v[5] + v[6] + (v[7] if len(v) > 7 else 0)


def others_busy(window_s: float = 0.25) -> float | None:
    """Cores kept busy by other processes over the next ``window_s`` seconds (this process should
    be idle meanwhile: it sleeps; its own CPU time is taken out anyway). None where unknown."""
    b0, c0, t0 = _busy_ticks(), os.times(), time.monotonic()
    if b0 is None:
        return None
    time.sleep(window_s)
    b1, c1, t1 = _busy_ticks(), os.times(), time.monotonic()
    hz = os.sysconf("SC_CLK_TCK")
    ours = (c1.user - c0.user) + (c1.system - c0.system)
    return max(0.0, ((b1 - b0) / hz - ours) / max(1e-6, t1 - t0))


__all__ = ["load_average", "others_busy", "busy_seconds"]
