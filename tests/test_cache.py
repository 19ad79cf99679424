"""fastcollate.Cached: a cached sample is the dataset's exactly (assert_identical: types, dtypes,
shapes, strides, flags, bytes; the kinds in cache_samples.py); DataLoader workers fill it in epoch 1
and every worker reads what any other inserted, spawn, fork and forkserver, persistent or not,
either sharing strategy; integer indices of any kind are cached; a sample too big for the room left
is refused alone and a full cache keeps serving; a __getitems__ that returns a batch is passed
through; transform runs after the cache on every fetch; an interrupted or dead writer's entry is
freed; the cgroup's page cache is not counted as used; an 8 MB /dev/shm is no limit. The fuzzed
round trips are in test_fuzz.py, hits changed in place in test_cache_isolation.py, the wrapper's
attributes and copies in test_cache_wrapper.py."""
from __future__ import annotations

import os
import pickle
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

import fastcollate
from fastcollate import _ext
from fastcollate.cache import cached as cache_mod
import cache_samples
from helpers import assert_identical, assert_same

C = _ext._C
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---- datasets (module level: spawn workers import them) --------------------------------------------

class Listed(Dataset):
    """Sample i is items[i] itself; counts[i] how often it was fetched (shared with workers)."""

    def __init__(self, items):
        self.items = items
        self.counts = torch.zeros(len(items), dtype=torch.int32).share_memory_()

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        self.counts[i] += 1
        return self.items[i]


class Batched(Listed):
    def __init__(self, items):
        super().__init__(items)
        self.calls = []

    def __getitems__(self, indices):
        self.calls.append(list(indices))
        return [self[i] for i in indices]


class Tagged(Dataset):
    """A deterministic sample that also says which worker fetched it (-1: the main process)."""

    def __init__(self, n):
        self.n = n
        self.counts = torch.zeros(n, dtype=torch.int32).share_memory_()

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self.counts[i] += 1
        info = get_worker_info()
        return {"x": torch.arange(16, dtype=torch.float32) + i, "i": i, "by": -1 if info is None else info.id}


def read_by(sample):
    info = get_worker_info()
    return dict(sample, read_by=-1 if info is None else info.id)


class EpochBatches:
    """Batches of 4 in order in epoch 0, shifted by one batch in epoch 1 (set_epoch): a batch's
    samples were fetched in epoch 0 by the worker of the batch after it (round-robin)."""

    def __init__(self, n):
        self.n, self.epoch = n, 0

    def __len__(self):
        return self.n // 4

    def __iter__(self):
        order = list(range(self.n))
        shift = 4 * (self.epoch % 2)
        order = order[shift:] + order[:shift]
        return iter([order[k:k + 4] for k in range(0, self.n, 4)])


class Flip:
    """A random augmentation: adds a random number drawn from torch's generator."""

    def __call__(self, x):
        return x + torch.rand(())


def _round_trip(sample):
    """The sample as the dataset gave it (a miss), and as the cache gives it back (a hit)."""
    ds = fastcollate.Cached(Listed([sample]), max_bytes=64 << 20)
    first = ds[0]
    again = ds[0]
    return ds, first, again


KINDS = cache_samples.kinds()


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_cached_sample_is_the_datasets_exactly(kind):
    sample = KINDS[kind][0]
    ds, first, again = _round_trip(sample)
    assert first is sample  # a miss returns the dataset's own sample
    assert_identical(again, cache_samples.expected(kind, KINDS))
    s = ds.stats()
    assert (s["hits"], s["misses"], s["inserts"], s["uncacheable"]) == (1, 1, 1, 0)
    assert ds.dataset.counts.tolist() == [1]


def test_a_view_costs_the_bytes_it_spans_not_its_storage():
    big = torch.zeros(1000, 1000)  # 4 MB
    ds = fastcollate.Cached(Listed([big[3], big[:, 5][:2]]), max_bytes=64 << 20)
    ds[0], ds[1]
    assert ds.stats()["payload_bytes"] < 4000 + 4 * 1001 + 2 * 512


def test_every_hit_is_new_objects_a_transform_cannot_change_the_cache():
    def in_place(x):
        x.mul_(0)
        return x

    ds = fastcollate.Cached(Listed([torch.ones(4)]), transform=in_place, max_bytes=1 << 20)
    for _ in range(3):
        assert ds[0].sum() == 0
        assert torch.equal(ds._get(0), torch.ones(4))


