"""CudaPrefetcher's pipeline on the CPU: the same thread/queue/lifecycle code the GPU path runs."""
import gc
import threading
import time
import traceback

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, default_collate

import fastcollate
from fastcollate.device import prefetcher as prefetch_mod
from fastcollate.device.pipeline import Producer, PipelineStats
from fastcollate.device.transport import find_arena
from helpers import assert_same, wait_until


class Squares(Dataset):
    def __init__(self, n=10, fail_at=None, delay=0.0):
        self.n, self.fail_at, self.delay = n, fail_at, delay

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.delay:
            time.sleep(self.delay)
        if i == self.fail_at:
            raise KeyError(f"sample {i} is broken")
        return {"x": torch.full((3,), float(i * i)), "i": i, "name": f"s{i}"}


def _threads():
    return [t for t in threading.enumerate() if t.name.startswith("fastcollate-prefetch") and t.is_alive()]


def _wait_no_threads():
    # up to 30 s (helpers.wait_until): a busy 2-core machine can take seconds to schedule a
    # thread's last steps; returns as soon as the threads are gone
    def gone():
        gc.collect()  # an abandoned epoch's thread is stopped by its collection
        return not _threads()

    return wait_until(gone, poll=0.02)


def loader(**kw):
    return DataLoader(Squares(**{k: v for k, v in kw.items() if k in ("n", "fail_at", "delay")}), batch_size=4,
                      collate_fn=fastcollate.collate, **{k: v for k, v in kw.items() if k in ("num_workers",)})


def test_every_batch_in_order_then_stop_forever():
    p = fastcollate.CudaPrefetcher(loader(n=10), device="cpu")
    it = iter(p)
    got = list(it)
    want = list(DataLoader(Squares(10), batch_size=4))
    assert len(got) == 3 and got[-1]["i"].tolist() == [8, 9]
    for a, b in zip(got, want):
        assert_same(a, b)
    for _ in range(3):
        with pytest.raises(StopIteration):
            next(it)
    assert _wait_no_threads()


def test_reiterating_starts_a_new_epoch_without_growing_threads():
    p = fastcollate.CudaPrefetcher(loader(n=9), device="cpu", depth=3)
    for _ in range(5):
        assert [b["i"].tolist() for b in p] == [[0, 1, 2, 3], [4, 5, 6, 7], [8]]
        assert len(_threads()) <= 1
    assert _wait_no_threads()
    assert p.stats()["epochs"] == 5 and p.stats()["batches"] == 15


def test_loader_forwarding():
    dl = loader(n=10)
    p = fastcollate.CudaPrefetcher(dl, device="cpu")
    assert len(p) == 3 and p.dataset is dl.dataset and p.sampler is dl.sampler and p.batch_size == 4


def test_set_epoch_reaches_the_sampler():
    class Sampler(torch.utils.data.Sampler):
        def __init__(self):
            self.epoch = None

        def set_epoch(self, e):
            self.epoch = e

        def __iter__(self):
            return iter(range(4))

        def __len__(self):
            return 4

    s = Sampler()
    p = fastcollate.CudaPrefetcher(DataLoader(Squares(4), batch_size=2, sampler=s), device="cpu")
    p.set_epoch(7)
    assert s.epoch == 7


@pytest.mark.parametrize("num_workers", [0, 2])
def test_loader_error_surfaces_with_type_and_traceback(num_workers):
    p = fastcollate.CudaPrefetcher(loader(n=12, fail_at=6, num_workers=num_workers), device="cpu")
    got = []
    t0 = time.monotonic()
    with pytest.raises(KeyError, match="sample 6 is broken") as info:
        for b in p:
            got.append(b)
    assert time.monotonic() - t0 < 60
    if num_workers == 0:
        assert "__getitem__" in "".join(traceback.format_tb(info.value.__traceback__))
    assert [b["i"].tolist() for b in got] == [[0, 1, 2, 3]]
    assert _wait_no_threads()


def test_transform_error_surfaces():
    def bad(batch):
        raise ValueError("transform broke")

    with pytest.raises(ValueError, match="transform broke"):
        list(fastcollate.CudaPrefetcher(loader(n=4), device="cpu", transform=bad))


def test_break_close_context_manager_and_gc_join_the_thread():
    p = fastcollate.CudaPrefetcher(loader(n=400, delay=0.001), device="cpu")
    for i, _ in enumerate(p):
        if i == 2:
            break
    assert _wait_no_threads(), "break + gc must stop the thread"

    it = iter(p)
    next(it)
    p.close()
    assert _wait_no_threads()
    with pytest.raises(StopIteration):
        next(it)

    with fastcollate.CudaPrefetcher(loader(n=400, delay=0.001), device="cpu") as q:
        next(iter(q))
    assert _wait_no_threads()


def test_queue_is_bounded_by_depth():
    p = fastcollate.CudaPrefetcher(loader(n=200), device="cpu", depth=2)
    for b in p:
        time.sleep(0.002)  # slow consumer: the producer runs ahead only `depth` batches
    assert p.stats()["queue_high_water"] <= 2


def test_non_tensor_leaves_pass_through():
    out = next(iter(fastcollate.CudaPrefetcher(loader(n=4), device="cpu")))
    assert out["name"] == ["s0", "s1", "s2", "s3"]


def test_pin_memory_loader_warns_once(monkeypatch):
    monkeypatch.setattr(prefetch_mod, "_warned_pin", False)
    dl = DataLoader(Squares(4), batch_size=2, collate_fn=fastcollate.collate)
    dl.pin_memory = True  # what the warning looks at (no CUDA needed to test it)
    with pytest.warns(UserWarning, match="leaf by leaf"):
        fastcollate.CudaPrefetcher(dl, device="cpu")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fastcollate.CudaPrefetcher(dl, device="cpu")


