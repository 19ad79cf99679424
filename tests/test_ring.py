"""fastcollate.DataLoader and the worker ring, against torch's DataLoader + default_collate."""
import gc
import os
import signal

import numpy as np
import pytest
import torch
import torch.utils.data as tud

import fastcollate
from sample_data import Mixed
from helpers import assert_same, tensor_leaves, wait_until


class Imgs(tud.Dataset):
    def __init__(self, n=40, size=16):
        self.n, self.size = n, size

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"image": torch.full((3, self.size, self.size), i % 251, dtype=torch.uint8), "label": i, "s": f"{i}"}


class Shards(tud.IterableDataset):
    def __init__(self, n=37):
        self.n = n

    def __iter__(self):
        info = tud.get_worker_info()
        wid, nw = (info.id, info.num_workers) if info else (0, 1)
        for i in range(wid, self.n, nw):
            yield {"x": torch.tensor([i, i * i]), "y": float(i)}


class KillAt(Imgs):
    def __getitem__(self, i):
        if i == 13 and tud.get_worker_info() is not None:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().__getitem__(i)


def pair(ds, **kw):
    seed = kw.pop("seed", None)
    gen = (lambda: {"generator": torch.Generator().manual_seed(seed)}) if seed is not None else dict
    ours = fastcollate.DataLoader(ds, **kw, **gen())
    theirs = tud.DataLoader(ds, **{k: v for k, v in kw.items() if k not in ("ring_slot_bytes", "ring_max_bytes")},
                            **gen())
    return ours, theirs


@pytest.mark.parametrize("kw", [
    dict(batch_size=8, num_workers=2),
    dict(batch_size=8, num_workers=2, drop_last=True),
    dict(batch_size=5, num_workers=2, shuffle=True, seed=3),
    dict(batch_sampler=tud.BatchSampler(tud.SequentialSampler(range(37)), 6, False), num_workers=2),
    dict(batch_size=4, num_workers=1, sampler=list(reversed(range(37)))),
    dict(batch_size=8, num_workers=2, persistent_workers=True),
    dict(batch_size=8, num_workers=2, multiprocessing_context="spawn"),
])
def test_batch_for_batch_equal_to_torch(kw):
    kw = dict(kw)
    ours, theirs = pair(Mixed(37), **kw)
    n = 0
    for epoch in range(2):
        for a, b in zip(ours, theirs, strict=True):  # as a training loop holds them: one at a time
            assert_same(a, b)
            n += 1
    st = ours.stats()
    assert st["ring"] and st["ring_hits"] == n and st["ring_fallbacks"] == 0


def test_iterable_dataset_sharded_by_worker():
    ours, theirs = pair(Shards(), batch_size=4, num_workers=2, ring_slot_bytes=4096)
    for a, b in zip(ours, theirs, strict=True):
        assert_same(a, b)
    assert ours.stats()["ring_hits"] > 0
    plain = fastcollate.DataLoader(Shards(), batch_size=4, num_workers=2)  # sized without ring_slot_bytes too
    for a, b in zip(plain, tud.DataLoader(Shards(), batch_size=4, num_workers=2), strict=True):
        assert_same(a, b)
    assert plain.stats()["ring_hits"] == 10


def test_main_process_and_custom_collate_have_no_ring():
    assert fastcollate.DataLoader(Imgs(), batch_size=4).stats() == {"ring": False, "ring_off": "num_workers=0"}
    l = fastcollate.DataLoader(Imgs(), batch_size=4, num_workers=2, collate_fn=tud.default_collate)
    assert_same(list(l), list(tud.DataLoader(Imgs(), batch_size=4, num_workers=2)), contiguous=False)
    assert l.stats() == {"ring": False, "ring_off": "the collate_fn is not fastcollate's"}


def test_batches_are_views_of_one_slot_and_never_overwritten_while_held():
    loader = fastcollate.DataLoader(Imgs(200), batch_size=8, num_workers=2, persistent_workers=True)
    held = []
    for epoch in range(3):
        for i, b in enumerate(loader):
            leaves = tensor_leaves(b)
            assert len({t.untyped_storage().data_ptr() for t in leaves}) == 1
            if i % 7 == 0:
                held.append((i, b))
    for i, b in held:
        idx = list(range(i * 8, i * 8 + 8))
        assert b["label"].tolist() == idx
        assert torch.equal(b["image"][:, 0, 0, 0], torch.tensor([j % 251 for j in idx], dtype=torch.uint8))
    st = loader.stats()
    assert st["ring_slots_held"] <= len(held)
    del held, b, leaves
    gc.collect()
    assert loader.stats()["ring_slots_held"] == 0


