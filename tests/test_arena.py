"""The pageable arena pool: reuse only after the last view died, the cap, the counters; and the
GIL-free threaded copy."""
import gc
import os

import pytest
import torch

import fastcollate
from fastcollate import _ext
from helpers import in_thread, tensor_leaves

C = _ext._C


def _batch(seed, n=8, size=5000):
    g = torch.Generator().manual_seed(seed)
    return [{"x": torch.randn(size, generator=g), "y": seed * 100 + i} for i in range(n)]


@pytest.fixture(autouse=True)
def _fresh_pool():
    gc.collect()
    fastcollate.trim_pool()
    fastcollate.set_pool_limit(2 << 30)
    yield
    fastcollate.set_pool_limit(2 << 30)


def test_arena_is_reused_once_the_batch_is_dead():
    s0 = fastcollate.stats()
    out = fastcollate.collate(_batch(0))
    del out
    out = fastcollate.collate(_batch(1))
    s1 = fastcollate.stats()
    assert s1["arenas_reused"] - s0["arenas_reused"] == 1
    assert s1["arenas_in_use"] - s0["arenas_in_use"] == 1
    del out
    assert fastcollate.stats()["arenas_in_use"] == s0["arenas_in_use"]


def test_a_live_view_keeps_its_arena_out_of_the_pool():
    out = fastcollate.collate(_batch(0))
    x = out["x"][3]  # a view of a view is enough to hold the arena
    del out
    held = [fastcollate.collate(_batch(s)) for s in range(1, 20)]
    assert torch.equal(x, _batch(0)[3]["x"])
    for s, b in zip(range(1, 20), held):
        assert torch.equal(b["x"], torch.stack([d["x"] for d in _batch(s)]))


def test_no_corruption_while_holding_many_batches():
    kept = []
    for s in range(60):
        out = fastcollate.collate(_batch(s))
        if s % 3 == 0:
            kept.append((s, out))
    for s, out in kept:
        want = _batch(s)
        assert torch.equal(out["x"], torch.stack([d["x"] for d in want]))
        assert out["y"].tolist() == [d["y"] for d in want]


def test_numpy_views_keep_the_arena_alive():
    arr = fastcollate.collate(_batch(0))["x"].numpy()
    for s in range(1, 10):
        fastcollate.collate(_batch(s))
    assert (arr == torch.stack([d["x"] for d in _batch(0)]).numpy()).all()


def test_pool_cap_is_respected_and_oversize_batches_still_work():
    fastcollate.set_pool_limit(300_000)  # room for one 160 KB arena, not two
    s0 = fastcollate.stats()
    a = fastcollate.collate(_batch(0))
    b = fastcollate.collate(_batch(1))  # past the cap: allocated outside the pool
    s1 = fastcollate.stats()
    assert s1["pool_bytes"] <= 300_000
    assert s1["arenas_unpooled"] - s0["arenas_unpooled"] == 1
    assert torch.equal(b["x"], torch.stack([d["x"] for d in _batch(1)]))
    del a, b
    s2 = fastcollate.stats()
    assert s2["pool_bytes"] <= 300_000 and s2["arenas_in_use"] == s0["arenas_in_use"]
    huge = fastcollate.collate(_batch(2, n=8, size=100_000))  # 3.2 MB, never refused
    assert huge["x"].shape == (8, 100_000)


def test_lowering_the_limit_evicts_idle_arenas():
    for s in range(3):
        fastcollate.collate(_batch(s, size=50_000 + 20_000 * s))  # three size classes, all idle after
    assert fastcollate.stats()["pool_idle_bytes"] > 0
    fastcollate.set_pool_limit(0)
    st = fastcollate.stats()
    assert st["pool_idle_bytes"] == 0 and st["pool_bytes"] == 0


