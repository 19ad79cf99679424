"""No host buffer is rewritten while a copy may still read it: the ring's fences and
page-locking, and the prefetcher's holds, with test doubles for CUDA events and cudaHostRegister
(the behaviour on a GPU is a row of benchmarks/gpu_check.py)."""
import gc
import logging
import os
import subprocess
import sys
import textwrap
import threading

import pytest

import torch
import torch.utils.data as tud

import fastcollate
from fastcollate.device.pipeline import Producer, PipelineStats
from fastcollate.loader.ring import Ring, RingCollator
from fastcollate.device.transport import Delivered, HostHold
from helpers import assert_same, in_thread, wait_until


class Copies:
    """Fake copies in flight: each fence is a pending copy until `complete()`."""

    def __init__(self):
        self.fences = []
        self.log = []
        self.idle = False  # a GPU with nothing queued: new fences are complete at once

    def __call__(self):
        fence = FakeFence(self)
        fence.done = self.idle
        self.fences.append(fence)
        return fence

    def finish(self):
        """The end of a test: the GPU drains, so the ring's death waits for nothing."""
        self.idle = True
        self.complete()

    def complete(self):
        for f in self.fences:
            f.done = True


class FakeFence:
    def __init__(self, copies):
        self.copies, self.done = copies, False

    def query(self):
        return self.done


def _later(seconds, fn):
    """What the GPU does meanwhile: completes a copy a little later, on its own."""
    t = threading.Timer(seconds, fn)
    t.daemon = True
    t.start()
    return t


class Registrar:
    def __init__(self, fail="", fences=None):
        self.fail, self.log, self.fences = fail, [], fences

    def register(self, ptr, nbytes):
        self.log.append(("register", ptr, nbytes))
        return self.fail

    def unregister(self, ptr):
        self.log.append(("unregister", ptr))
        if self.fences is not None:  # whether every copy had completed when its pages were unpinned
            self.log.append(("all fences done", all(f.done for f in self.fences.fences)))
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
    copies.finish()


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
    copies.finish()


def test_pinning_is_per_slot_lazy_and_undone_after_the_last_copy():
    copies = Copies()
    reg = Registrar(fences=copies)
    ring = Ring(2, 1 << 20, pin=True, fence=copies, registrar=(reg.register, reg.unregister))
    assert ring.stats()["ring_pinned"] is True and reg.log == []  # nothing page-locked up front
    data, loader = _loader(ring)
    batches = list(loader)  # held: two ring slots, the rest fall back
    assert [e[0] for e in reg.log] == ["register", "register"]
    assert ring.stats()["ring_pinned_bytes"] == 2 << 20
    del batches, loader
    gc.collect()
    assert not any(e[0] == "unregister" for e in reg.log)  # copies still pending
    assert copies.fences and not any(f.done for f in copies.fences)
    _later(0.2, copies.complete)
    del ring
    gc.collect()
    # the segment died: every pending copy was waited for first, then its pages were unpinned
    assert [e[0] for e in reg.log] == ["register", "register"] + ["unregister", "all fences done"] * 2
    assert [e[1] for e in reg.log if e[0] == "all fences done"] == [True, True]


def test_a_fence_that_never_completes_times_out_and_keeps_the_pages_pinned(monkeypatch):
    from fastcollate.core import guards

    monkeypatch.setattr(guards, "WAIT_TIMEOUT_S", 0.2)
    kept = len(guards.LEAKED)
    copies, reg = Copies(), Registrar()
    ring = Ring(1, 1 << 20, pin=True, fence=copies, registrar=(reg.register, reg.unregister))
    slot = _fill(ring, 1)
    lease = ring.lease(slot, os.getpid(), 4096)
    del lease
    with pytest.raises(TimeoutError, match="ring slot 0"):
        ring.fences.drain()
    assert ring.claim() == -1  # still held: a copy may read it
    del ring
    gc.collect()
    assert [e[0] for e in reg.log] == ["register"]  # never unregistered under a copy that may still run
    del guards.LEAKED[kept:]


