"""No host buffer is rewritten while a copy may still read it: the ring's fences and
page-locking, and the prefetcher's holds, with test doubles for CUDA events and cudaHostRegister
(the behaviour on a GPU is a row of benchmarks/gpu_check.py)."""
import gc
import logging

import torch
import torch.utils.data as tud

import fastcollate
from fastcollate.device.pipeline import Producer, PipelineStats
from fastcollate.loader.ring import Ring, RingCollator
from fastcollate.device.transport import Delivered, HostHold
from helpers import assert_same


class Copies:
    """Fake copies in flight: each fence is a pending copy until `complete()`."""

    def __init__(self):
        self.fences = []
        self.log = []

    def __call__(self):
        fence = FakeFence(self)
        self.fences.append(fence)
        return fence

    def complete(self):
        for f in self.fences:
            f.done = True


class FakeFence:
    def __init__(self, copies):
        self.copies, self.done = copies, False

    def query(self):
        return self.done

    def synchronize(self):
        self.copies.log.append("synchronize")
        self.done = True


class Registrar:
    def __init__(self, fail=""):
        self.fail, self.log = fail, []

    def register(self, ptr, nbytes):
        self.log.append(("register", ptr, nbytes))
        return self.fail

    def unregister(self, ptr):
        self.log.append(("unregister", ptr))
        return ""


def _fill(ring, value):
    """What a worker does: claim a slot and write a batch into it."""
    slot = ring.claim()
    if slot >= 0:
        ring.slot_view(slot, 4096).fill_(value)
    return slot


def test_a_released_slot_is_not_reused_before_its_copy_completes():
    copies = Copies()
    ring = Ring(1, 4096, fence=copies)
    slot = _fill(ring, 7)
    batch = ring.lease(slot, __import__("os").getpid(), 4096)
    del batch  # the last view dies while the (fake) copy out of it is still running
    assert len(copies.fences) == 1 and ring.stats()["ring_slots_pending"] == 1
    assert ring.claim() == -1  # not free: a worker would fall back to a shared arena
    assert ring.poll() == 0 and ring.claim() == -1
    copies.complete()
    assert ring.poll() == 1
    assert _fill(ring, 8) == slot  # reused only now
    assert ring.stats()["ring_slots_pending"] == 0


def test_unfenced_rings_free_at_once():
    ring = Ring(1, 4096)
    slot = _fill(ring, 1)
    t = ring.lease(slot, __import__("os").getpid(), 4096)
    del t
    assert ring.claim() == slot


def _loader(ring, n=48, **kw):
    data = [{"x": torch.full((256,), i, dtype=torch.int32), "i": i} for i in range(n)]
    return data, tud.DataLoader(data, batch_size=4, num_workers=2, collate_fn=RingCollator(fastcollate.collate, ring),
                                **kw)


def test_fences_that_never_complete_bound_the_ring_and_lose_nothing():
    copies = Copies()
    ring = Ring(3, 8192, fence=copies)
    data, loader = _loader(ring)
    want = list(tud.DataLoader(data, batch_size=4))
    for epoch in range(2):
        for got, exp in zip(loader, want, strict=True):
            assert_same(got, exp)  # one at a time, as a training loop holds them
    st = ring.stats()
    # every slot is stuck behind a pending copy; the rest went the ordinary shared-memory way
    assert st["ring_slots_pending"] == 3 and st["ring_slots_free"] == 0
    assert st["ring_hits"] == 3 and st["ring_full"] == 24 - 3
    copies.complete()
    for got, exp in zip(loader, want, strict=True):
        assert_same(got, exp)
    st = ring.stats()
    assert st["ring_hits"] > 3, st  # fallback batches arriving polled the fences: the ring is back