def test_size_classes_bound_the_slack():
    for n in [1, 4095, 4096, 65537, 10**6, 38_535_168, 10**9]:
        c = C.pool_size_class(n)
        assert c >= n and (c - n) <= max(4096, n // 8)


@pytest.mark.parametrize("threads", [1, 2, 3, 8])
@pytest.mark.parametrize("piece", [1, 7, 4096, 1 << 20, 10 << 20])
def test_threaded_copy_is_exact(threads, piece):
    src = torch.randint(0, 255, (3_000_001,), dtype=torch.uint8)
    dst = torch.zeros_like(src)
    C.copy_bytes(dst, src, threads, piece)
    assert torch.equal(dst, src)


def test_threads_give_identical_batches():
    batch = [{"img": torch.randint(0, 255, (3, 128, 128), dtype=torch.uint8), "y": i} for i in range(64)]
    outs = [fastcollate.Collator(num_threads=t)(batch) for t in (1, 2, 4, 7)]
    for o in outs[1:]:
        assert torch.equal(o["img"], outs[0]["img"]) and torch.equal(o["y"], outs[0]["y"])


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs two CPUs and thread affinity (Linux)")
def test_helpers_forced_onto_the_callers_cpu_stay_exact_and_do_not_hang():
    # A helper that finds itself on the caller's CPU takes no task and stops polling; force it
    # there (every thread of this process on one CPU) and the copies must still be exact and end.
    # That each takes about a single-threaded copy's time is a speed: benchmarks/caller_cpu.py
    # (a 20 s bound on 200 copies here took 6-10 s beside 4 busy processes on 2 cores).
    src = torch.randint(0, 255, (4 << 20,), dtype=torch.uint8)
    dst = torch.zeros_like(src)
    C.copy_bytes(dst, src, 2, 1 << 20)  # the pool's helper exists from here on
    tids = [int(t) for t in os.listdir("/proc/self/task")]
    before = {t: os.sched_getaffinity(t) for t in tids}
    cpu = min(os.sched_getaffinity(0))

    def copies():
        for i in range(50):
            dst.zero_()
            C.copy_bytes(dst, src, 2, 1 << 18)
            assert torch.equal(dst, src), f"run {i}"

    try:
        for t in tids:
            os.sched_setaffinity(t, {cpu})
        in_thread(copies, timeout=300)  # started pinned, as the creating thread is; only a hang takes 300 s
    finally:
        for t, mask in before.items():
            try:
                os.sched_setaffinity(t, mask)
            except OSError:  # a thread that ended meanwhile
                pass


def test_leaves_share_one_storage_with_threads():
    batch = [{"a": torch.randn(300, 300), "b": torch.randn(7)} for _ in range(16)]
    out = fastcollate.Collator(num_threads=4)(batch)
    assert len({t.untyped_storage().data_ptr() for t in tensor_leaves(out)}) == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="tests the no-CUDA fallback")
def test_pin_memory_without_cuda_warns_and_stays_pageable():
    with pytest.warns(UserWarning, match="CUDA is not available"):
        c = fastcollate.Collator(pin_memory=True)
    assert not c.pin_memory
    assert not c([torch.ones(2), torch.ones(2)]).is_pinned()
    assert fastcollate.Collator(pin_memory="auto").pin_memory is False


@pytest.mark.cuda
def test_pinned_arena_is_one_pinned_storage():
    c = fastcollate.Collator(pin_memory=True)
    out = c([{"a": torch.randn(3, 5), "b": i} for i in range(4)])
    assert out["a"].is_pinned() and out["b"].is_pinned()
    assert out["a"].untyped_storage().data_ptr() == out["b"].untyped_storage().data_ptr()


@pytest.mark.parametrize("threads", [1, 2])
def test_large_batches_streamed_at_odd_alignments_are_exact(threads):
    # batches past 8 MB are written with non-temporal stores: sources and destinations that are
    # not 16-byte aligned, and sizes that are not multiples of 64, must come out exact
    from torch.utils.data import default_collate

    src = torch.randint(0, 255, (3_000_100 * 5,), dtype=torch.uint8)
    batch = [src[k * 3_000_100 + k % 7: k * 3_000_100 + k % 7 + 2_999_990] for k in range(5)]
    got = fastcollate.Collator(num_threads=threads)(batch)
    assert torch.equal(got, default_collate(batch))