@pytest.mark.parametrize("what", ["sparse", "object array", "memmap row", "lambda", "cuda-free meta"])
def test_what_cannot_be_cached_exactly_is_fetched_every_time(what, tmp_path):
    if what == "sparse":
        sample = torch.ones(3).to_sparse()
    elif what == "object array":
        sample = np.array([1, "a"], dtype=object)
    elif what == "memmap row":
        mm = np.memmap(tmp_path / "m.dat", dtype=np.float32, mode="w+", shape=(4, 3))
        sample = mm[1]
    elif what == "lambda":
        sample = {"f": lambda: 1}
    else:
        sample = torch.empty(3, device="meta")
    base = Listed([sample])
    ds = fastcollate.Cached(base, max_bytes=1 << 20)
    for _ in range(3):
        assert ds[0] is sample
    s = ds.stats()
    assert (s["hits"], s["misses"], s["inserts"], s["uncacheable"]) == (0, 3, 0, 1)
    assert base.counts.tolist() == [3]
    assert C.cache_state(ds.ctrl, 0) == C.cache_states["uncacheable"]


def test_a_full_cache_keeps_serving_and_counts_misses():
    items = [torch.full((256,), float(i)) for i in range(20)]  # 1 KB + header each
    base = Listed(items)
    ds = fastcollate.Cached(base, max_bytes=5 * 1200)
    for epoch in range(3):
        for i in range(20):
            assert_identical(ds[i], items[i])
    s = ds.stats()
    cached = s["inserts"]
    assert 3 <= cached < 20 and s["full"] and s["refused_full"] == 1
    assert s["hits"] == 2 * cached and s["misses"] == 20 + 2 * (20 - cached)
    assert s["bytes"] <= s["capacity"] == 6000
    assert base.counts.tolist() == [1] * cached + [3] * (20 - cached)


def test_one_sample_too_big_for_the_room_left_is_refused_alone(caplog):
    items = [torch.zeros(100), torch.zeros(5000), torch.zeros(100), torch.ones(100)]  # 20 KB in a 4 KB cache
    base = Listed(items)
    ds = fastcollate.Cached(base, max_bytes=4096)
    with caplog.at_level("WARNING", logger="fastcollate"):
        for _ in range(3):
            for i in range(4):
                assert_identical(ds[i], items[i])
    s = ds.stats()
    assert (s["inserts"], s["refused_full"], s["full"]) == (3, 1, False), s  # refused once, never serialized again
    assert C.cache_state(ds.ctrl, 1) == C.cache_states["refused"]
    assert base.counts.tolist() == [1, 3, 1, 1]
    said = [r.getMessage() for r in caplog.records if "does not fit" in r.getMessage()]
    assert len(said) == 1 and "sample 1 (" in said[0] and "bytes left of max_bytes=4096" in said[0], said
    assert "fetched from the dataset every time" in said[0] and "smaller samples are still inserted" in said[0]
    size = said[0].split("sample 1 (")[1].split(" ")[0]
    assert int(size) > 20000


def test_a_first_sample_bigger_than_the_cache_does_not_end_inserts():
    items = [torch.zeros(50_000)] + [torch.full((10,), float(i)) for i in range(1, 6)]
    ds = fastcollate.Cached(Listed(items), max_bytes=65536)
    for _ in range(2):
        for i in range(6):
            assert_identical(ds[i], items[i])
    s = ds.stats()
    assert (s["inserts"], s["hits"], s["refused_full"], s["full"]) == (5, 5, 1, False), s


def test_the_cache_is_full_once_the_room_left_is_less_than_a_typical_sample(caplog):
    items = [torch.full((256,), float(i)) for i in range(20)]  # ~1.2 KB entries
    ds = fastcollate.Cached(Listed(items), max_bytes=5 * 1200)
    with caplog.at_level("WARNING", logger="fastcollate"):
        for i in range(20):
            ds[i]
    s = ds.stats()
    assert s["full"] and s["refused_full"] == 1
    said = [r.getMessage() for r in caplog.records if "does not fit" in r.getMessage()]
    room = s["capacity"] - s["bytes"]
    assert len(said) == 1 and f"sample {s['inserts']} (" in said[0], said
    assert f"the {room} bytes left of max_bytes=6000" in said[0] and "the cache is full" in said[0]
    assert "no more are inserted" in said[0]
    # full: later claims are refused before anyone serializes
    pid = os.getpid()
    assert C.cache_claim(ds.ctrl, 19, pid).outcome == C.cache_claims["full"]