def test_late_fences_delay_reuse_but_every_batch_is_right():
    copies = Copies()
    ring = Ring(4, 8192, fence=copies)
    data, loader = _loader(ring, persistent_workers=True)
    want = list(tud.DataLoader(data, batch_size=4))
    for epoch in range(3):
        for i, (got, exp) in enumerate(zip(loader, want, strict=True)):
            assert_same(got, exp)
            if i % 2:
                copies.complete()  # copies finish late, every other step
    del got, loader
    gc.collect()
    st = ring.stats()
    assert st["ring_hits"] > 4 and st["ring_hits"] + st["ring_fallbacks"] == 36


def test_pinning_is_per_slot_lazy_and_undone_after_the_last_copy():
    copies, reg = Copies(), Registrar()
    ring = Ring(2, 1 << 20, pin=True, fence=copies, registrar=(reg.register, reg.unregister))
    assert ring.stats()["ring_pinned"] is True and reg.log == []  # nothing page-locked up front
    data, loader = _loader(ring)
    batches = list(loader)  # held: two ring slots, the rest fall back
    assert [e[0] for e in reg.log] == ["register", "register"]
    assert ring.stats()["ring_pinned_bytes"] == 2 << 20
    del batches, loader
    gc.collect()
    assert not any(e[0] == "unregister" for e in reg.log)  # copies still pending
    ring_fences = copies.fences
    del ring
    gc.collect()
    # the segment died: every pending copy was waited for first, then its pages were unpinned
    assert copies.log.count("synchronize") == len([f for f in ring_fences if f.done]) > 0
    assert [e[0] for e in reg.log] == ["register", "register", "unregister", "unregister"]


def test_failed_page_locking_warns_once_and_says_so(caplog):
    reg = Registrar(fail="cudaErrorHostMemoryAlreadyRegistered: part of the range is already registered")
    ring = Ring(2, 1 << 20, pin=True, fence=Copies(), registrar=(reg.register, reg.unregister))
    data, loader = _loader(ring)
    with caplog.at_level(logging.WARNING, logger="fastcollate"):
        for got, exp in zip(loader, tud.DataLoader(data, batch_size=4), strict=True):
            assert_same(got, exp)
    assert sum("cudaHostRegister failed" in r.getMessage() for r in caplog.records) == 1
    assert len([e for e in reg.log if e[0] == "register"]) == 1  # not retried per batch
    assert ring.stats()["ring_pinned"].startswith("cudaErrorHostMemoryAlreadyRegistered")
    assert not any(t.is_pinned() for t in [got["x"]])


def test_pin_memory_without_cuda_says_why():
    loader = fastcollate.DataLoader(list(range(8)), batch_size=4, num_workers=1, pin_memory=True)
    if not torch.cuda.is_available():
        assert loader.stats()["ring_pinned"] is False  # pin_memory is a no-op without CUDA, as in torch


class FakeEvent:
    def __init__(self):
        self.done, self.synced = False, False

    def query(self):
        return self.done

    def synchronize(self):
        self.synced = self.done = True


def test_a_dropped_hold_waits_for_its_copy_first():
    order = []

    class Host:
        def __del__(self):
            order.append("host released")

    ev = FakeEvent()
    ev.synchronize = lambda: (order.append("waited"), setattr(ev, "done", True))
    h = HostHold(ev, Host())
    del h
    gc.collect()
    assert order == ["waited", "host released"]
    done = FakeEvent()
    done.done = True
    h = HostHold(done, object())
    del h
    assert not done.synced  # a completed copy costs no wait


def test_pipeline_shutdown_waits_for_the_copies_of_discarded_batches():
    events = []

    def stage(i):
        ev = FakeEvent()
        events.append(ev)
        return Delivered(i, ev, hold=HostHold(ev, torch.full((4,), i)))

    epoch = Producer(range(100), stage, 3, PipelineStats())
    first = next(epoch)
    assert first.batch == 0
    epoch.close()  # the queue still held prefetched batches whose copies were "running"
    del first
    gc.collect()
    assert len(events) >= 2
    assert [ev.synced for ev in events] == [True] * len(events), [(i, ev.synced) for i, ev in enumerate(events)]