def test_failed_page_locking_warns_once_and_says_so(caplog):
    reg = Registrar(fail="cudaErrorHostMemoryAlreadyRegistered: part of the range is already registered")
    copies = Copies()
    ring = Ring(2, 1 << 20, pin=True, fence=copies, registrar=(reg.register, reg.unregister))
    data, loader = _loader(ring)
    with caplog.at_level(logging.WARNING, logger="fastcollate"):
        for got, exp in zip(loader, tud.DataLoader(data, batch_size=4), strict=True):
            assert_same(got, exp)
    assert sum("cudaHostRegister failed" in r.getMessage() for r in caplog.records) == 1
    assert len([e for e in reg.log if e[0] == "register"]) == 1  # not retried per batch
    assert ring.stats()["ring_pinned"].startswith("cudaErrorHostMemoryAlreadyRegistered")
    assert not any(t.is_pinned() for t in [got["x"]])
    copies.finish()


def test_pin_memory_without_cuda_says_why():
    loader = fastcollate.DataLoader(list(range(8)), batch_size=4, num_workers=1, pin_memory=True)
    if not torch.cuda.is_available():
        assert loader.stats()["ring_pinned"] is False  # pin_memory is a no-op without CUDA, as in torch


class FakeEvent:
    def __init__(self):
        self.done, self.queries = False, 0

    def query(self):
        self.queries += 1
        return self.done

    def complete(self):
        self.done = True


class Host:
    """Host memory that notes whether its copy had completed when it was released."""

    def __init__(self, ev, log):
        self.ev, self.log = ev, log

    def __del__(self):
        self.log.append(("host released", self.ev.done))


def test_a_dropped_hold_waits_for_its_copy_first():
    order = []
    ev = FakeEvent()
    _later(0.1, ev.complete)
    h = HostHold(ev, Host(ev, order))
    del h
    gc.collect()
    assert order == [("host released", True)]
    done = FakeEvent()
    done.done = True
    h = HostHold(done, object())
    del h
    assert done.queries == 1  # a completed copy costs no wait


def test_a_hold_whose_copy_never_completes_times_out_and_keeps_the_memory(monkeypatch):
    from fastcollate.core import guards

    monkeypatch.setattr(guards, "WAIT_TIMEOUT_S", 0.2)
    kept = len(guards.LEAKED)
    order = []
    ev = FakeEvent()
    h = HostHold(ev, Host(ev, order))
    with pytest.raises(TimeoutError, match="host-to-device copy of a prefetched batch"):
        h.release()
    gc.collect()
    assert order == []  # still alive: the copy may still read it
    del guards.LEAKED[kept:]
    assert order == [("host released", False)]


def test_pipeline_shutdown_waits_for_the_copies_of_discarded_batches():
    released = []

    def stage(i):
        ev = FakeEvent()
        _later(0.05 * (i + 1), ev.complete)
        return Delivered(i, ev, hold=HostHold(ev, Host(ev, released)))

    epoch = Producer(range(100), stage, 3, PipelineStats())
    first = next(epoch)
    assert first.batch == 0
    # the producer thread runs ahead on its own time: on a busy machine it may not have made a
    # second batch yet when next() returns -- wait until the queue holds two
    assert wait_until(lambda: epoch._q.qsize() >= 2)
    epoch.close()  # the queue still held prefetched batches whose copies were "running"
    del first
    gc.collect()
    assert len(released) >= 2
    assert released == [("host released", True)] * len(released), released


# -- issue 20: the lease deleter and the fences, reproduced on the CPU


def test_a_view_dying_while_an_exception_is_raised_keeps_the_exception_and_frees_the_slot():
    # the temporary lease dies while torch.add's TypeError is being raised: the deleter runs
    # with the error indicator set and must neither replace the error nor lose the slot
    copies = Copies()
    ring = Ring(1, 4096, fence=copies)
    slot = _fill(ring, 5)
    with pytest.raises(TypeError) as info:
        torch.add(ring.lease(slot, os.getpid(), 4096), "not a tensor")
    assert type(info.value) is TypeError, repr(info.value)
    assert len(copies.fences) == 1 and ring.stats()["ring_slots_pending"] == 1  # the hook ran: fenced
    copies.complete()
    assert ring.poll() == 1 and _fill(ring, 6) == slot  # and the slot came back