def test_the_full_rule_in_the_engine():
    ds = fastcollate.Cached(Listed([0] * 8), max_bytes=64 * 10)
    pid = os.getpid()

    def insert(i, nbytes):
        assert C.cache_claim(ds.ctrl, i, pid).outcome == C.cache_claims["claimed"]
        offset = C.cache_reserve(ds.ctrl, i, pid, nbytes)
        if offset >= 0:
            C.cache_publish(ds.ctrl, i, pid, offset, nbytes)
        return offset

    assert insert(0, 700) == -1 and not ds.stats()["full"]  # nothing published: refused alone
    assert insert(1, 128) == 0 and insert(2, 128) == 128  # mean entry 128 bytes, 384 left
    assert insert(3, 400) == -1 and not ds.stats()["full"]  # 384 left >= a typical 128
    assert insert(4, 300) == 256  # 320 -> 64 left
    assert insert(5, 100) == -1 and ds.stats()["full"]  # 64 left < the mean published entry (185 -> 192)
    assert C.cache_claim(ds.ctrl, 6, pid).outcome == C.cache_claims["full"]
    assert [C.cache_state(ds.ctrl, i) for i in (0, 3, 5)] == [C.cache_states["refused"]] * 3
    assert ds.stats()["refused_full"] == 3


def test_max_bytes_is_bounded_and_may_be_a_numpy_int():
    for big in (2**70, cache_mod.MAX_BYTES + 1):
        with pytest.raises(ValueError, match=r"at most MAX_BYTES = 2\*\*46"):
            fastcollate.Cached([1], max_bytes=big)
    for n in (np.int64(1 << 20), np.uint64(1 << 20), np.int32(4096)):
        ds = fastcollate.Cached([torch.ones(3)], max_bytes=n)
        assert type(ds.max_bytes) is int and ds.stats()["capacity"] == int(n)
        assert ds[0] is not ds[0] and ds.stats()["hits"] == 1


def test_max_bytes_zero_caches_nothing_and_works():
    ds = fastcollate.Cached(Listed([1, 2]), max_bytes=0)
    assert [ds[0], ds[1], ds[0]] == [1, 2, 1]
    assert ds.stats()["inserts"] == 0 and ds.stats()["full"]


def test_transform_runs_after_the_cache_on_every_fetch():
    items = [torch.zeros(8) for _ in range(4)]
    base = Listed(items)
    ds = fastcollate.Cached(base, transform=Flip(), max_bytes=1 << 20)
    epochs = [[ds[i] for i in range(4)] for _ in range(3)]
    assert base.counts.tolist() == [1, 1, 1, 1]  # the dataset once
    for i in range(4):  # the augmentation every time, different each epoch
        assert not torch.equal(epochs[0][i], epochs[1][i]) and not torch.equal(epochs[1][i], epochs[2][i])
    assert ds.stats()["transform_s"] > 0
    assert torch.equal(ds._get(0), torch.zeros(8))  # the cache holds the untransformed sample


def test_getitems_fetches_only_the_misses_in_one_call():
    items = [torch.full((3,), float(i)) for i in range(8)]
    base = Batched(items)
    ds = fastcollate.Cached(base, transform=lambda x: x * 2, max_bytes=1 << 20)
    assert hasattr(ds, "__getitems__")
    first = ds.__getitems__([0, 1, 2, 3])
    second = ds.__getitems__([2, 3, 4, 5, 5])
    assert base.calls == [[0, 1, 2, 3], [4, 5, 5]]
    for got, i in zip(first + second, [0, 1, 2, 3, 2, 3, 4, 5, 5]):
        assert_identical(got, items[i] * 2)
    assert not hasattr(fastcollate.Cached(Listed(items), max_bytes=1 << 20), "__getitems__")
    batches = list(DataLoader(ds, batch_size=4))  # torch's fetcher takes the batch path
    assert base.calls[2:] == [[6, 7]] and torch.equal(batches[1][:, 0], torch.tensor([8.0, 10, 12, 14]))


class Keyed(Dataset):
    """Records the key it was called with; sample k for an integer-valued key, repr(key) otherwise."""

    def __init__(self, n=4):
        self.n, self.keys = n, []

    def __len__(self):
        return self.n

    def __getitem__(self, key):
        self.keys.append(key)
        try:
            return torch.full((2,), float(int(key)))
        except (TypeError, ValueError):
            return repr(key)