def test_fallback_when_the_ring_is_full_or_the_batch_too_big():
    # two slots only: holding batches forces the workers onto ordinary shared arenas
    loader = fastcollate.DataLoader(Imgs(160), batch_size=8, num_workers=2, ring_slot_bytes=64 << 10,
                                    ring_max_bytes=2 * (64 << 10))
    got = list(loader)  # all held: the ring fills
    want = list(tud.DataLoader(Imgs(160), batch_size=8, num_workers=2))
    for a, b in zip(got, want):
        assert_same(a, b)
    st = loader.stats()
    assert st["ring_slots"] == 2 and st["ring_full"] > 0 and st["ring_hits"] + st["ring_fallbacks"] == 20
    big = fastcollate.DataLoader(Imgs(16, size=64), batch_size=8, num_workers=2, ring_slot_bytes=1000)
    assert_same(list(big), list(tud.DataLoader(Imgs(16, size=64), batch_size=8, num_workers=2)))
    assert big.stats()["ring_oversize"] == 2 and big.stats()["ring_hits"] == 0


def test_a_killed_worker_raises_and_its_slot_is_reclaimed():
    loader = fastcollate.DataLoader(KillAt(64), batch_size=4, num_workers=2, timeout=60)
    it = iter(loader)
    raised = None
    try:
        for b in it:
            del b  # hold nothing: every slot must come back
    except RuntimeError as exc:
        raised = str(exc)
    assert raised is not None and "worker" in raised.lower()
    del it  # the iterator shuts the surviving worker down; its undelivered slot is then reclaimable
    gc.collect()
    def reclaimed():  # once the surviving worker has exited (its own time: up to 30 s on a busy machine)
        loader._ring.reclaim_dead()
        st = loader.stats()
        return st["ring_slots_filled"] == 0 and st["ring_slots_held"] == 0

    assert wait_until(reclaimed, poll=0.1), loader.stats()


def test_dataset_errors_keep_their_type():
    class Bad(Imgs):
        def __getitem__(self, i):
            if i == 9:
                raise ValueError("sample 9 is broken")
            return super().__getitem__(i)

    with pytest.raises(ValueError, match="sample 9 is broken"):
        list(fastcollate.DataLoader(Bad(), batch_size=4, num_workers=2))


def test_early_break_and_persistent_workers_leave_no_slot_behind():
    loader = fastcollate.DataLoader(Imgs(400), batch_size=4, num_workers=2, persistent_workers=True, prefetch_factor=4)
    for epoch in range(5):
        for i, b in enumerate(loader):
            if i == 3:
                break
        del b
    gc.collect()
    st = loader.stats()
    # at most what the persistent iterator prefetched (2 workers x prefetch_factor 4) is still out
    assert st["ring_slots_held"] + st["ring_slots_filled"] <= 8
    # the prefetched, discarded batches were handed back when the next epoch reset the iterator
    assert sum(1 for b in loader) == 100
    gc.collect()
    assert loader.stats()["ring_slots_held"] == 0 and loader.stats()["ring_slots_filled"] == 0


def _fds():
    return len(os.listdir("/proc/self/fd"))


def _rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def test_fds_rss_and_slots_flat_over_100_epochs():
    loader = fastcollate.DataLoader(Imgs(48, size=32), batch_size=8, num_workers=2, persistent_workers=True)
    for _ in range(5):
        for b in loader:
            pass
    del b
    gc.collect()
    fds0, rss0 = _fds(), _rss()
    for _ in range(100):
        for b in loader:
            pass
    del b
    gc.collect()
    assert _fds() - fds0 <= 2
    assert _rss() - rss0 < 16 << 20
    st = loader.stats()
    assert st["ring_slots_held"] == 0 and st["ring_slots_filled"] == 0 and st["ring_fallbacks"] == 0


def test_non_persistent_epochs_reuse_the_ring():
    loader = fastcollate.DataLoader(Imgs(32), batch_size=8, num_workers=2)
    for _ in range(4):
        assert len(list(loader)) == 4
    gc.collect()
    assert loader.stats()["ring_hits"] == 16 and loader.stats()["ring_slots_held"] == 0


class WhoReads(tud.Dataset):
    """Records which processes read samples (a shared tensor: workers write it too)."""

    def __init__(self):
        self.pids = torch.zeros(64, dtype=torch.int64).share_memory_()

    def __len__(self):
        return 64

    def __getitem__(self, i):
        self.pids[i] = os.getpid()
        return {"x": torch.full((4,), i), "worker": tud.get_worker_info().id}


@pytest.mark.parametrize("ctx", [None, "spawn"])
def test_the_main_process_never_reads_the_dataset(ctx):
    # torch never touches samples in the main process when it has workers (worker state,
    # barriers, lazily opened handles); neither may the ring's sizing
    ds = WhoReads()
    loader = fastcollate.DataLoader(ds, batch_size=8, num_workers=2, multiprocessing_context=ctx)
    got = list(loader)
    assert len(got) == 8 and os.getpid() not in ds.pids.tolist() and 0 not in ds.pids.tolist()
    assert loader.stats()["ring_hits"] == 8


