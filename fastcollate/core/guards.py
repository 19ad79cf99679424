"""Host memory that an asynchronous copy may still read: the bounded wait for a copy's fence,
and the hand-over by which the device path lets the loader's ring decide when such memory is
free again (the ring registers it; the device path never imports the loader)."""
from __future__ import annotations

import time
from typing import Any, Callable

WAIT_TIMEOUT_S = 60.0  # the bound of every wait for a fence (close, garbage collection)
LEAKED: list[Any] = []  # what a timed-out wait could not let go of safely: kept for the process's life
_handover: Callable[[list, Any], bool] | None = None


def wait_for(fence: Any, what: str, timeout: float | None = None) -> None:
    """Poll ``fence.query()`` until it completes, at most ``timeout`` seconds (WAIT_TIMEOUT_S by
    default); TimeoutError naming ``what`` after that. Never ``synchronize()``: a GPU that hangs,
    or a stream that never gets there, must not hang the process with it."""
    if fence.query():
        return
    limit = WAIT_TIMEOUT_S if timeout is None else timeout
    deadline = time.monotonic() + limit
    pause = 50e-6
    while not fence.query():
        if time.monotonic() > deadline:
            raise TimeoutError(f"fastcollate: {what} did not complete within {limit:.0f} s")
        time.sleep(pause)
        pause = min(pause * 2, 5e-3)


def set_handover(fn: Callable[[list, Any], bool]) -> None:
    global _handover
    _handover = fn


def hand_over(box: list, ready: Any) -> bool:
    """Let the registered owner of the memory under ``box[0]`` free it once ``ready`` has
    completed (emptying ``box``); False, ``box`` untouched, when it is not such memory."""
    return _handover(box, ready) if _handover is not None else False