def test_integer_indices_are_cached_under_their_int_value():
    base = Keyed()
    ds = fastcollate.Cached(base, max_bytes=1 << 20)
    first = ds[np.int64(1)]
    assert type(base.keys[0]) is np.int64  # a miss calls the dataset with the index it was given
    for k in [1, np.int32(1), np.uint8(1), torch.tensor(1), torch.tensor(1, dtype=torch.int16)]:
        assert_identical(ds[k], first)
    ds[torch.tensor(2, dtype=torch.uint8)]
    assert ds.stats()["inserts"] == 2 and ds.stats()["hits"] == 5 and len(base.keys) == 2
    # never cached: bools, floats, negative or out of range, not 0-dim, timedelta, strings
    odd = [True, np.bool_(True), torch.tensor(True), 1.0, np.float64(1.0), torch.tensor(1.0), -1, np.int64(-1),
           5, np.int64(9), torch.tensor([1]), np.timedelta64(1), "k"]
    for _ in range(2):
        for k in odd:
            got = ds[k]
            assert base.keys[-1] is k  # went to the dataset, with the key itself
            want = base[k]
            if isinstance(want, torch.Tensor):
                assert_identical(got, want)
            else:
                assert got == want
    assert ds.stats()["inserts"] == 2 and ds.stats()["hits"] == 5


@pytest.mark.parametrize("how", ["SubsetRandomSampler(ndarray)", "SubsetRandomSampler(tensor)", "Subset(ndarray)",
                                 "Subset(ndarray)+__getitems__"])
def test_samplers_and_subsets_that_give_numpy_or_tensor_indices_are_cached(how):
    from torch.utils.data import Subset, SubsetRandomSampler

    items = [torch.full((3,), float(i)) for i in range(12)]
    base = Batched(items) if how.endswith("__getitems__") else Listed(items)
    ds = fastcollate.Cached(base, max_bytes=1 << 20)
    picked = np.arange(2, 10)
    if how.startswith("SubsetRandomSampler"):
        sampler = SubsetRandomSampler(picked if "ndarray" in how else torch.from_numpy(picked))
        loader = DataLoader(ds, batch_size=4, sampler=sampler)
    else:
        loader = DataLoader(Subset(ds, picked), batch_size=4, shuffle=True)
    for _ in range(3):
        rows = torch.cat(list(loader))
        assert sorted(rows[:, 0].tolist()) == [float(i) for i in picked]
    s = ds.stats()
    assert (s["inserts"], s["hits"]) == (8, 16), s
    assert base.counts.tolist() == [0, 0] + [1] * 8 + [0, 0]


def test_a_failing_fetch_leaves_the_entry_free():
    class Flaky(Dataset):
        calls = 0

        def __len__(self):
            return 1

        def __getitem__(self, i):
            Flaky.calls += 1
            if Flaky.calls == 1:
                raise KeyError("first time")
            return "ok"

    ds = fastcollate.Cached(Flaky(), max_bytes=1 << 20)
    with pytest.raises(KeyError):
        ds[0]
    assert C.cache_state(ds.ctrl, 0) == 0
    assert [ds[0], ds[0]] == ["ok", "ok"] and ds.stats()["hits"] == 1


class Interrupting:
    """A sample whose serialization is cut short by Ctrl-C."""

    def __reduce__(self):
        raise KeyboardInterrupt


def test_ctrl_c_during_a_batched_insert_releases_every_claim():
    items = [torch.ones(2), Interrupting(), torch.ones(3), torch.ones(4)]
    base = Batched(items)
    ds = fastcollate.Cached(base, max_bytes=1 << 20)
    with pytest.raises(KeyboardInterrupt):
        ds.__getitems__([0, 1, 2, 3])
    assert [C.cache_state(ds.ctrl, i) for i in range(4)] == [C.cache_states["ready"], 0, 0, 0]
    base.items[1] = torch.ones(5)
    ds.__getitems__([0, 1, 2, 3])
    assert ds.stats()["inserts"] == 4 and base.calls[-1] == [1, 2, 3]


class DictBatches(Listed):
    """__getitems__ returns the batch itself: a dict of 2 keys (a batch of 2 has as many)."""

    def __getitems__(self, indices):
        return {"x": torch.stack([self[i] for i in indices]), "index": torch.tensor(indices)}


class TensorBatches(Listed):
    def __getitems__(self, indices):
        return torch.stack([self[i] for i in indices])


class WrongLength(Listed):
    def __getitems__(self, indices):
        return [self[i] for i in indices][:-1]