def test_new_loader_makes_its_ring_lazily():
    # the segment is sparse: making a loader allocates (and faults) nothing; a slot's pages are
    # allocated by the batches written into it
    def allocated(loader):
        fd, _ = loader._ring.mem.untyped_storage()._share_fd_cpu_()
        return os.fstat(fd).st_blocks * 512

    loaders = [fastcollate.DataLoader(Imgs(), batch_size=4, num_workers=2) for _ in range(8)]
    assert all(l.stats()["ring_slot_bytes"] * l.stats()["ring_slots"] >= 1 << 30 for l in loaders)
    assert all(allocated(l) == 0 for l in loaders)
    batches = list(loaders[0])  # 10 batches of 4 x 3x16x16 uint8 (+ labels), 9 slots
    assert 0 < allocated(loaders[0]) <= 9 * (2 << 20) and allocated(loaders[1]) == 0  # a page (or a huge page) a slot
    del batches, loaders


def test_random_streams_unchanged():
    class Rand(tud.Dataset):
        def __len__(self):
            return 16

        def __getitem__(self, i):
            return {"x": torch.rand(2), "n": np.random.rand(), "i": i}

    torch.manual_seed(0)
    np.random.seed(0)
    a = [b["x"] for b in fastcollate.DataLoader(Rand(), batch_size=4, num_workers=2, shuffle=True)]
    torch.manual_seed(0)
    np.random.seed(0)
    b = [b["x"] for b in tud.DataLoader(Rand(), batch_size=4, num_workers=2, shuffle=True)]
    assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_with_the_prefetcher():
    loader = fastcollate.DataLoader(Imgs(40), batch_size=8, num_workers=2)
    got = list(fastcollate.CudaPrefetcher(loader, device="cpu"))
    for a, b in zip(got, tud.DataLoader(Imgs(40), batch_size=8)):
        assert_same(a, b)


def test_no_shm_name_stays_linked():
    before = set(os.listdir("/dev/shm"))
    loader = fastcollate.DataLoader(Imgs(32), batch_size=8, num_workers=2)
    assert len(list(loader)) == 4 and loader.stats()["ring"]
    assert set(os.listdir("/dev/shm")) - before == set()


def test_ring_with_a_padding_collator():
    data = [{"ids": list(range(n)), "y": float(n)} for n in [3, 0, 5, 1, 2, 7, 4, 6, 9, 8]]
    ours = fastcollate.DataLoader(data, batch_size=3, num_workers=2,
                                  collate_fn=fastcollate.Collator(pad={"ids": -1}, lengths_key="lengths"))
    ref = fastcollate.Collator(pad={"ids": -1}, lengths_key="lengths", backend="python")
    want = [ref(data[i:i + 3]) for i in range(0, len(data), 3)]
    for _ in range(2):
        got = [b for b in ours]
        assert len(got) == len(want)
        for a, b in zip(got, want):
            assert_same(a, b)
        del got
    st = ours.stats()
    assert st["ring"] and st["ring_hits"] + st["ring_fallbacks"] == 8


def test_a_new_loader_per_epoch_leaves_no_descriptor_or_segment_behind():
    # user code that builds its loader inside the epoch loop: each ring (two memfds) goes with it
    data = [torch.ones(3)] * 16
    for _ in range(3):
        assert len(list(fastcollate.DataLoader(data, batch_size=4, num_workers=2))) == 4
    gc.collect()
    fds0 = _fds()
    for _ in range(20):
        assert len(list(fastcollate.DataLoader(data, batch_size=4, num_workers=2))) == 4
    gc.collect()
    assert _fds() - fds0 <= 1


def test_the_cached_pid_follows_forks():
    from fastcollate.loader.ring import _Pid

    assert _Pid.value == os.getpid()
    r, w = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child
        os.write(w, b"1" if _Pid.value == os.getpid() else b"0")
        os._exit(0)
    os.close(w)
    got = os.read(r, 1)
    os.waitpid(child, 0)
    os.close(r)
    assert got == b"1"  # a worker tags its slots with its own pid (reclaim_dead relies on it)


def _faults_writing(view):
    import resource
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    view.numpy().fill(7)  # numpy: one thread (torch's intra-op pool does not survive a fork)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_new_worker_maps_a_slot_in_one_call_not_a_fault_per_page():
    # a non-persistent loader's workers are new processes every epoch: they inherit the ring's
    # mapping without its page table entries, and writing a batch faulted once per page
    from fastcollate.loader.ring import Ring

    ring = Ring(2, 8 << 20)
    pages = (8 << 20) // 4096
    slot, view = ring.claim_view(8 << 20)
    assert _faults_writing(view) < pages // 8  # the parent's own first use: populated too
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            s2, v2 = ring.claim_view(8 << 20)
            faults = _faults_writing(v2)
            os.write(w, f"{s2} {faults}".encode())
            code = 0
        finally:
            os._exit(code)
    os.waitpid(pid, 0)
    s2, faults = map(int, os.read(r, 100).split())
    assert s2 >= 0 and faults < pages // 8, (faults, pages)