def test_bad_arguments():
    with pytest.raises(ValueError, match="depth"):
        fastcollate.CudaPrefetcher([], device="cpu", depth=0)
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA is not available"):
            fastcollate.CudaPrefetcher([], device="cuda")
        assert fastcollate.CudaPrefetcher([]).device == torch.device("cpu")


def test_cpu_transform_applied():
    norm = fastcollate.transforms.Normalize([0.5], [0.5], keys=["img"])
    data = [{"img": torch.full((1, 2, 2), 255, dtype=torch.uint8)} for _ in range(4)]
    out = list(fastcollate.CudaPrefetcher(DataLoader(data, batch_size=2, collate_fn=fastcollate.collate),
                                          device="cpu", transform=norm))
    assert all(torch.equal(b["img"], torch.ones(2, 1, 2, 2)) for b in out)


def test_pipeline_stops_a_blocked_producer():
    stats = PipelineStats()
    ep = Producer(iter(range(10**6)), lambda x: x, depth=1, stats=stats)
    assert wait_until(ep._q.full)  # the producer fills the queue and blocks in put() (a fixed 50 ms
    ep.close()  # of sleep is not always enough on a busy machine)
    assert not ep.alive


def test_single_arena_detection():
    batch = [{"a": torch.randn(3, 4), "b": i, "s": "x", "c": [torch.ones(2, dtype=torch.float16)]} for i in range(5)]
    found = find_arena(fastcollate.collate(batch))
    assert found is not None
    storage, span = found
    assert 0 < span <= storage.nbytes()
    assert find_arena(default_collate(batch)) is None
    assert find_arena({"s": ["no tensors"]}) is None
    assert find_arena(fastcollate.collate([torch.ones(2, 2).t().contiguous()] * 2)) is not None


@pytest.mark.cuda
def test_cuda_single_copy_and_values():
    batch = [{"img": torch.randint(0, 255, (3, 8, 8), dtype=torch.uint8), "y": i, "s": "x"} for i in range(6)]
    dl = DataLoader(batch, batch_size=3, collate_fn=fastcollate.collate)
    p = fastcollate.CudaPrefetcher(dl, device="cuda")
    for got, want in zip(p, DataLoader(batch, batch_size=3)):
        assert got["img"].is_cuda and torch.equal(got["img"].cpu(), want["img"])
        assert torch.equal(got["y"].cpu(), want["y"]) and got["s"] == want["s"]
        assert got["img"].untyped_storage().data_ptr() == got["y"].untyped_storage().data_ptr()
    assert p.stats()["single_copy_batches"] == 2


def test_pinned_bytes_reads_the_key_torch_reports(monkeypatch):
    # torch flattens its nested host stats itself; feed that code a nested dict of torch's shape
    import torch.cuda.memory as tcm

    from fastcollate.device.prefetcher import _pinned_bytes

    assert "allocated_bytes.{current" in tcm.host_memory_stats.__doc__
    nested = {"allocated_bytes": {"current": 12345, "peak": 99999}, "allocations": {"current": 2}}
    monkeypatch.setattr(tcm, "host_memory_stats_as_nested_dict", lambda: nested)
    monkeypatch.setattr(torch.cuda, "host_memory_stats", tcm.host_memory_stats)
    assert _pinned_bytes() == 12345


def test_local_rank_is_used_only_when_it_names_a_visible_gpu(monkeypatch):
    from fastcollate.device import prefetcher as prefetch

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)  # one GPU per rank (CUDA_VISIBLE_DEVICES)
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert prefetch._local_ordinal() == 0
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert prefetch._local_ordinal() == 3
    monkeypatch.setenv("LOCAL_RANK", "junk")
    assert prefetch._local_ordinal() == 0


def _bounded(fn, timeout=20.0):
    """fn() on a thread; a hang fails the test instead of the suite."""
    box = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as exc:
            box["error"] = exc

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"still waiting after {timeout} s"
    return box


def test_a_producer_thread_that_ended_without_a_word_is_an_error_not_a_hang(monkeypatch):
    from fastcollate.device import pipeline

    monkeypatch.setattr(pipeline, "_produce", lambda *args: None)  # a thread that dies delivering nothing
    epoch = Producer(range(3), lambda x: x, 2, PipelineStats(), name="fastcollate-prefetch-test")
    box = _bounded(lambda: next(epoch))
    assert isinstance(box.get("error"), RuntimeError), box
    assert "fastcollate-prefetch-test" in str(box["error"]) and "next batch" in str(box["error"])
    with pytest.raises(StopIteration):
        next(epoch)


def test_what_the_producer_put_just_before_it_ended_is_still_delivered(monkeypatch):
    from fastcollate.device import pipeline

    def produce_one(source, stage, q, stop, stats, on_start):
        q.put((pipeline._ITEM, "last words"))

    monkeypatch.setattr(pipeline, "_produce", produce_one)
    epoch = Producer(range(3), lambda x: x, 2, PipelineStats())
    epoch._thread.join(30)
    assert _bounded(lambda: next(epoch)).get("value") == "last words"
    assert isinstance(_bounded(lambda: next(epoch)).get("error"), RuntimeError)


def test_a_stuck_loader_times_out_naming_the_wait():
    gate = threading.Event()

    def stuck():
        yield 0
        gate.wait(30)
        yield 1

    p = fastcollate.CudaPrefetcher(stuck(), device="cpu", timeout=0.3)
    it = iter(p)
    assert next(it) == 0
    box = _bounded(lambda: next(it))
    gate.set()
    assert isinstance(box.get("error"), TimeoutError), box
    assert "0.3 s" in str(box["error"]) and "next batch" in str(box["error"])
    p.close()
    assert _wait_no_threads()