@pytest.mark.parametrize("kind", [DictBatches, TensorBatches, WrongLength])
def test_a_getitems_that_returns_a_batch_is_passed_through_never_cached(kind, caplog):
    items = [torch.full((3,), float(i)) for i in range(8)]
    ds = fastcollate.Cached(kind(items), max_bytes=1 << 20)
    with caplog.at_level("WARNING", logger="fastcollate"):
        for _ in range(2):
            for start in range(0, 8, 2):
                got = ds.__getitems__([start, start + 1])
                want = kind(items).__getitems__([start, start + 1])
                assert type(got) is type(want)
                assert_same(got, want, contiguous=True)
        ds[5], ds[5]  # a single sample is still cached
    s = ds.stats()
    assert (s["inserts"], s["hits"]) == (1, 1), s
    said = [r.getMessage() for r in caplog.records if "returns a batch" in r.getMessage()]
    assert len(said) == 1 and f"{kind.__name__}.__getitems__" in said[0] and "nothing is cached" in said[0]
    # through torch's DataLoader: what the collate_fn gets is what it would get from the dataset
    got = list(DataLoader(ds, batch_size=2, collate_fn=lambda b: b))
    want = list(DataLoader(kind(items), batch_size=2, collate_fn=lambda b: b))
    assert_same(got, want)
    with pytest.raises(TypeError, match=f"{kind.__name__}.__getitems__ returned a batch .* transform= applies to one"):
        fastcollate.Cached(kind(items), transform=lambda x: x, max_bytes=1 << 20).__getitems__([0, 1])


def test_a_batch_after_samples_were_cached_is_the_whole_batch_from_the_dataset():
    class Switches(Listed):
        batches = False

        def __getitems__(self, indices):
            samples = [self[i] for i in indices]
            return {"x": torch.stack(samples)} if self.batches else samples

    items = [torch.full((2,), float(i)) for i in range(4)]
    base = Switches(items)
    ds = fastcollate.Cached(base, max_bytes=1 << 20)
    ds.__getitems__([0, 1])
    base.batches = True
    got = ds.__getitems__([1, 2])  # 1 is a hit, 2 a miss: the batch is the dataset's, whole
    assert_same(got, {"x": torch.stack([items[1], items[2]])})
    assert C.cache_state(ds.ctrl, 2) == 0 and ds.stats()["inserts"] == 2


class TupleSamples(Listed):
    def __getitems__(self, indices):
        return tuple(self[i] for i in indices)


def test_a_tuple_of_samples_is_cached():
    items = [torch.full((2,), float(i)) for i in range(4)]
    ds = fastcollate.Cached(TupleSamples(items), max_bytes=1 << 20)
    for _ in range(2):
        got = ds.__getitems__([0, 1, 2])
        for g, i in zip(got, [0, 1, 2]):
            assert_identical(g, items[i])
    assert ds.stats()["inserts"] == 3 and ds.stats()["hits"] == 3


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_a_dead_writers_entry_is_reclaimed():
    items = [torch.arange(4) + i for i in range(3)]
    ds = fastcollate.Cached(Listed(items), max_bytes=1 << 20)
    dead = _dead_pid()
    assert C.cache_claim(ds.ctrl, 1, dead).outcome == C.cache_claims["claimed"]
    # a process forked mid-insert that dies before publishing: its claim and its reserved bytes
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        C.cache_claim(ds.ctrl, 2, os.getpid())
        C.cache_reserve(ds.ctrl, 2, os.getpid(), 100)
        os._exit(0)
    os.waitpid(pid, 0)
    assert C.cache_state(ds.ctrl, 2) == pid
    for _ in range(2):
        for i in range(3):
            assert_identical(ds[i], items[i])
    s = ds.stats()
    assert s["reclaimed"] == 2 and s["inserts"] == 3 and s["hits"] == 3
    assert s["bytes"] >= s["payload_bytes"] + 128  # the dead writer's reservation stays allocated


def test_an_entry_a_live_writer_holds_is_a_miss_never_a_wait():
    ds = fastcollate.Cached(Listed([torch.ones(2)]), max_bytes=1 << 20)
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert C.cache_claim(ds.ctrl, 0, holder.pid).outcome == C.cache_claims["claimed"]
        for _ in range(3):
            assert torch.equal(ds[0], torch.ones(2))
        s = ds.stats()
        assert (s["hits"], s["misses"], s["inserts"], s["reclaimed"]) == (0, 3, 0, 0)
        assert C.cache_state(ds.ctrl, 0) == holder.pid
    finally:
        holder.kill()
        holder.wait()
    ds[0]  # the holder is gone: reclaimed and inserted
    assert ds.stats()["reclaimed"] == 1 and ds.stats()["inserts"] == 1


def test_threads_share_one_cache():
    items = [torch.full((64,), float(i)) for i in range(64)]
    ds = fastcollate.Cached(Listed(items), max_bytes=1 << 20)
    errors = []

    def run(seed):
        rng = np.random.default_rng(seed)
        try:
            for i in rng.integers(0, 64, 400):
                assert_identical(ds[int(i)], items[int(i)])
        except AssertionError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    s = ds.stats()
    assert s["inserts"] == 64 and s["hits"] + s["misses"] == 1600


# ---- in DataLoader workers ------------------------------------------------------------------------

