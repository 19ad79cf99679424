"""Which stream a ring slot waits for before it is reused.

A page-locked ring slot (``fastcollate.DataLoader(..., pin_memory=True)`` with workers) is
fenced when the last view of its batch dies, on the stream that is current on the thread where
that happens. Copies issued on any other stream need ``release_after``; the prefetcher, which
copies on its own side stream, hands its event over with ``hold_until``.
"""
from __future__ import annotations

from typing import Any

from ..core import guards
from .ring import fenced_slots


def release_after(batch: Any, stream: Any = None) -> int:
    """Make the ring slots under ``batch`` also wait for the work queued so far on ``stream``.

    The rule: a page-locked ring slot is fenced on the stream that is current on the thread where
    the batch's last view dies. A copy out of the batch issued on another stream -- ``x.to("cuda",
    non_blocking=True)`` inside ``with torch.cuda.stream(s):``, with the batch dropped outside it,
    or on another thread -- is not covered: call ``release_after(batch, s)`` after the last such
    copy is issued and before the batch is dropped. The fence is recorded at the call, so copies
    issued on ``s`` after it are not covered. ``stream=None`` means the current stream. Batches
    that are not in a page-locked ring (pageable, or pinned by torch's caching host allocator,
    which records its own events) need nothing; the call returns 0 for them.

    Returns the number of ring slots fenced.

    >>> import torch, fastcollate
    >>> fastcollate.release_after({"x": torch.zeros(3)})  # not a ring batch: nothing to do
    0
    """
    found, _ = fenced_slots(batch)
    n = 0
    for ring, slots in found.items():
        for slot in slots:
            ring.fences.add(slot, ring.fences.factory(stream))
            n += 1
    return n


def hold_until(box: list, ready: Any) -> bool:
    """Drop ``box`` (a list holding a batch the caller alone copied, emptied here) so that the ring
    slots under it wait for ``ready`` -- an event on the stream that did the copy; None: for
    nothing more -- instead of a fence on whatever stream is current. False, with ``box``
    untouched, when some CPU tensor of the batch is not in a fenced ring slot: the caller must
    wait for ``ready`` itself before dropping that memory."""
    found, covered = fenced_slots(box)
    if not found or not covered:
        return False
    if ready is not None and ready.query():
        ready = None
    for ring, slots in found.items():
        for slot in slots:
            ring.fences.add(slot, ready, instead=True)
    box.clear()  # the last view dies here, on this thread, unless another reference outlives it
    for ring, slots in found.items():
        for slot in slots:
            ring.fences.settle(slot)
    return True


guards.set_handover(hold_until)  # the device path's HostHold reaches the ring through core