def test_an_unfenced_lease_dying_during_an_exception_frees_its_slot_too():
    ring = Ring(1, 4096)
    slot = _fill(ring, 5)
    with pytest.raises(TypeError):
        torch.add(ring.lease(slot, os.getpid(), 4096), "not a tensor")
    assert ring.claim() == slot


class CollectingFence(FakeFence):
    """A fence whose query() allocates enough to run the garbage collector, as any allocation may."""

    def query(self):
        gc.collect()
        return self.done


def test_a_collection_inside_poll_that_frees_a_ring_batch_does_not_deadlock():
    copies = Copies()
    fences = []

    def factory(stream=None):
        f = CollectingFence(copies)
        fences.append(f)
        return f

    ring = Ring(2, 4096, fence=factory)
    first = _fill(ring, 1)
    a = ring.lease(first, os.getpid(), 4096)
    del a  # pending behind a fence whose query() collects
    second = _fill(ring, 2)
    cycle = [ring.lease(second, os.getpid(), 4096)]
    cycle.append(cycle)  # only the collector frees this batch: inside the fence's query()
    del cycle
    in_thread(ring.poll)  # collect -> the cycle's lease dies -> release() on the polling thread
    assert len(fences) == 2 and ring.stats()["ring_slots_pending"] == 2
    for f in fences:
        f.done = True
    in_thread(ring.poll)
    assert ring.stats()["ring_slots_pending"] == 0 and sorted([ring.claim(), ring.claim()]) == [0, 1]


class SecondAskFence(FakeFence):
    """A fence that collects garbage whenever asked and has completed by the second time."""

    def __init__(self, copies):
        super().__init__(copies)
        self.polls = 0

    def query(self):
        gc.collect()
        self.polls += 1
        return self.polls > 1


def test_a_collection_inside_drain_does_not_deadlock():
    # drain() holds the lock while it waits: a lease freed by a collection inside the wait
    # queues its slot without the lock, and the same drain waits for it too
    ring = Ring(2, 4096, fence=lambda stream=None: SecondAskFence(None))
    first = _fill(ring, 1)
    dropped = ring.lease(first, os.getpid(), 4096)
    del dropped  # pending: its fence was asked once
    second = _fill(ring, 2)
    cycle = [ring.lease(second, os.getpid(), 4096)]
    cycle.append(cycle)
    del cycle
    in_thread(ring.fences.drain)
    assert len(ring.fences) == 0 and sorted([ring.claim(), ring.claim()]) == [0, 1]