@pytest.mark.parametrize("context,persistent,loader", [
    ("fork", False, "torch"), ("fork", True, "fastcollate"), ("spawn", False, "fastcollate"),
    ("spawn", True, "torch"), ("forkserver", False, "torch")])
def test_every_worker_reads_what_the_others_inserted(context, persistent, loader):
    n, workers = 32, 2
    base = Tagged(n)
    ds = fastcollate.Cached(base, transform=read_by, max_bytes=1 << 20)
    make = DataLoader if loader == "torch" else fastcollate.DataLoader
    sampler = EpochBatches(n)
    dl = make(ds, batch_sampler=sampler, num_workers=workers, multiprocessing_context=context,
              persistent_workers=persistent, timeout=120)
    epochs = []
    for epoch in range(3):
        sampler.epoch = epoch
        rows = []
        for b in dl:
            assert torch.equal(b["x"], torch.arange(16, dtype=torch.float32) + b["i"][:, None])
            rows += list(zip(b["i"].tolist(), b["by"].tolist(), b["read_by"].tolist()))
        assert sorted(r[0] for r in rows) == list(range(n))
        epochs.append(rows)
    assert base.counts.tolist() == [1] * n  # the dataset once per index, whichever worker
    s = ds.stats()  # every worker's counts, read in the main process
    assert (s["misses"], s["inserts"], s["hits"]) == (n, n, 2 * n)
    fetched_by = {i: by for i, by, _ in epochs[0]}
    assert set(fetched_by.values()) == set(range(workers))
    for rows in epochs[1:]:
        for i, by, reader in rows:
            assert by == fetched_by[i]  # the cached sample, as its first fetch made it
    for w in range(workers):  # in epoch 1 (shifted) each worker read samples another one inserted
        assert any(reader == w and by != w for _, by, reader in epochs[1]), (w, epochs[1])


def test_torch_loader_in_the_main_process():
    base = Tagged(12)
    ds = fastcollate.Cached(base, max_bytes=1 << 20)
    for _ in range(2):
        assert sum(b["i"].numel() for b in DataLoader(ds, batch_size=5, shuffle=True)) == 12
    assert ds.stats()["hits"] == 12 and base.counts.tolist() == [1] * 12


def test_pickling_is_the_same_cache_here_and_a_new_one_elsewhere():
    ds = fastcollate.Cached(Listed([1, 2, 3]), max_bytes=1 << 20)
    ds[0]
    blob = pickle.dumps(ds)
    assert pickle.loads(blob) is ds
    code = ("import pickle, sys; sys.path.insert(0, 'tests'); ds = pickle.loads(sys.stdin.buffer.read()); "
            "print(ds[0], ds[0], ds.stats()['hits'], ds.stats()['inserts'], len(ds))")
    out = subprocess.run([sys.executable, "-c", code], input=blob, capture_output=True, cwd=ROOT, timeout=120,
                         env=dict(os.environ, PYTHONPATH=ROOT))
    assert out.stdout.decode().split() == ["1", "1", "1", "1", "3"], out.stderr.decode()[-2000:]
    assert ds.stats()["inserts"] == 1  # the other process's cache was its own


# ---- limits, errors, the kill switch --------------------------------------------------------------

def test_default_max_bytes_is_half_the_available_memory():
    avail = cache_mod.memory_available()
    assert 0 < avail
    assert cache_mod.default_max_bytes() == int(avail * cache_mod.DEFAULT_FRACTION) // 64 * 64
    ds = fastcollate.Cached([1, 2])
    assert 0 < ds.max_bytes <= avail and ds.stats()["capacity"] == ds.max_bytes


def _fake_cgroup(tmp_path, monkeypatch, files: dict[str, str], proc_cgroup: str = "0::/\n") -> None:
    from fastcollate.cache import room as cache_memory

    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    (tmp_path / "proc_self_cgroup").write_text(proc_cgroup)
    monkeypatch.setattr(cache_memory, "CGROUP_ROOT", str(tmp_path))
    monkeypatch.setattr(cache_memory, "PROC_SELF_CGROUP", str(tmp_path / "proc_self_cgroup"))


def _meminfo_available() -> int:
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))


def test_cgroup_limit_bounds_the_available_memory(tmp_path, monkeypatch):
    _fake_cgroup(tmp_path, monkeypatch, {"memory.max": "1048576\n", "memory.current": "524288\n"})
    assert cache_mod.memory_available() == 524288


GiB = 1 << 30


@pytest.mark.parametrize("version", ["v2", "v2 own group", "v1 total", "v1 unprefixed"])
def test_a_cgroups_page_cache_is_not_counted_as_used(tmp_path, monkeypatch, version):
    # a 16 GiB pod that read 14 GiB of files: 14.5 GiB "used", 14 GiB of it reclaimable page cache
    limit, usage, active, inactive = 16 * GiB, 14 * GiB + GiB // 2, 6 * GiB, 8 * GiB
    stat = f"anon {GiB // 2}\nfile {14 * GiB}\nactive_file {active}\ninactive_file {inactive}\nshmem 0\n"
    if version == "v2":
        files = {"memory.max": f"{limit}\n", "memory.current": f"{usage}\n", "memory.stat": stat}
        proc = "0::/\n"
    elif version == "v2 own group":
        files = {"kubepods/pod1/memory.max": f"{limit}\n", "kubepods/pod1/memory.current": f"{usage}\n",
                 "kubepods/pod1/memory.stat": stat}
        proc = "0::/kubepods/pod1\n"
    elif version == "v1 total":  # the group's own counts would say less: the hierarchical totals are used
        stat = f"active_file 0\ninactive_file 0\ntotal_active_file {active}\ntotal_inactive_file {inactive}\n"
        files = {"memory/memory.limit_in_bytes": f"{limit}\n", "memory/memory.usage_in_bytes": f"{usage}\n",
                 "memory/memory.stat": stat}
        proc = "4:memory:/\n"
    else:
        files = {"memory/pod/memory.limit_in_bytes": f"{limit}\n", "memory/pod/memory.usage_in_bytes": f"{usage}\n",
                 "memory/pod/memory.stat": f"cache {14 * GiB}\nactive_file {active}\ninactive_file {inactive}\n"}
        proc = "4:memory:/pod\n"
    _fake_cgroup(tmp_path, monkeypatch, files, proc)
    from fastcollate.cache import room as cache_memory

    assert cache_memory._cgroup_room() == limit - GiB // 2  # 15.5 GiB left, not 1.5
    assert cache_mod.memory_available() == min(_meminfo_available(), limit - GiB // 2)


def test_bad_arguments_are_refused_clearly():
    class Stream(IterableDataset):
        def __iter__(self):
            return iter([])

    with pytest.raises(TypeError, match="IterableDataset"):
        fastcollate.Cached(Stream())
    with pytest.raises(TypeError, match="no len"):
        fastcollate.Cached(iter([1]))
    with pytest.raises(ValueError, match="max_bytes"):
        fastcollate.Cached([1], max_bytes=-1)
    with pytest.raises(TypeError, match="callable"):
        fastcollate.Cached([1], transform=3)


def test_the_kill_switch_passes_through(monkeypatch):
    base = Listed([torch.ones(2)])
    ds = fastcollate.Cached(base, max_bytes=1 << 20)
    monkeypatch.setenv("FASTCOLLATE_DISABLE", "1")
    for _ in range(2):
        assert ds[0] is base.items[0]
    assert ds.stats()["inserts"] == 0 and base.counts.tolist() == [2]


def test_estimate_gives_what_a_cached_epoch_costs():
    samples = [{"x": torch.zeros(1000), "y": i} for i in range(6)] + [{"f": lambda: 0}]
    e = fastcollate.Cached.estimate(samples)
    assert (e["samples"], e["cacheable"]) == (7, 6)
    assert 4000 < e["bytes_per_sample"] < 4000 + 512
    assert e["read_s_per_sample"] > 0 and e["write_s_per_sample"] > 0
    ds = fastcollate.Cached(Listed(samples[:6]), max_bytes=1 << 20)
    for i in range(6):
        ds[i]
    assert ds.stats()["bytes"] == 6 * e["bytes_per_sample"]


# ---- a container's 8 MB /dev/shm ------------------------------------------------------------------

def _can_unshare() -> str | None:
    import shutil

    if shutil.which("unshare") is None:
        return "no unshare(1)"
    r = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /dev/shm"], capture_output=True,
                       text=True)
    return None if r.returncode == 0 else f"unshare -m / mount not permitted here: {r.stderr.strip()[:120]}"


@pytest.mark.skipif(_can_unshare() is not None, reason=str(_can_unshare()))
@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_128_mb_cached_with_an_8_mb_dev_shm(context):
    probe = os.path.join(ROOT, "tests", "shm_probe.py")
    script = f"mount -t tmpfs -o size=8m tmpfs /dev/shm && exec {sys.executable} {probe} cache-{context}"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=300, env=env,
                       cwd=ROOT)
    assert r.returncode == 0 and r.stdout.startswith("OK"), r.stdout + r.stderr[-2000:]
    hits, misses, nbytes = map(int, r.stdout.split()[1:])
    assert (hits, misses) == (128, 128) and nbytes > 128 << 20