def _child_drops(batch_holder, ring):
    """Fork a child that drops its copy of a leased batch (and collects), then exits."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 0
        try:
            batch_holder.clear()
            gc.collect()
            ring.poll()
        except BaseException:
            code = 3
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_forked_child_dropping_a_leased_batch_leaves_the_parents_slot_held():
    ring = Ring(1, 4096)
    slot = _fill(ring, 9)
    holder = [ring.lease(slot, os.getpid(), 4096)]
    assert _child_drops(holder, ring) == 0
    assert ring.states()[slot] == fastcollate._ext._C.ring_held_by_main  # the child freed nothing
    assert ring.claim() == -1 and int(holder[0][0]) == 9
    holder.clear()
    assert ring.claim() == slot  # the parent's own drop frees it


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_forked_child_never_runs_the_fence_hook_of_the_parents_ring():
    done = []

    def factory(stream=None):  # fences that are already complete: a hook run in the child would free
        f = FakeFence(Copies())
        f.done = True
        done.append(f)
        return f

    ring = Ring(1, 4096, fence=factory)
    slot = _fill(ring, 9)
    holder = [ring.lease(slot, os.getpid(), 4096)]
    assert _child_drops(holder, ring) == 0
    assert ring.states()[slot] == fastcollate._ext._C.ring_held_by_main
    assert done == []  # and no fence was made in the parent either
    holder.clear()
    ring.poll()
    assert ring.claim() == slot


def test_finalization_with_leased_batches_is_quiet():
    # leased batches of a fenced ring alive at exit: their deleters run while the interpreter
    # finalizes and must neither call into Python (a fence made then) nor abort
    code = textwrap.dedent("""
        import os, sys, torch
        sys.path.insert(0, %r)
        from fastcollate.loader.ring import Ring
        class F:
            def query(self): return True
        def factory(stream=None):
            if sys.is_finalizing():
                os.write(2, b"fence made while finalizing\\n")
            return F()
        ring = Ring(2, 4096, fence=factory)
        keep = []
        for v in (1, 2):
            s = ring.claim(); ring.slot_view(s, 4096).fill_(v)
            keep.append(ring.lease(s, os.getpid(), 4096))
        keep.append(keep)  # a cycle: freed, if at all, by the final collection
        sys.modules[__name__].keep = keep
        print("ok", flush=True)
    """) % os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr
    assert "Exception ignored" not in r.stderr and "Fatal" not in r.stderr, r.stderr
    assert "while finalizing" not in r.stderr, r.stderr


class StreamCopies(Copies):
    """Fences that remember the stream they were recorded on (None: the current stream)."""

    def __call__(self, stream=None):
        fence = super().__call__()
        fence.stream = stream
        return fence


def test_release_after_makes_the_slot_also_wait_for_the_given_stream():
    copies = StreamCopies()
    ring = Ring(1, 4096, fence=copies)
    slot = _fill(ring, 4)
    lease = ring.lease(slot, os.getpid(), 4096)
    batch = {"x": lease[:1024].view(torch.int32), "y": [lease[1024:]]}
    side = object()  # a stream double: the fence factory records on it
    assert fastcollate.release_after(batch, side) == 1  # one slot under the batch
    assert [f.stream for f in copies.fences] == [side]
    del batch, lease  # the last view dies: a fence on the current stream as well
    assert [f.stream for f in copies.fences] == [side, None]
    copies.fences[1].done = True  # the current stream's copy done, the side stream's not yet
    assert ring.poll() == 0 and ring.claim() == -1
    copies.fences[0].done = True
    assert ring.poll() == 1 and ring.claim() == slot


def test_release_after_outside_a_fenced_ring_is_a_no_op():
    assert "release_after" in fastcollate.__all__
    assert fastcollate.release_after({"x": torch.zeros(3)}) == 0
    ring = Ring(1, 4096)  # pageable: no copy can read it late
    slot = _fill(ring, 1)
    assert fastcollate.release_after([ring.lease(slot, os.getpid(), 4096)]) == 0


def test_a_prefetcher_hold_dropped_after_its_copy_completed_records_no_new_fence():
    # the prefetcher's copy ran on its side stream and `ready` (recorded there) has completed:
    # the slot needs no fence on the consumer's stream (which would wait for the consumer's compute)
    copies = Copies()
    ring = Ring(1, 4096, fence=copies)
    slot = _fill(ring, 3)
    batch = {"x": ring.lease(slot, os.getpid(), 4096)}
    ready = FakeEvent()
    hold = HostHold(ready, batch)
    del batch
    ready.done = True
    assert hold.done()
    hold.release()
    assert copies.fences == [] and ring.claim() == slot


def test_a_prefetcher_hold_fences_its_slot_with_the_side_stream_event():
    # dropped before the copy completed (close, shutdown, a timed-out wait): the slot waits for
    # the side stream's `ready` event, not for a new fence on whatever stream is current
    copies = Copies()
    ring = Ring(1, 4096, fence=copies)
    slot = _fill(ring, 3)
    ready = FakeEvent()
    hold = HostHold(ready, [ring.lease(slot, os.getpid(), 4096)])
    hold.release()
    assert copies.fences == [] and ring.stats()["ring_slots_pending"] == 1 and ring.claim() == -1
    ready.done = True
    assert ring.poll() == 1 and ring.claim() == slot