@pytest.mark.parametrize("strategy", ["file_system", "file_descriptor"])
@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_any_sharing_strategy_shares_the_segments_themselves(strategy, context):
    # torch's file_system strategy moved a storage it was asked to send into a /dev/shm file: a
    # 64 MB copy ("No space left on device" under a small /dev/shm), and the main process's
    # mapping freed under its numpy view (a segfault at its next read)
    probe = os.path.join(ROOT, "tests", "shm_probe.py")
    run = f"{sys.executable} {probe} cache-strategy-{strategy}-{context}"
    cmd = ["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o size=8m tmpfs /dev/shm && exec {run}"] \
        if _can_unshare() is None else run.split()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert r.returncode == 0 and r.stdout.startswith("OK"), (r.returncode, r.stdout + r.stderr[-2000:])
    hits, misses, shm = map(int, r.stdout.split()[1:])
    assert (hits, misses) == (1 + 2 + 32 + 32, 2 + 30) and shm < 1 << 20, r.stdout


# ---- the engine's contract ------------------------------------------------------------------------

def test_control_block_words_and_entries_are_named():
    words = C.cache_words
    ds = fastcollate.Cached(Listed([torch.ones(4), 7]), max_bytes=1 << 16)
    assert ds.ctrl.numel() == C.cache_ctrl_words(2) == words["header"] + 2 * words["entry_words"]
    assert int(ds.ctrl[words["entries"]]) == 2 and int(ds.ctrl[words["capacity"]]) == 1 << 16
    ds[1]
    entry = ds.ctrl[words["header"] + words["entry_words"]:words["header"] + 2 * words["entry_words"]].tolist()
    span = C.cache_find(ds.ctrl, 1)
    assert entry[words["entry_state"]] == C.cache_states["ready"] == C.cache_state(ds.ctrl, 1)
    assert (entry[words["entry_offset"]], entry[words["entry_length"]]) == (span.offset, span.length)
    assert span.offset % C.cache_align == 0 and int(ds.ctrl[words["top"]]) == -(-span.length // 64) * 64
    assert C.cache_find(ds.ctrl, 0).offset == -1
    assert C.cache_claim(ds.ctrl, 1, os.getpid()).outcome == C.cache_claims["ready"]


def test_the_engine_refuses_bad_calls_saying_what_it_got():
    ds = fastcollate.Cached(Listed([1]), max_bytes=1 << 10)
    with pytest.raises(RuntimeError, match="index 5 is outside the cache's 1 entries"):
        C.cache_find(ds.ctrl, 5)
    with pytest.raises(RuntimeError, match="positive pid, got 0"):
        C.cache_claim(ds.ctrl, 0, 0)
    with pytest.raises(RuntimeError, match="not held by pid 12345"):
        C.cache_reserve(ds.ctrl, 0, 12345, 10)
    with pytest.raises(RuntimeError, match="contiguous int64 CPU tensor"):
        C.cache_find(torch.zeros(20, dtype=torch.int32), 0)
    with pytest.raises(RuntimeError, match="no counter 11"):
        C.cache_add(ds.ctrl, 11, 1)
    pid = os.getpid()
    assert C.cache_claim(ds.ctrl, 0, pid).outcome == C.cache_claims["claimed"]
    with pytest.raises(RuntimeError, match="was not reserved"):
        C.cache_publish(ds.ctrl, 0, pid, 0, 10)
    assert C.cache_reserve(ds.ctrl, 0, pid, 2000) == -1  # larger than the segment: refused alone, never again
    assert C.cache_state(ds.ctrl, 0) == C.cache_states["refused"] and not ds.stats()["full"]
    assert C.cache_claim(ds.ctrl, 0, pid).outcome == C.cache_claims["skip"]
    assert ds.stats()["refused_full"] == 1


def test_the_docstrings_examples_run():
    import doctest

    assert doctest.testmod(cache_mod).failed == 0


def test_without_the_compiled_engine_it_passes_through():
    code = """
import sys, warnings
class Block:
    def find_spec(self, name, path, target=None):
        if name == "fastcollate._C":
            raise ImportError("blocked for the test")
sys.meta_path.insert(0, Block())
warnings.simplefilter("ignore")
import torch, fastcollate
base = [torch.ones(2) * i for i in range(3)]
ds = fastcollate.Cached(base, transform=lambda x: x + 1)
assert [ds[i].tolist() for i in (1, 1)] == [[2.0, 2.0], [2.0, 2.0]]
s = ds.stats()
assert s["enabled"] is False and s["hits"] == 0, s
print("OK")
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                       env=dict(os.environ, PYTHONPATH=ROOT))
    assert r.stdout.strip() == "OK", r.stderr[-2000:]
